#!/usr/bin/env bash
# gpu_bundle.sh - the CUDA build, packed to be carried to a GPU machine that has the CUDA
# toolkit and driver but not necessarily OpenBLAS, json-c, liburing, GLPK or PCRE2
# (issue 15; tests/gpu/run.sh runs it there).
#
#   tools/gpu_bundle.sh [BUILD_DIR]        (default build-gpu, relative to the repository)
#
# Configures and builds BUILD_DIR with -DSTRATA_CUDA=ON (Release), then makes
# BUILD_DIR/bundle/:
#   strata, test_cuda_* (the CUDA tests that run natively: not the emulated test_cuda_emu*),
#   cuda_probe (tests/gpu/run.sh's shape probe)
#   lib/      every shared library they load that is neither glibc's nor the CUDA toolkit's
#             (found with ldd, the real files copied under their sonames); those over 1 MiB
#             compressed as NAME.xz (OpenBLAS, with a kernel set for every CPU, is 37 MB
#             and 4.3 MB as xz), which tests/gpu/run.sh unpacks into its work directory
#   VERSION   the commit, the toolkit, the libraries and their sizes
# With patchelf (tools/setup.sh installs it) the binaries get RUNPATH $ORIGIN/lib and the
# libraries $ORIGIN, so they find each other wherever the bundle is; tests/gpu/run.sh also
# puts lib/ on LD_LIBRARY_PATH, so a bundle made without patchelf runs there too. cudart,
# cuBLAS and cuBLASLt stay the machine's (the same CUDA major version: nvcc is the same).
# Prints the bundle's size; it must stay well under the 64 MiB that travels with a GPU
# run (the working tree counts too), so more than 32 MiB fails.
# Environment: JOBS (build jobs, default 2).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build-gpu}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BUNDLE="$BUILD/bundle"
LIMIT_BYTES=$((32 * 1024 * 1024))

command -v xz >/dev/null || { echo "gpu_bundle: xz not found (apt-get install xz-utils)" >&2; exit 1; }
command -v nvcc >/dev/null || { echo "gpu_bundle: nvcc not found: install the CUDA toolkit (or put its bin/ on PATH)" >&2; exit 1; }
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON >"$BUILD/gpu_bundle.configure.log" 2>&1 ||
  { cat "$BUILD/gpu_bundle.configure.log" >&2; echo "gpu_bundle: configuring $BUILD failed (log above)" >&2; exit 1; }
grep -q "the CUDA backend is built" "$BUILD/gpu_bundle.configure.log" ||
  { echo "gpu_bundle: $BUILD was configured without the CUDA backend (see $BUILD/gpu_bundle.configure.log)" >&2; exit 1; }

# the CUDA tests that run natively: tests/test_cuda_*.cpp but the emulated ones
tests=()
for src in "$ROOT"/tests/test_cuda_*.cpp; do
  name=$(basename "$src" .cpp)
  case "$name" in test_cuda_emu*) continue ;; esac
  tests+=("$name")
done
cmake --build "$BUILD" -j"${JOBS:-2}" --target strata_cli cuda_probe "${tests[@]}"

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/lib"
BUNDLE=$(cd "$BUNDLE" && pwd -P)
bins=("$BUILD/strata" "$BUILD/tests/cuda_probe") # cuda_probe: tests/gpu/run.sh's shape probe (stage 3)
for t in "${tests[@]}"; do bins+=("$BUILD/tests/$t"); done
cp "${bins[@]}" "$BUNDLE/"

# glibc's own libraries and the CUDA toolkit's (or driver's) stay the machine's
cuda_root=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd -P)
keep_machine() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
      libresolv.so.* | libutil.so.* | libmvec.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnvidia-*.so.* | libnvrtc*.so.* | \
      libnccl.so.*) return 0 ;;
  esac
  case "$2" in "$cuda_root"/* | /usr/local/cuda*/*) return 0 ;; esac
  return 1
}
missing=0
for b in "${bins[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then echo "gpu_bundle: $(basename "$b") needs $name, which is not found here" >&2; missing=1; continue; fi
    real=$(readlink -f "$path")
    keep_machine "$name" "$real" && continue
    [ -e "$BUNDLE/lib/$name" ] || cp "$real" "$BUNDLE/lib/$name"
  done < <(ldd "$b")
done
[ "$missing" -eq 0 ] || exit 1

if command -v patchelf >/dev/null; then
  for f in "$BUNDLE"/*; do [ -f "$f" ] && patchelf --set-rpath '$ORIGIN/lib' "$f"; done
  for f in "$BUNDLE"/lib/*; do chmod u+w "$f"; patchelf --set-rpath '$ORIGIN' "$f"; done
  rpath="RUNPATH \$ORIGIN/lib (patchelf)"
else
  rpath="no RUNPATH (patchelf not installed: tools/setup.sh): tests/gpu/run.sh sets LD_LIBRARY_PATH"
fi

# every library the bundle does not carry must be the machine's: glibc or CUDA. Looked up
# as tests/gpu/run.sh runs them, lib/ first on LD_LIBRARY_PATH: the machine's cuBLAS needs
# libgcc_s, which RUNPATH alone would take from the machine (as it may)
for f in "$BUNDLE"/strata "$BUNDLE"/cuda_probe "$BUNDLE"/test_cuda_* "$BUNDLE"/lib/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    keep_machine "$name" "$(readlink -f "$path" 2>/dev/null || echo "$path")" && continue
    case "$(readlink -f "$path" 2>/dev/null)" in "$BUNDLE"/lib/*) ;; *)
      echo "gpu_bundle: $(basename "$f") loads $name from $path, outside the bundle" >&2; missing=1 ;;
    esac
  done < <(env LD_LIBRARY_PATH="$BUNDLE/lib" ldd "$f")
done
[ "$missing" -eq 0 ] || { echo "gpu_bundle: the bundle is incomplete (above)" >&2; exit 1; }

raw=$(du -sb "$BUNDLE" | cut -f1)
# the newest glibc symbol version any of them asks for: the machine's glibc must have it
glibc_need=$(cd "$BUNDLE" && objdump -T strata cuda_probe test_cuda_* lib/* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | sed 's/GLIBC_//')
for f in "$BUNDLE"/lib/*; do
  if [ "$(stat -c %s "$f")" -gt $((1024 * 1024)) ]; then xz -6 -T"${JOBS:-2}" "$f"; fi
done
total=$(du -sb "$BUNDLE" | cut -f1)
{
  echo "strata GPU bundle"
  echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)'), made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "$(nvcc --version | grep -m1 release), code for $(grep -o 'sm_[0-9a-z]*' "$BUILD/CMakeFiles/strata.dir/flags.make" 2>/dev/null | sort -u | tr '\n' ' ')"
  echo "$rpath; from the machine: glibc (>= $glibc_need), the CUDA driver, cudart, cuBLAS, cuBLASLt; cuDNN 9 where it is there (dlopen; without it attention runs the own kernels)"
  echo "files (bytes):"
  (cd "$BUNDLE" && for f in * lib/*; do [ -f "$f" ] && [ "$f" != VERSION ] && printf '  %10d  %s\n' "$(stat -c %s "$f")" "$f"; done)
  echo "total $total bytes ($raw before xz)"
} >"$BUNDLE/VERSION"
sort -k1,1nr <(sed -n 's/^  *\([0-9]\+\)  \(.*\)/\1 \2/p' "$BUNDLE/VERSION") | head -5 | sed 's/^/gpu_bundle: largest: /'
echo "gpu_bundle: $BUNDLE: $total bytes ($(awk -v b="$total" 'BEGIN{printf "%.1f", b/1048576}') MiB) in $(find "$BUNDLE" -type f | wc -l) files"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "gpu_bundle: the bundle is over $LIMIT_BYTES bytes: it and the working tree must travel in 64 MiB" >&2
  exit 1
fi

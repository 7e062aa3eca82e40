#!/usr/bin/env bash
# Install the Debian 12 packages strata builds with, if any are missing (idempotent).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas-openmp-dev libjson-c-dev libpcre2-dev liburing-dev python3 jq)
# tools/fuzz.sh: clang, libFuzzer and the sanitizer runtimes (libclang-rt), clang's OpenMP
pkgs+=(clang libclang-rt-14-dev libomp-dev)
# the planner (src/plan): its mixed-integer program is solved with GLPK
pkgs+=(libglpk-dev)
# the loss forecast (src/run/forecast.c): GSL's nonlinear least squares and t quantiles
pkgs+=(libgsl-dev)
# data parallel (src/dist): OpenMPI and its launcher; the cross-machine test makes network
# namespaces with ip (iproute2)
pkgs+=(libopenmpi-dev openmpi-bin iproute2)
# matmul bf16 on the CPU backend: oneDNN's matmul primitive (AMX, AVX512-BF16) behind
# src/backend/cpu/matmul_bf16.c; without it the build refuses matmul bf16 on the CPU
pkgs+=(libdnnl-dev)
# tools/gpu_bundle.sh: the carried GPU bundle's binaries find their libraries by RUNPATH;
# its large libraries travel as xz
pkgs+=(patchelf xz-utils)
# tests/test_tb_events.sh: a venv (python3 -m venv, which needs python3-venv on Debian) into
# which pip installs TensorBoard's reader from PyPI; without it the test can only skip
pkgs+=(python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  # one line, so that a new user sees it ran and what it looked at
  echo "strata setup: all ${#pkgs[@]} Debian packages strata builds and tests with are installed (${pkgs[*]}); nothing to do"
  exit 0
fi
# the line to run as root when this user cannot install (no root, no sudo, or it failed)
line="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "strata setup: missing ${missing[*]}; this user ($(id -un 2>/dev/null || id -u)) is not root and has no sudo." >&2
    echo "strata setup: run this as root, then tools/setup.sh again:" >&2
    echo "  $line" >&2
    exit 1
  fi
  SUDO=sudo
fi
echo "strata setup: installing ${missing[*]}" >&2
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
  echo "strata setup: the install failed; run this as root, then tools/setup.sh again:" >&2
  echo "  $line" >&2
  exit 1
fi
echo "strata setup: installed ${missing[*]}; all ${#pkgs[@]} packages are now present"

#!/usr/bin/env bash
# bench_optim_states.sh - 8-bit against fp32 optimizer states, alternated, medians (issue 31).
#
# usage: [STATES="f32 8bit 8bit-fp"] tools/bench_optim_states.sh [rounds] [strata binary ...]
# Each round runs, for every binary in turn, `strata bench optim --params 100M --states
# S --json` for each S of STATES (default f32 8bit; 8bit-fp is the float map, binaries
# from issue 31's q8map on) with the best kernels (--isa auto) and again with --isa avx2 (the AVX2
# kernels, as on an AVX2-only machine; STRATA_OPTIM_ISA=avx2 does the same for any strata
# command, but binaries before it only know --isa); prints the load before and after, every JSON line,
# then per binary and kernel set the median params/s of each state format and its ratio to f32.
set -euo pipefail
rounds=${1:-5}
shift || true
bins=("$@")
read -r -a states <<<"${STATES:-f32 8bit}"
[ ${#bins[@]} -gt 0 ] || bins=(build/strata)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "load before: $(uptime)"
for ((r = 1; r <= rounds; r++)); do
    for b in "${bins[@]}"; do
        for isa in auto avx2; do
            for s in "${states[@]}"; do
                line=$("$b" bench optim --params 100M --states "$s" --isa "$isa" --json)
                echo "$b $isa $line" | tee -a "$out"
            done
        done
    done
done
echo "load after: $(uptime)"
python3 - "$out" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    b, isa, js = line.split(" ", 2)
    j = json.loads(js)
    runs.setdefault((b, isa, j["isa"]), {}).setdefault(j["states"], []).append(j["params_per_s"])
for (b, isa, kern), st in runs.items():
    f = statistics.median(st["f32"])
    line = f"{b} --isa {isa} ({kern} kernels, {len(st['f32'])} rounds): f32 {f:.3e} params/s"
    for s, v in st.items():
        if s != "f32":
            q = statistics.median(v)
            line += f", {s} {q:.3e} params/s ({s}/f32 {q / f:.3f})"
    print(line)
EOF

#!/usr/bin/env bash
# test_prof_nvml.sh - GPU telemetry through NVML loaded at run time, without a GPU: a fake
# libnvidia-ml (compiled here, the symbols strata looks up, fixed readings) stands in for
# the driver. The trace must carry its readings on the GPU process's counter tracks, and
# each step's summary the frequency lost (SM clock 1500 of a maximum 2000: 0.25) and the
# clock-event reasons (0x4, software power cap). Without NVML the run says so once.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-nvml-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
command -v cc >/dev/null || { echo "no C compiler: skipped"; exit 77; }
command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }

cat > "$T/fake_nvml.c" <<'C'
#include <stdio.h>
typedef struct dev *dev_t_;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { (void)r; return "fake"; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, dev_t_ *d) { *d = (dev_t_)(unsigned long)(i + 1); return 0; }
int nvmlDeviceGetName(dev_t_ d, char *b, unsigned n) { (void)d; snprintf(b, n, "Fake GPU"); return 0; }
int nvmlDeviceGetClockInfo(dev_t_ d, int t, unsigned *v) { (void)d; *v = t == 1 ? 1500 : 2600; return 0; }
int nvmlDeviceGetMaxClockInfo(dev_t_ d, int t, unsigned *v) { (void)d; *v = t == 1 ? 2000 : 3000; return 0; }
int nvmlDeviceGetPowerUsage(dev_t_ d, unsigned *mw) { (void)d; *mw = 350000; return 0; }
int nvmlDeviceGetTemperature(dev_t_ d, int s, unsigned *t) { (void)d; (void)s; *t = 61; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(dev_t_ d, unsigned long long *r) { (void)d; *r = 0x4; return 0; }
C
cc -shared -fPIC -o "$T/libfake-nvml.so" "$T/fake_nvml.c"
check '[ -f "$T/libfake-nvml.so" ]' "fake NVML builds"

small="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 8 --seq 64 --quiet 1"
STRATA_NVML_LIB="$T/libfake-nvml.so" "$S" train $small --steps 6 --trace 1 --run_dir "$T/gpu" >"$T/gpu.txt" 2>&1
check '[ $? -eq 0 ]' "a traced run with the fake GPU succeeds"
check '! grep -q "GPU telemetry: none" "$T/gpu.txt"' "no complaint when NVML is there"
tr="$T/gpu/trace.json"
check 'jq -e . "$tr" >/dev/null' "trace is valid JSON"
check '[ "$(jq "[.traceEvents[] | select(.ph==\"C\" and .pid==2 and .name==\"gpu0 SM clock (MHz)\" and .args.value==1500)] | length" "$tr")" -ge 1 ]' \
  "SM clock samples on the GPU process"
for track in "gpu0 memory clock (MHz)" "gpu0 power (W)" "gpu0 temperature (C)" "gpu0 clock-event reasons (bitmask)"; do
  check '[ "$(jq --arg n "$track" "[.traceEvents[] | select(.ph==\"C\" and .pid==2 and .name==\$n)] | length" "$tr")" -ge 1 ]' \
    "counter track '$track'"
done
check '[ "$(jq "[.traceEvents[] | select(.name==\"gpu0 power (W)\")][0].args.value" "$tr")" = 350 ]' "power in watts (350000 mW)"
check 'jq -e "[.traceEvents[] | select(.ph==\"M\" and .pid==2 and .name==\"process_name\")] | length == 1" "$tr" >/dev/null' \
  "the GPU process is named"
check 'jq -e "[.traceEvents[] | select(.ph==\"M\" and .name==\"thread_name\" and .args.name==\"nvml sampler\")] | length == 1" "$tr" >/dev/null' \
  "the sampler thread is named"
# the GPU samples are on the spans' clock: inside the trace's time span of steps
check 'jq -e "([.traceEvents[] | select(.pid==2 and .ph==\"C\") | .ts] | min) >= 0" "$tr" >/dev/null' "GPU samples on the trace clock"
n_lost=$(jq -s '[.[] | select(.gpu_freq_lost != null)] | length' "$T/gpu/metrics.jsonl")
check '[ "$n_lost" -ge 1 ]' "steps long enough to be sampled report gpu_freq_lost ($n_lost of 6)"
check 'jq -s -e "[.[] | select(.gpu_freq_lost != null) | select(.gpu_freq_lost != 0.25 or .gpu_clock_reasons != 4)] | length == 0" "$T/gpu/metrics.jsonl" >/dev/null' \
  "frequency lost 0.25 and reasons 0x4 in every sampled step"

# no NVML at all: the run works and says so once
STRATA_NVML_LIB="$T/none.so" "$S" train $small --steps 2 --run_dir "$T/nogpu" >"$T/nogpu.txt" 2>&1
check '[ $? -eq 0 ]' "a run without NVML succeeds"
check '[ "$(grep -c "GPU telemetry" "$T/nogpu.txt")" -eq 1 ] && grep -qx "GPU telemetry: none, no NVIDIA driver" "$T/nogpu.txt"' \
  "without NVML it says so once, in one plain line"
check 'jq -s -e "[.[] | select(.gpu_freq_lost != null)] | length == 0" "$T/nogpu/metrics.jsonl" >/dev/null' "no GPU fields without a GPU"

echo "prof_nvml: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]

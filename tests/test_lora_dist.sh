#!/usr/bin/env bash
# test_lora_dist.sh - method lora with the disk state and under ranks: the adapters' vector is
# the run's parameter vector, so the store and the ranks hold it as any run's. Against the
# same LoRA run in memory in one process (tiny GPT-2 over a saved base):
#  - --state_paths: the same losses and a byte-identical saved adapter; a run stopped at step
#    4 and resumed from its store continues bit for bit;
#  - 2 ranks (mpirun): the same losses and adapter as one process with grad_accum 2, with ZeRO
#    0, 1 and 2, and with ZeRO 1 over the disk state;
#  - 2 ranks under layer streaming (device_budget, each rank streaming its own base): the same
#    losses and adapter as one process streamed with grad_accum 2, with ZeRO 0 and 2, and with
#    ZeRO 1 over the disk state stopped at step 4 and resumed from the ranks' stores; 2 micro-batches
#    a rank: ZeRO 2 as one process streamed at grad_accum 4, ZeRO 1 as the 2-rank run in memory
#    (each rank sums its own micro-batches first, so not one process's order);
#  - strata plan's disk tier holds the adapters' state only: two regions of 12 bytes (fp32 master,
#    m, v) per trained parameter.
# The 2-rank part skips where mpirun is missing or strata was built without MPI.
set -u
. "$(dirname "$0")/lib_corpus.sh"
corpus_begin loradist
tiny="--vocab_size 256 --batch 2 --seq 16 --sample_every 0 --eval_every 0 --quiet 1"
lora="--method lora --lora_rank 4 --lora_alpha 8 --lora_targets c_attn,c_proj,c_fc --lr 1e-2 --warmup_steps 2 --steps 8"
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if 'loss' in l))" "$1/metrics.jsonl" 2>/dev/null; }
same_adapter() { cmp -s "$1/adapter_model.safetensors" "$2/adapter_model.safetensors"; }

"$S" train --model gpt2-tiny $tiny --steps 3 --run_dir "$T/base" --save_hf "$T/base_hf" >"$T/base.out" 2>&1
check '[ -f "$T/base_hf/model.safetensors" ]' "the base model: $(tail -2 "$T/base.out")"
B="--init_from $T/base_hf $tiny $lora"
"$S" train $B --run_dir "$T/mem" --save_adapter "$T/ad_mem" >"$T/mem.out" 2>&1
check '[ $? -eq 0 ] && [ -n "$(losses "$T/mem")" ]' "lora in memory: $(tail -2 "$T/mem.out")"

# the disk state
mkdir -p "$T/st" "$T/st2"
"$S" train $B --state_paths "$T/st" --run_dir "$T/disk" --save_adapter "$T/ad_disk" >"$T/disk.out" 2>&1
check '[ $? -eq 0 ]' "lora with state_paths: $(tail -2 "$T/disk.out")"
check '[ "$(losses "$T/disk")" = "$(losses "$T/mem")" ] && same_adapter "$T/ad_disk" "$T/ad_mem"' \
  "the disk state: losses $(losses "$T/disk") against $(losses "$T/mem"), or the adapters differ"
"$S" train $B --stop_at 4 --state_paths "$T/st2" --run_dir "$T/part" >"$T/part.out" 2>&1
"$S" train $B --state_paths "$T/st2" --resume "$T/part" --run_dir "$T/part" --save_adapter "$T/ad_part" >"$T/res.out" 2>&1
check '[ $? -eq 0 ] && grep -q "resumed from the state store .* at step 4" "$T/res.out"' "the resume from the store: $(tail -2 "$T/res.out")"
check '[ "$(losses "$T/part")" = "$(losses "$T/mem")" ] && same_adapter "$T/ad_part" "$T/ad_mem"' \
  "stopped at 4 and resumed from the store: $(losses "$T/part") against $(losses "$T/mem")"
"$S" plan $B --state_paths "$T/st" >"$T/plan.out" 2>&1
"$S" plan --model gpt2-tiny $tiny --steps 8 --state_paths "$T/st" >"$T/plan_full.out" 2>&1
pl=$(awk '$1 == "disk" && $2 ~ /^[0-9]+$/ {print $2}' "$T/plan.out")
pf=$(awk '$1 == "disk" && $2 ~ /^[0-9]+$/ {print $2}' "$T/plan_full.out")
nt=$(sed -n 's/^trained: \([0-9]*\).*/\1/p' "$T/plan.out")
np=$(sed -n 's/^parameters: \([0-9]*\).*/\1/p' "$T/plan_full.out")
check '[ -n "$nt" ] && [ -n "$np" ] && [ "$pl" = "$((24 * nt))" ] && [ "$pf" = "$((24 * np))" ] && [ "$pl" -lt "$pf" ]' \
  "strata plan's disk tier: lora ${pl:-none} bytes for ${nt:-?} trained, the full model's ${pf:-none} for ${np:-?} (two regions of 12 bytes each)"

# ranks
corpus_mpi
$MPI -np 2 "$S" train $B --run_dir "$T/two" --save_adapter "$T/ad_two" >"$T/two.out" 2>&1
if grep -q "built without MPI" "$T/two.out"; then echo "SKIP: this strata was built without MPI (the disk part passed)"; rm -rf "$T"; exit 77; fi
"$S" train $B --grad_accum 2 --run_dir "$T/ga" --save_adapter "$T/ad_ga" >"$T/ga.out" 2>&1
check '[ -n "$(losses "$T/ga")" ]' "one process, grad_accum 2: $(tail -2 "$T/ga.out")"
check '[ "$(losses "$T/two")" = "$(losses "$T/ga")" ] && same_adapter "$T/ad_two" "$T/ad_ga"' \
  "2 ranks: $(losses "$T/two") against one process's $(losses "$T/ga"): $(tail -2 "$T/two.out")"
for z in 1 2; do
  $MPI -np 2 "$S" train $B --zero $z --run_dir "$T/z$z" --save_adapter "$T/ad_z$z" >"$T/z$z.out" 2>&1
  check '[ "$(losses "$T/z$z")" = "$(losses "$T/ga")" ] && same_adapter "$T/ad_z$z" "$T/ad_ga"' \
    "2 ranks, zero $z: $(losses "$T/z$z") against $(losses "$T/ga"): $(tail -2 "$T/z$z.out")"
done
mkdir -p "$T/st3"
$MPI -np 2 "$S" train $B --zero 1 --state_paths "$T/st3" --run_dir "$T/zd" --save_adapter "$T/ad_zd" >"$T/zd.out" 2>&1
check '[ "$(losses "$T/zd")" = "$(losses "$T/ga")" ] && same_adapter "$T/ad_zd" "$T/ad_ga"' \
  "2 ranks, zero 1, the disk state: $(losses "$T/zd") against $(losses "$T/ga"): $(tail -2 "$T/zd.out")"
# layer streaming under ranks: each rank streams its own copy of the base (every block recomputed,
# prefetch depth 1 of 2 blocks), the hook's gradient of the adapters reduced as in memory; the same
# losses and adapter as one process streamed at grad_accum 2 (and so as the runs in memory)
D="--device_budget 400000 --act recompute"
"$S" train $B $D --grad_accum 2 --run_dir "$T/s_ga" --save_adapter "$T/ad_s_ga" >"$T/s_ga.out" 2>&1
check '[ $? -eq 0 ] && grep -q "prefetch depth 1" "$T/s_ga.out" && [ "$(losses "$T/s_ga")" = "$(losses "$T/ga")" ] && same_adapter "$T/ad_s_ga" "$T/ad_ga"' \
  "one process streamed, grad_accum 2: $(losses "$T/s_ga") against in memory $(losses "$T/ga"): $(tail -2 "$T/s_ga.out")"
for z in 0 2; do
  $MPI -np 2 "$S" train $B $D --zero $z --run_dir "$T/s_z$z" --save_adapter "$T/ad_s_z$z" >"$T/s_z$z.out" 2>&1
  check '[ $? -eq 0 ] && grep -q "layer streaming: device budget" "$T/s_z$z.out" && [ "$(losses "$T/s_z$z")" = "$(losses "$T/s_ga")" ] && same_adapter "$T/ad_s_z$z" "$T/ad_s_ga"' \
    "2 ranks streamed, zero $z: $(losses "$T/s_z$z") against one process streamed $(losses "$T/s_ga"): $(tail -2 "$T/s_z$z.out")"
done
# 2 micro-batches a rank: ZeRO 2 (each reduced onto the shard's running sum in the global order)
# equals one process streamed at grad_accum 4; ZeRO 1 sums each rank's own first, an order one
# process does not have, and equals the 2-rank run in memory
"$S" train $B $D --grad_accum 4 --run_dir "$T/s_ga4" --save_adapter "$T/ad_s_ga4" >"$T/s_ga4.out" 2>&1
$MPI -np 2 "$S" train $B $D --grad_accum 2 --zero 2 --run_dir "$T/s_a2z2" --save_adapter "$T/ad_s_a2z2" >"$T/s_a2z2.out" 2>&1
check '[ -n "$(losses "$T/s_ga4")" ] && [ "$(losses "$T/s_a2z2")" = "$(losses "$T/s_ga4")" ] && same_adapter "$T/ad_s_a2z2" "$T/ad_s_ga4"' \
  "2 ranks streamed, grad_accum 2, zero 2: $(losses "$T/s_a2z2") against one process streamed at grad_accum 4 $(losses "$T/s_ga4"): $(tail -2 "$T/s_a2z2.out")"
$MPI -np 2 "$S" train $B --grad_accum 2 --zero 1 --run_dir "$T/m_a2z1" --save_adapter "$T/ad_m_a2z1" >"$T/m_a2z1.out" 2>&1
$MPI -np 2 "$S" train $B $D --grad_accum 2 --zero 1 --run_dir "$T/s_a2z1" --save_adapter "$T/ad_s_a2z1" >"$T/s_a2z1.out" 2>&1
check '[ -n "$(losses "$T/m_a2z1")" ] && [ "$(losses "$T/s_a2z1")" = "$(losses "$T/m_a2z1")" ] && same_adapter "$T/ad_s_a2z1" "$T/ad_m_a2z1"' \
  "2 ranks streamed, grad_accum 2, zero 1: $(losses "$T/s_a2z1") against 2 ranks in memory $(losses "$T/m_a2z1"): $(tail -2 "$T/s_a2z1.out")"
# with the disk state (zero 1), stopped at 4 and resumed from the ranks' stores
mkdir -p "$T/st4"
$MPI -np 2 "$S" train $B $D --zero 1 --stop_at 4 --state_paths "$T/st4" --run_dir "$T/s_zd" >"$T/s_zd.1.out" 2>&1
$MPI -np 2 "$S" train $B $D --zero 1 --state_paths "$T/st4" --resume "$T/s_zd" --run_dir "$T/s_zd" \
  --save_adapter "$T/ad_s_zd" >"$T/s_zd.2.out" 2>&1
check '[ $? -eq 0 ] && grep -q "resumed from the state store .* at step 4" "$T/s_zd.2.out" && [ "$(losses "$T/s_zd")" = "$(losses "$T/s_ga")" ] && same_adapter "$T/ad_s_zd" "$T/ad_s_ga"' \
  "2 ranks streamed, zero 1, state_paths, stopped at 4 and resumed: $(losses "$T/s_zd") against $(losses "$T/s_ga"): $(tail -2 "$T/s_zd.2.out")"
echo "lora_dist: losses $(losses "$T/mem")"
[ $fail -eq 0 ] && rm -rf "$T"
exit $fail

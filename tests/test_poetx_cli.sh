#!/usr/bin/env bash
# test_poetx_cli.sh - strata train --method poetx end to end through the strata binary:
#  - a POET-X run (gpt2-tiny, b 8, a merge every 3 steps) trains, the loss falls;
#  - resume is bit-exact across merges: 8 steps straight and 3 + 5 (--stop_at 3: the checkpoint
#    right after the merge at step 3, then --resume over the merge at 6) give the same losses and
#    byte-identical final checkpoints (the trained tensors, Q, W0 and the permutations);
#  - poetx_recompute auto (the default) keeps the rotated inputs where the run fits and recomputes
#    them where only that fits host_budget (strata plan and strata train alike; the same losses);
#  - a resume with another method or poetx_block is refused, its config.json untouched;
#  - the Llama family trains too (llama-tiny);
#  - bad input refused before a run directory exists, naming the key (and the tensor): a block
#    size that divides no dimension of a weight (streamed POET-X, W0 fp32 and held:
#    test_poetx_stream.sh; the disk state: test_poetx_disk.sh; 8-bit optimizer state:
#    test_poetx_lr.sh);
#  - strata bench poet --json prints the state bytes per matmul-weight parameter by class.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx
poet="--method poetx --poetx_block 8 --poetx_terms 4 --poetx_merge_every 3 --lr 1e-2 --warmup_steps 2"
ck() { echo "$1/checkpoints/step_0000000$2/model.safetensors"; }

# --- straight
"$S" train --model gpt2-tiny $tiny $poet --steps 8 --ckpt_every 3 --run_dir "$T/a" >"$T/a.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "poetx run: $(tail -2 "$T/a.out")"
a_losses=$(losses "$T/a")
n=$(echo $a_losses | wc -w)
check '[ "$n" = 8 ]' "8 steps logged (got $n)"
first=$(echo $a_losses | cut -d" " -f1); last=$(echo $a_losses | awk "{print \$NF}")
check 'awk "BEGIN{exit !($last < $first)}"' "the loss falls over 8 poetx steps ($a_losses)"

# --- poetx_recompute 1: the rotated inputs formed again in the backward, the same numbers
"$S" train --model gpt2-tiny $tiny $poet --steps 8 --ckpt_every 3 --poetx_recompute 1 --run_dir "$T/rc" >"$T/rc.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(losses "$T/rc")" = "$a_losses" ] && grep -q "\"poetx_recompute\": *1" "$T/rc/config.json"' \
  "poetx_recompute 1 (rc $rc): losses $(losses "$T/rc") against $a_losses, config.json records it"

# --- poetx_recompute auto (the default): kept where the run fits, else recomputed; logged and
# recorded as if given. The budget between the two accounts strata plan prints.
check 'grep -q "poetx_recompute auto: 0" "$T/a.out" && grep -q "\"poetx_recompute\": *0" "$T/a/config.json"' \
  "auto with room: kept, logged and recorded: $(grep -m1 poetx_recompute "$T/a.out")"
need() { "$S" plan --model gpt2-tiny $tiny $poet --poetx_recompute $1 --json 2>/dev/null | jq '.memory.tiers.host.need | floor'; }
n0=$(need 0) n1=$(need 1)
check '[ -n "$n0" ] && [ -n "$n1" ] && [ "$n1" -lt "$n0" ]' "the account without the kept inputs ($n1) is below the one with them ($n0)"
mid=$(( (n0 + n1) / 2 ))
"$S" plan --model gpt2-tiny $tiny $poet --host_budget $mid >"$T/auto-plan.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "poetx_recompute auto: 1" "$T/auto-plan.out"' "strata plan chooses recompute under host_budget $mid: rc $rc $(head -2 "$T/auto-plan.out")"
"$S" train --model gpt2-tiny $tiny $poet --steps 8 --ckpt_every 3 --host_budget $mid --run_dir "$T/auto" >"$T/auto.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "poetx_recompute auto: 1" "$T/auto.out" && grep -q "\"poetx_recompute\": *1" "$T/auto/config.json" && [ "$(losses "$T/auto")" = "$a_losses" ]' \
  "auto under host_budget $mid: recomputed, the same losses (rc $rc): $(grep -m1 -e poetx_recompute -e "strata train:" "$T/auto.out")"
"$S" train --model gpt2-tiny $tiny $poet --steps 2 --host_budget $((n1 - 4096)) --run_dir "$T/auto-short" >"$T/auto-short.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "does not fit its memory" "$T/auto-short.out" && [ ! -e "$T/auto-short" ]' \
  "auto with no room for either: refused, no run directory (rc $rc): $(tail -1 "$T/auto-short.out")"

# --- resume: 3 (a merge, then the checkpoint) + 5 (over the merge at 6)
"$S" train --model gpt2-tiny $tiny $poet --steps 8 --ckpt_every 3 --stop_at 3 --run_dir "$T/b" >"$T/b1.out" 2>&1
"$S" train --resume "$T/b" --stop_at 0 >"$T/b2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "poetx resume runs: $(tail -2 "$T/b2.out")"
check '[ "$(losses "$T/b")" = "$a_losses" ]' "resumed losses ($(losses "$T/b")) equal the straight run's ($a_losses)"
check '[ -f "$(ck "$T/a" 8)" ] && cmp -s "$(ck "$T/a" 8)" "$(ck "$T/b" 8)"' \
  "the resumed run's final checkpoint is byte-identical to the straight run's"

# a resume with another method or block size is refused before anything is written
resume_refused "$T/b" method --method full
resume_refused "$T/b" poetx_block --poetx_block 4

# --- the Llama family
"$S" train --model llama-tiny $tiny $poet --steps 4 --run_dir "$T/l" >"$T/l.out" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "llama-tiny poetx run: $(tail -2 "$T/l.out")"

# --- bad input: refused before a run directory exists
refused block "--model gpt2-tiny $tiny --steps 2 $poet --poetx_block 12" "poetx_block" "transformer.h.0.attn.c_attn.weight"
refused llama_block "--model llama-tiny $tiny --steps 2 $poet --poetx_block 32" "poetx_block" "model.layers.0.self_attn.k_proj.weight"

# --- strata bench poet --json: one object; gpt2-tiny (C 32), b 8: Q is (32+96 + 32+32 + 32+128 + 128+32)(7/2)
# = 1792 per layer, 3584 in all, over 2 x 12288 matmul-weight parameters
"$S" bench poet --model gpt2-tiny --block 8 --batch 2 --seq 16 --steps 2 --json >"$T/bench.json" 2>"$T/bench.err"
check 'jq -e ".adamw_bytes_per_param == 16 and .w0_bytes_per_param == 4 and .q_params == 3584 and .matmul_params == 24576 and .poetx_step_s > 0 and .adamw_step_s > 0" "$T/bench.json" >/dev/null' \
  "bench poet --json: $(cat "$T/bench.json" "$T/bench.err" | head -c 400)"

method_end poetx_cli

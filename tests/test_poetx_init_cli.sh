#!/usr/bin/env bash
# test_poetx_init_cli.sh - key poetx_init: a POET-X run from scratch whose W0 starts flat
# (orthogonal, one singular value poetx_init_gain x the initialisation's RMS one; the spectrum
# itself: test_poetx_init.c), through the strata binary:
#  - it trains (the loss falls), logs the choice, records it in config.json, and starts from
#    another W0 than the model's initialisation (another first loss); auto, the default, is
#    orthogonal at gain 4 from scratch and model with init_from, recorded as chosen;
#  - resume is bit-exact: from a checkpoint across a merge, and from the disk state before the
#    first merge (where the resume draws W0 again from the seed): final weights byte-identical;
#  - refused, before a run directory exists or leaving config.json untouched, naming the key: an
#    unknown value, orthogonal with init_from, the keys with another method, a resume with another
#    poetx_init or poetx_init_gain.
set -u
. "$(dirname "$0")/lib_method_cli.sh"
method_begin poetx-init
poet="--model gpt2-tiny $tiny --threads 1 --method poetx --poetx_block 8 --poetx_merge_every 3 --lr 1e-2 --warmup_steps 2"
ortho="--poetx_init orthogonal --poetx_init_gain 3"
final() { echo "$1/checkpoints/step_$(printf %08d "$2")/model.safetensors"; }

"$S" train $poet --poetx_init model --steps 8 --run_dir "$T/model" >"$T/model.out" 2>&1
check '[ $? -eq 0 ]' "poetx_init model: $(tail -2 "$T/model.out")"
"$S" train $poet $ortho --steps 8 --run_dir "$T/a" >"$T/a.out" 2>&1
check '[ $? -eq 0 ]' "poetx_init orthogonal: $(tail -2 "$T/a.out")"
a=$(losses "$T/a")
first=$(echo $a | cut -d" " -f1); last=$(echo $a | awk "{print \$NF}")
check 'awk "BEGIN{exit !($last < $first)}"' "the loss falls over 8 steps ($a)"
m_first=$(losses "$T/model" | cut -d" " -f1)
check '[ "$first" != "$m_first" ]' "orthogonal W0 starts from another loss than the model's initialisation ($first, $m_first)"
check 'grep -q "poetx_init orthogonal" "$T/a.out" && jq -e ".poetx_init == \"orthogonal\" and .poetx_init_gain == 3" "$T/a/config.json" >/dev/null' \
  "logged and recorded: $(grep -m1 poetx_init "$T/a.out")"

# --- W0 the same for any thread count (one weight a thread, each QR on its thread alone)
"$S" train $poet $ortho --threads 1 --steps 0 --save_hf "$T/t1" --run_dir "$T/t1r" >"$T/t1.out" 2>&1
"$S" train $poet $ortho --threads 2 --steps 0 --save_hf "$T/t2" --run_dir "$T/t2r" >"$T/t2.out" 2>&1
check '[ -s "$T/t1/model.safetensors" ] && cmp -s "$T/t1/model.safetensors" "$T/t2/model.safetensors"' \
  "W0 on 1 thread and on 2 differs: $(tail -1 "$T/t2.out")"

# --- auto (the default): orthogonal from scratch at gain 4, recorded as chosen; model with init_from
"$S" train $poet --steps 8 --run_dir "$T/auto" >"$T/auto.out" 2>&1
"$S" train $poet --steps 8 --poetx_init orthogonal --poetx_init_gain 4 --run_dir "$T/o4" >"$T/o4.out" 2>&1
check '[ -n "$(losses "$T/auto")" ] && [ "$(losses "$T/auto")" = "$(losses "$T/o4")" ] && jq -e ".poetx_init == \"orthogonal\"" "$T/auto/config.json" >/dev/null' \
  "auto from scratch is orthogonal at gain 4, recorded: $(losses "$T/auto") against $(losses "$T/o4"): $(tail -1 "$T/auto.out")"
"$S" train --model gpt2-tiny $tiny --steps 0 --save_hf "$T/base" --run_dir "$T/base_run" >/dev/null 2>&1
"$S" train $poet --steps 2 --init_from "$T/base" --run_dir "$T/auto_if" >"$T/auto_if.out" 2>&1
check '[ $? -eq 0 ] && ! grep -q "poetx_init orthogonal" "$T/auto_if.out" && jq -e ".poetx_init == \"model\"" "$T/auto_if/config.json" >/dev/null' \
  "auto with init_from is model (W0 the given weights), recorded: $(tail -1 "$T/auto_if.out")"

# --- resume from a checkpoint, over the merge at step 6
"$S" train $poet $ortho --steps 8 --stop_at 3 --ckpt_every 3 --run_dir "$T/b" >"$T/b1.out" 2>&1
"$S" train $poet $ortho --steps 8 --resume "$T/b" --run_dir "$T/b" >"$T/b2.out" 2>&1
check '[ $? -eq 0 ] && cmp -s "$(final "$T/a" 8)" "$(final "$T/b" 8)"' \
  "checkpoint resume across a merge: final weights differ from the straight run's: $(tail -1 "$T/b2.out")"

# --- the default (auto) resumed from a checkpoint directory, no key given: the run's own W0
"$S" train $poet --steps 8 --stop_at 3 --ckpt_every 3 --run_dir "$T/e" >"$T/e1.out" 2>&1
"$S" train $poet --steps 8 --resume "$T/e/checkpoints/step_00000003" --run_dir "$T/e" >"$T/e2.out" 2>&1
check '[ $? -eq 0 ] && cmp -s "$(final "$T/auto" 8)" "$(final "$T/e" 8)"' \
  "auto resumed from its checkpoint directory: final weights differ from the straight run's: $(tail -1 "$T/e2.out")"

# --- the disk state, stopped before the first merge: W0 of the start from its file in the store
mkdir -p "$T/st" "$T/st2"
"$S" train $poet $ortho --steps 8 --state_paths "$T/st" --run_dir "$T/c" >"$T/c.out" 2>&1
check '[ $? -eq 0 ]' "with state_paths: $(tail -2 "$T/c.out")"
"$S" train $poet $ortho --steps 8 --stop_at 2 --state_paths "$T/st2" --run_dir "$T/d" >"$T/d1.out" 2>&1
check '[ -f "$T/st2/strata-state.poetx-w0-000000000.safetensors" ]' "the store keeps the start's W0 before the first merge"
: >"$T/st2/strata-state.poetx-w0-000000003.safetensors.tmp.1" # a write a kill cut short
"$S" train $poet $ortho --steps 8 --resume "$T/d" --state_paths "$T/st2" --run_dir "$T/d" >"$T/d2.out" 2>&1
check '[ $? -eq 0 ] && cmp -s "$T/c/model.safetensors" "$T/d/model.safetensors"' \
  "disk-state resume before the first merge: final weights differ from the straight run's: $(tail -1 "$T/d2.out")"
check '[ ! -e "$T/st2/strata-state.poetx-w0-000000003.safetensors.tmp.1" ] && [ ! -e "$T/st2/strata-state.poetx-w0-000000000.safetensors" ]' \
  "a merge removes the start's W0 file and a cut-short write: $(ls "$T/st2" | tr '\n' ' ')"
mkdir -p "$T/st3"
"$S" train $poet $ortho --steps 8 --stop_at 2 --state_paths "$T/st3" --run_dir "$T/g" >"$T/g1.out" 2>&1
resume_refused "$T/g" poetx_merge_every $poet $ortho --state_paths "$T/st3" --poetx_merge_every 4

# --- bad input
refused value "$poet --steps 2 --poetx_init flat" "poetx_init" "auto, model or orthogonal"
refused init_from "$poet --steps 2 --poetx_init orthogonal --init_from $T/base" "poetx_init" "init_from"
refused full "--model gpt2-tiny $tiny --steps 2 --poetx_init orthogonal" "poetx_init" "poetx"
refused gain0 "$poet --steps 2 --poetx_init_gain 0" "poetx_init_gain" "outside"
refused full_gain "--model gpt2-tiny $tiny --steps 2 --poetx_init_gain 2" "poetx_init_gain" "poetx"
resume_refused "$T/b" poetx_init $poet --poetx_init model
resume_refused "$T/b" poetx_init_gain $poet --poetx_init orthogonal --poetx_init_gain 2

method_end poetx_init_cli

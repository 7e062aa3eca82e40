#!/usr/bin/env bash
# test_run.sh - what a user meets around a run, end to end through the strata binary:
#  - resume: a saved stop_at never turns a resume into zero steps; --steps, --stop_at and
#    --run_dir on the command line win over the saved config; a moved run directory
#    resumes in place; a finished run resumed says "nothing to train" (no "loss nan");
#  - checkpoints: --keep_checkpoints N keeps the newest N complete ones (default 3, 0: all);
#    steps replayed after a resume are logged once; a missing or stale checkpoints/latest
#    falls back to the newest complete step_N (never a .partial);
#  - Hugging Face GPT-2: --save_hf writes dropout 0.0, --init_from reads the directory back
#    (in memory and streamed);
#  - help and messages: train --help names every family and the data syntax, an unknown
#    --model lists the Llama presets too, --device_budget 10 names the 10 bytes.
set -u
S=${STRATA_BIN:?}
T=$(mktemp -d /tmp/strata-run-XXXXXX)
fail=0; checks=0
check() { checks=$((checks+1)); if ! eval "$1"; then echo "FAIL: $2"; fail=$((fail+1)); fi; }
command -v jq >/dev/null || { echo "no jq: skipped"; exit 77; }
small="--model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 4 --seq 32 --quiet 1 --eval_every 0"
steps_of() { jq -r .step "$1/metrics.jsonl" | tr '\n' ' '; }
last_step() { tail -n 1 "$1/metrics.jsonl" | jq .step; }

# --- resume: stop_at, steps, run_dir, a moved directory
"$S" train $small --steps 6 --stop_at 3 --run_dir "$T/a" >"$T/a1.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(last_step "$T/a")" = 3 ]' "stop_at 3: $(tail -2 "$T/a1.out")"
"$S" train --resume "$T/a" --steps 8 >"$T/a2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(steps_of "$T/a")" = "1 2 3 4 5 6 7 8 " ]' \
  "resume --steps 8 after stop_at 3 trains steps 4..8 (rc $rc, steps: $(steps_of "$T/a")): $(tail -2 "$T/a2.out")"
check '! grep -q "loss nan" "$T/a2.out"' "no 'final loss nan' after a resume"
mv "$T/a" "$T/b"
"$S" train --resume "$T/b" --steps 10 >"$T/b.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ -d "$T/b/checkpoints/step_00000010" ] && [ "$(last_step "$T/b")" = 10 ]' \
  "a moved run resumes in place (rc $rc): $(tail -2 "$T/b.out")"
check '[ ! -e "$T/a" ]' "the run's old directory was recreated by the resume of its moved copy"
check 'jq -e ".run_dir == \"$T/b\"" "$T/b/config.json" >/dev/null' "config.json records where the run is now"
"$S" train --resume "$T/b" --steps 12 --run_dir "$T/c" >"$T/c.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ -d "$T/c/checkpoints/step_00000012" ] && [ ! -d "$T/b/checkpoints/step_00000012" ]' \
  "--run_dir on the command line wins at resume: $(tail -2 "$T/c.out")"
"$S" train --resume "$T/b" --steps 14 --stop_at 11 >"$T/d.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(last_step "$T/b")" = 11 ]' "--stop_at on the command line wins at resume: $(last_step "$T/b")"
"$S" train --resume "$T/b" --steps 11 >"$T/e.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "nothing to train" "$T/e.out" && ! grep -q "loss nan" "$T/e.out"' \
  "a run at its end resumed says nothing to train (rc $rc): $(tail -2 "$T/e.out")"
# resuming from a checkpoint directory writes into the run that holds it
"$S" train --resume "$T/b/checkpoints/step_00000011" --steps 13 >"$T/f.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ -d "$T/b/checkpoints/step_00000013" ]' "resume from RUN/checkpoints/step_N writes into RUN"

# --- checkpoint housekeeping
"$S" train $small --steps 8 --ckpt_every 1 --keep_checkpoints 3 --run_dir "$T/k3" >"$T/k3.out" 2>&1
check '[ "$(ls "$T/k3/checkpoints" | tr "\n" " ")" = "latest step_00000006 step_00000007 step_00000008 " ]' \
  "keep_checkpoints 3 keeps the newest three: $(ls "$T/k3/checkpoints" | tr '\n' ' ')"
"$S" train $small --steps 5 --ckpt_every 1 --run_dir "$T/kd" >"$T/kd.out" 2>&1
check '[ "$(ls -d "$T/kd/checkpoints/step_"* | wc -l)" -eq 3 ]' "the default keeps 3 checkpoints"
"$S" train $small --steps 5 --ckpt_every 1 --keep_checkpoints 0 --run_dir "$T/k0" >"$T/k0.out" 2>&1
check '[ "$(ls -d "$T/k0/checkpoints/step_"* | wc -l)" -eq 5 ]' "keep_checkpoints 0 keeps all"
# a crash after steps 5 and 6 were logged but before checkpoint 6 was complete
"$S" train $small --steps 6 --ckpt_every 2 --keep_checkpoints 0 --run_dir "$T/r" >"$T/r1.out" 2>&1
jq -r '"\(.step) \(.loss)"' "$T/r/metrics.jsonl" >"$T/r.ref"
rm -rf "$T/r/checkpoints/step_00000006"
mkdir -p "$T/r/checkpoints/step_00000006.partial" && echo junk >"$T/r/checkpoints/step_00000006.partial/train_state.bin"
echo step_00000004 >"$T/r/checkpoints/latest"
"$S" train --resume "$T/r" >"$T/r2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(steps_of "$T/r")" = "1 2 3 4 5 6 " ]' \
  "replayed steps logged once (rc $rc, steps: $(steps_of "$T/r")): $(tail -2 "$T/r2.out")"
check 'jq -r "\"\(.step) \(.loss)\"" "$T/r/metrics.jsonl" | cmp -s - "$T/r.ref"' "the replayed steps' losses equal the first run's"
# checkpoints/latest lost (or stale): the newest complete step_N is used, a .partial never
"$S" train $small --steps 6 --ckpt_every 2 --run_dir "$T/l" >"$T/l1.out" 2>&1
rm -f "$T/l/checkpoints/latest"
mkdir -p "$T/l/checkpoints/step_00000009.partial"
"$S" train --resume "$T/l" --steps 8 >"$T/l2.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "step_00000006" "$T/l2.out" && [ "$(steps_of "$T/l")" = "1 2 3 4 5 6 7 8 " ]' \
  "no checkpoints/latest: resumed from the newest complete checkpoint (rc $rc): $(tail -3 "$T/l2.out")"
echo step_00000006 >"$T/l/checkpoints/latest" # stale: step_00000008 is complete
"$S" train --resume "$T/l" --steps 9 >"$T/l3.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "at step 8" "$T/l3.out"' "a stale latest: resumed from step 8: $(tail -3 "$T/l3.out")"

# --- Hugging Face GPT-2 directories
"$S" train $small --steps 6 --run_dir "$T/hf-src" --save_hf "$T/hf" >"$T/hf1.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && jq -e ".resid_pdrop == 0 and .embd_pdrop == 0 and .attn_pdrop == 0" "$T/hf/config.json" >/dev/null' \
  "the GPT-2 export has its dropout fields at 0: $(jq -c '{resid_pdrop,embd_pdrop,attn_pdrop}' "$T/hf/config.json" 2>&1)"
fresh=$(jq 'select(.step == 1) | .loss' "$T/hf-src/metrics.jsonl")
"$S" train --init_from "$T/hf" --batch 4 --seq 32 --quiet 1 --eval_every 0 --steps 2 --run_dir "$T/ft" >"$T/ft.out" 2>&1
rc=$?
tuned=$(jq 'select(.step == 1) | .loss' "$T/ft/metrics.jsonl" 2>/dev/null)
check '[ $rc -eq 0 ] && awk -v a="$tuned" -v b="$fresh" "BEGIN { exit !(a < b - 0.3) }"' \
  "--init_from a GPT-2 directory starts from its weights (rc $rc, first loss $tuned vs $fresh from scratch): $(tail -2 "$T/ft.out")"
"$S" train --init_from "$T/hf" --batch 4 --seq 32 --quiet 1 --eval_every 0 --steps 2 --device_budget 2400000 \
  --run_dir "$T/fts" >"$T/fts.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(jq -c "[.step, .loss]" "$T/fts/metrics.jsonl")" = "$(jq -c "[.step, .loss]" "$T/ft/metrics.jsonl")" ]' \
  "--init_from GPT-2 under streaming gives the in-memory losses: $(tail -2 "$T/fts.out")"
"$S" train --init_from "$T/hf" --n_layer 3 --steps 1 --run_dir "$T/ftbad" >"$T/ftbad.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "n_layer" "$T/ftbad.out"' "a shape override that contradicts init_from is refused: $(tail -1 "$T/ftbad.out")"

# --- validation in the step line, metrics.jsonl and strata report
"$S" train --model gpt2-mini --n_layer 2 --n_embd 64 --n_head 2 --batch 4 --seq 32 --steps 6 --eval_every 2 \
  --eval_tokens 256 --log_every 100 --sample_every 0 --run_dir "$T/v" >"$T/v.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(jq -r "select(.val_loss) | .step" "$T/v/metrics.jsonl" | tr "\n" " ")" = "2 4 6 " ]' \
  "val_loss on the evaluated steps only (rc $rc): $(jq -c "[.step, .val_loss]" "$T/v/metrics.jsonl" | tr '\n' ' ')"
check 'jq -e "select(.val_loss) | (.val_ppl - (.val_loss | exp) | fabs) < 0.01 * .val_ppl" "$T/v/metrics.jsonl" >/dev/null' \
  "val_ppl is exp(val_loss)"
check '[ "$(grep -c "^step .*| val [0-9.]* (ppl" "$T/v.out")" -eq 3 ]' "the step line shows the validation loss when computed"
"$S" report "$T/v" >"$T/vr.out" 2>&1
rc=$?
vfinal=$(jq -r "select(.val_loss) | .val_loss" "$T/v/metrics.jsonl" | tail -1 | awk '{printf "%.4f", $1}')
check '[ $rc -eq 0 ] && grep -q "validation  final $vfinal" "$T/vr.out" && grep -q "3 evaluations" "$T/vr.out"' \
  "strata report gives the final validation loss $vfinal: $(grep validation "$T/vr.out")"
check '[ "$(grep -c "<circle class=\"val\"" "$T/v/report.html")" -eq 3 ] && grep -q ">validation loss</text>" "$T/v/report.html"' \
  "the loss chart marks the 3 validations"

# validation on token files, a weighted mix (training on the embedded corpus), and a bad path said at once
for i in 1 2; do
  for j in $(seq 1 200); do echo "line $j of file $i: the quick brown fox jumps over the lazy dog"; done >"$T/n$i.txt"
  "$S" data pack -o "$T/p$i" --split line "$T/n$i.txt" >/dev/null 2>&1
done
"$S" train $small --vocab_size 257 --steps 2 --val_data "$T/p1:0.7,$T/p2:0.3" --eval_every 1 --run_dir "$T/vm" >"$T/vm.out" 2>&1
rc=$?
check '[ $rc -eq 0 ] && [ "$(jq -r "select(.val_loss) | .step" "$T/vm/metrics.jsonl" | wc -l)" -eq 2 ]' \
  "val_data as a weighted mix of packed datasets (rc $rc): $(tail -1 "$T/vm.out")"
"$S" train $small --steps 2 --val_data "$T/nothing" --eval_every 1 --run_dir "$T/vb" >"$T/vb.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "val_data" "$T/vb.out" && [ ! -s "$T/vb/metrics.jsonl" ]' \
  "a missing val_data file is refused before step 1: $(tail -1 "$T/vb.out")"

# --- help and messages
"$S" train --help >"$T/help.txt"
check '! head -5 "$T/help.txt" | grep -q "Trains a GPT-2 model" && grep -q "Llama" "$T/help.txt"' "train --help names every family"
check 'grep -q "PATH\[:WEIGHT\]" "$T/help.txt" && grep -q "0.8" "$T/help.txt" && grep -q "T+1" "$T/help.txt"' \
  "train --help describes weighted lists and the windowing"
check 'grep -q -- "--val_data" "$T/help.txt" && grep -q -- "--keep_checkpoints" "$T/help.txt"' "train --help lists the new keys"
when="about 40 s on two idle cores (70 s of CPU time)"
check 'tr "\n" " " <"$T/help.txt" | grep -qF "$when" && tr "\n" " " <"${STRATA_SOURCE_DIR:?}/README.md" | grep -qF "${when% (*}"' \
  "README and train --help give the same time for the default run"
"$S" train --model nope --run_dir "$T/x" >"$T/model.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "llama3.2-1b" "$T/model.out" && grep -q "gpt2-124m" "$T/model.out"' \
  "an unknown model lists every preset: $(cat "$T/model.out")"
"$S" train $small --device_budget 10 --run_dir "$T/x" >"$T/budget.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "10 bytes" "$T/budget.out" && ! grep -q "0 free of a 0 budget" "$T/budget.out"' \
  "device_budget 10 names the real budget: $(cat "$T/budget.out")"

echo "run: $checks checks, $((checks-fail)) passed, $fail failed"
[ $fail -eq 0 ] && rm -rf "$T"
[ $fail -eq 0 ]

#!/usr/bin/env bash
# test_resume_matmul.sh - a resume with another matmul mode than the run's is refused
# before anything is written (the run's numerics would change), naming the key 'matmul'
# and both modes; with force_resume 1 it runs, warned, and force_resume is recorded as 0
# (the next resume is checked again, against the mode now recorded). A toy GPT-2, 2 + 2
# steps, about a second. Skips (77) where this build cannot compute matmul bf16 on the CPU
# (no oneDNN).
set -u
S=${STRATA_BIN:?STRATA_BIN not set}
T=$(mktemp -d /tmp/strata-test-resume-matmul-XXXXXX)
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
TOY="--model gpt2-tiny --n_embd 64 --n_layer 1 --vocab_size 256 --max_seq 16 --batch 1 --seq 16 --eval_every 0
     --sample_every 0 --quiet 1 --ckpt_every 2"

"$S" train $TOY --steps 2 --matmul bf16 --run_dir "$T/probe" >"$T/probe.out" 2>&1
if [ $? -ne 0 ]; then
    echo "resume_matmul: skipped: matmul bf16 is refused here: $(tail -1 "$T/probe.out")"
    rm -rf "$T"
    exit 77
fi

"$S" train $TOY --steps 2 --matmul fp32 --run_dir "$T/run" >"$T/a.out" 2>&1
check '[ $? -eq 0 ]' "the fp32 run failed: $(tail -3 "$T/a.out")"
cp "$T/run/config.json" "$T/config.before"
cp "$T/run/metrics.jsonl" "$T/metrics.before"
ls -R "$T/run" >"$T/tree.before"

# refused: names the key, both modes and what to do; nothing written
"$S" train --resume "$T/run" --steps 4 --matmul bf16 >"$T/b.out" 2>&1
rc=$?
check '[ $rc -ne 0 ]' "a resume with matmul bf16 of an fp32 run was not refused"
check 'grep -q "key .matmul.*trained with matmul fp32.*this resume gives bf16.*force_resume 1" "$T/b.out"' \
    "the refusal names the key, both modes and force_resume: $(cat "$T/b.out")"
check 'cmp -s "$T/config.before" "$T/run/config.json"' "the refused resume rewrote config.json"
check 'cmp -s "$T/metrics.before" "$T/run/metrics.jsonl"' "the refused resume changed metrics.jsonl"
ls -R "$T/run" >"$T/tree.after"
check 'cmp -s "$T/tree.before" "$T/tree.after"' "the refused resume wrote files: $(diff "$T/tree.before" "$T/tree.after")"

# refused too when the checkpoint directory itself is given
"$S" train --resume "$T/run/checkpoints/step_00000002" --steps 4 --matmul bf16 >"$T/c.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "trained with matmul fp32" "$T/c.out"' \
    "a resume of the run's checkpoint directory with matmul bf16 was not refused: $(tail -2 "$T/c.out")"

# a bf16 run resumed from its checkpoint directory in bf16 is not refused (the checkpoint's
# own config.json is the model's, not the run's)
"$S" train $TOY --steps 2 --matmul bf16 --run_dir "$T/run16" >"$T/g.out" 2>&1
"$S" train --resume "$T/run16/checkpoints/step_00000002" --steps 3 --matmul bf16 >"$T/h.out" 2>&1
check '[ $? -eq 0 ]' "a bf16 run resumed in bf16 from its checkpoint directory failed: $(tail -2 "$T/h.out")"

# the same mode resumes as before
"$S" train --resume "$T/run" --steps 3 --matmul fp32 >"$T/d.out" 2>&1
check '[ $? -eq 0 ]' "a resume with the run's own matmul failed: $(tail -3 "$T/d.out")"

# forced: runs, warns, records bf16 and force_resume 0
"$S" train --resume "$T/run" --steps 4 --matmul bf16 --force_resume 1 >"$T/e.out" 2>&1
check '[ $? -eq 0 ]' "the forced resume failed: $(tail -3 "$T/e.out")"
check 'grep -q "warning: key .matmul.*trained with matmul fp32.*computes bf16" "$T/e.out"' \
    "the forced resume did not warn: $(cat "$T/e.out")"
check 'grep -q "\"matmul\": *\"bf16\"" "$T/run/config.json"' "config.json does not record bf16 after the forced resume"
check 'grep -q "\"force_resume\": *0" "$T/run/config.json"' "config.json does not record force_resume 0"
# ... and the next resume in fp32 is checked again, against bf16
"$S" train --resume "$T/run" --steps 5 --matmul fp32 >"$T/f.out" 2>&1
rc=$?
check '[ $rc -ne 0 ] && grep -q "trained with matmul bf16 .*this resume gives fp32" "$T/f.out"' \
    "a resume in fp32 of the now-bf16 run was not refused: $(tail -2 "$T/f.out")"

[ $fail -eq 0 ] && rm -rf "$T" && echo "resume_matmul: all checks passed"
exit $fail

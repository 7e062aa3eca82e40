# lib_corpus.sh - the setup the data-selection shell tests share (sourced by them; not a test
# itself: its name does not match test_*.sh). After `. "$(dirname "$0")/lib_corpus.sh"`:
#   corpus_begin NAME   S (strata), SRC (the source tree, when set), T (a fresh temporary
#                       directory /tmp/strata-test-NAME-*), fail=0 and check COND MESSAGE;
#                       skips (77) without python3. Python run by the test can
#                       `from strata_megatron import write` (write(prefix, docs): a Megatron
#                       .bin/.idx pair of uint16 tokens, written here from the layout, not by strata).
#   corpus_noisy        the noisy real-text corpus (tools/gen_noisy_corpus.py, 3000 clean
#                       documents, seed 27) in T: clean, noisy, noisy.labels; skips (77) where the
#                       machine has too little text.
#   corpus_easy_hard    two sources in T: easy (a phrase repeated, 200 documents) and hard
#                       (uniformly random tokens, 200 documents of 192).
#   corpus_ranked SEED  T/base, 48 documents of 40 to 46 random tokens (1..99), and
#                       T/s.scores, each document's score its id (0 the easiest).
#   corpus_mpi          MPI (the mpirun command line the tests use), with OpenMPI's leaks
#                       suppressed under the sanitized build; skips (77) without mpirun.
corpus_begin() {
    S=${STRATA_BIN:?STRATA_BIN not set}
    SRC=${STRATA_SOURCE_DIR:-}
    command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
    T=$(mktemp -d "/tmp/strata-test-$1-XXXXXX")
    fail=0
    mkdir -p "$T/.py"
    cat > "$T/.py/strata_megatron.py" <<'PY'
import struct
def write(prefix, docs):
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(struct.pack("<%dH" % len(d), *d))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        f.write(struct.pack("<%di" % len(docs), *[len(d) for d in docs]))
        p = 0
        for d in docs:
            f.write(struct.pack("<q", p)); p += 2 * len(d)
        f.write(struct.pack("<%dq" % (len(docs) + 1), *range(len(docs) + 1)))
PY
    export PYTHONPATH="$T/.py${PYTHONPATH:+:$PYTHONPATH}"
}
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
LIB_CORPUS_DIR=$(dirname "${BASH_SOURCE[0]}")

corpus_noisy() {
    : "${SRC:?STRATA_SOURCE_DIR not set}"
    python3 "$SRC/tools/gen_noisy_corpus.py" --strata "$S" --out "$T" --docs 3000 --seed 27 > "$T/gen.out" 2>&1
    local rc=$?
    if [ $rc -eq 77 ]; then cat "$T/gen.out"; rm -rf "$T"; exit 77; fi
    check "[ $rc -eq 0 ]" "gen_noisy_corpus (rc $rc): $(cat "$T/gen.out")"
}

corpus_ranked() {
    python3 - "$T" "$1" <<'PY'
import random, sys
from strata_megatron import write
t = sys.argv[1]
rng = random.Random(int(sys.argv[2]))
write(t + "/base", [[rng.randrange(1, 100) for _ in range(40 + d % 7)] for d in range(48)])
open(t + "/scores.txt", "w").write("".join("%d\n" % d for d in range(48)))
PY
    "$S" data score "$T/base" --from_text "$T/scores.txt" -o "$T/s.scores" > "$T/score.out" 2>&1
    local rc=$?
    check "[ $rc -eq 0 ]" "score: $(cat "$T/score.out")"
}

corpus_mpi() {
    command -v mpirun >/dev/null || { echo "SKIP: mpirun not found"; rm -rf "$T"; exit 77; }
    . "$LIB_CORPUS_DIR/mpi_sanitized.sh"
    MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
}

corpus_easy_hard() {
    python3 - "$T" <<'PY'
import random, sys
from strata_megatron import write
t = sys.argv[1]
rng = random.Random(3)
write(t + "/easy", [list(b"the cat sat on the mat. " * 8) for _ in range(200)])
write(t + "/hard", [[rng.randrange(256) for _ in range(192)] for _ in range(200)])
PY
}

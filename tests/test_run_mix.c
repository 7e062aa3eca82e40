/* test_run_mix.c - the run's side of online mixing (src/run/run_mix.c) with a loader of 3
 * in-memory sources (online_mix) and synthetic per-row losses (each row's loss a function
 * of its source and position, some targets masked), 2 micro-batches a step:
 *   - the bandit run_mix updates equals one fed the per-source sums computed here
 *     independently from the rows (bit for bit, every step);
 *   - a run stopped after step 12 (loader state and CKPT/mix_online.bin) and resumed in a
 *     new loader and run_mix draws the same sources and reaches the same weights;
 *   - a truncated state file and a state of another source count are refused, naming it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/run_mix.h"
#include "testutil.h"

enum { K = 3, NTOK = 30000, B = 4, T = 8, MICRO = 2, DELAY = 2, STEPS = 40, STOP = 12 };
static uint16_t toks[K][NTOK];

static double row_loss(int src, int t) { return 1.5 + src * 0.8 + 0.01 * t; }

static st_status open_loader(st_data_loader **dl, st_err *err) {
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    c.n_sources = K;
    for (int i = 0; i < K; i++)
        c.sources[i] = (st_data_source_config){.format = ST_DATA_FORMAT_MEMORY, .mem = toks[i], .mem_tokens = NTOK,
                                               .mem_itemsize = 2, .weight = 1};
    c.B = B, c.T = T, c.seed = 9, c.prefetch = 3, c.online_mix = 1, c.online_group = MICRO;
    return st_data_loader_open(dl, &c, err);
}

/* Steps [from, to): sources into src, the reference bandit ref fed alongside. */
static int drive(st_data_loader *dl, run_mix *x, st_data_mix_online *ref, int from, int to, uint8_t *src,
                 st_err *err) {
    float losses[B * T];
    int32_t targets[B * T];
    for (int s = from; s < to; s++) {
        double sum[K] = {0}, cnt[K] = {0};
        for (int k = 0; k < MICRO; k++) {
            st_data_batch b;
            if (st_data_loader_next(dl, &b, err)) return 1;
            run_mix_note_sources(x, k, b.source);
            for (int r = 0; r < B; r++) {
                src[((size_t)s * MICRO + k) * B + r] = b.source[r];
                for (int t = 0; t < T; t++) {
                    int j = r * T + t, masked = (r + t + s) % 7 == 0;
                    targets[j] = masked ? -1 : 1;
                    losses[j] = masked ? 0.0f : (float)row_loss(b.source[r], t);
                    if (!masked) sum[b.source[r]] += losses[j], cnt[b.source[r]]++;
                }
            }
            run_mix_row_hook(x, k, losses, targets, (size_t)B * T);
        }
        if (run_mix_after_step(x, dl, err)) return 1;
        if (st_data_mix_online_update(ref, sum, cnt, err)) return 1;
        CHECK(!memcmp(ref->weights, x->bandit.weights, sizeof ref->weights), "step %d: weights %.17g vs reference %.17g",
              s, x->bandit.weights[0], ref->weights[0]);
    }
    return 0;
}

int main(void) {
    for (int i = 0; i < K; i++)
        for (int j = 0; j < NTOK; j++) toks[i][j] = (uint16_t)(1000 * i + j % 991);
    st_err err = {0};
    const char *dir = test_tmpdir();
    static uint8_t src[2][STEPS * MICRO * B];
    double final[2][K];
    for (int run = 0; run < 2; run++) {
        st_data_loader *dl = NULL;
        run_mix x;
        st_data_mix_online ref;
        st_data_mix_online_init(&ref, K, 0.9, DELAY, &err);
        CHECK(open_loader(&dl, &err) == ST_OK, "%s", err.msg);
        CHECK(run_mix_open(&x, K, MICRO, B, T, 0.9, DELAY, NULL, &err) == ST_OK && run_mix_start(&x, dl, &err) == ST_OK,
              "%s", err.msg);
        if (run == 0) {
            CHECK(drive(dl, &x, &ref, 0, STEPS, src[run], &err) == 0, "%s", err.msg);
        } else {
            CHECK(drive(dl, &x, &ref, 0, STOP, src[run], &err) == 0, "%s", err.msg);
            st_data_loader_state ls;
            st_data_loader_get_state(dl, &ls);
            CHECK(run_mix_save(&x, dir, &err) == ST_OK, "%s", err.msg);
            st_data_mix_online ref_saved = ref;
            run_mix_close(&x);
            st_data_loader_close(dl);
            /* resumed: a new loader at the saved state, a new run_mix from the file */
            CHECK(open_loader(&dl, &err) == ST_OK && st_data_loader_set_state(dl, &ls, &err) == ST_OK, "%s", err.msg);
            CHECK(run_mix_open(&x, K, MICRO, B, T, 0.9, DELAY, NULL, &err) == ST_OK &&
                  run_mix_load(&x, dir, &err) == ST_OK && run_mix_start(&x, dl, &err) == ST_OK, "%s", err.msg);
            ref = ref_saved;
            CHECK(drive(dl, &x, &ref, STOP, STEPS, src[run], &err) == 0, "resumed: %s", err.msg);
            /* a state of 3 sources refused by a run of 4; a truncated file refused */
            run_mix y;
            CHECK(run_mix_open(&y, 4, MICRO, B, T, 0.9, DELAY, NULL, &err) == ST_OK, "%s", err.msg);
            CHECK(run_mix_load(&y, dir, &err) == ST_ERR_INVALID && strstr(err.msg, "mix_online.bin") &&
                      strstr(err.msg, "4"), "another K: %s", err.msg);
            char path[4200];
            snprintf(path, sizeof path, "%s/%s", dir, RUN_MIX_FILE);
            FILE *f = fopen(path, "r+b");
            CHECK(f && ftruncate(fileno(f), 100) == 0, "truncating %s", path);
            if (f) fclose(f);
            CHECK(run_mix_load(&y, dir, &err) == ST_ERR_FORMAT && strstr(err.msg, "100 bytes"), "truncated: %s",
                  err.msg);
            run_mix_close(&y);
        }
        memcpy(final[run], x.bandit.weights, sizeof final[run]);
        run_mix_close(&x);
        st_data_loader_close(dl);
    }
    CHECK(!memcmp(src[0], src[1], sizeof src[0]), "the resumed run draws other sources");
    CHECK(!memcmp(final[0], final[1], sizeof final[0]), "the resumed run ends with other weights");
    CHECK(final[0][2] > final[0][0], "the highest-loss source is not favoured: %g %g %g", final[0][0], final[0][1],
          final[0][2]);
    printf("run_mix: weights after %d steps %.4f %.4f %.4f\n", STEPS, final[0][0], final[0][1], final[0][2]);
    return test_finish("run_mix");
}

/* test_data_mix_online.c - online data mixing (st_data_mix_online, EXP3 after Albalak et al.
 * 2023) on synthetic losses, and the loader's per-step weights (online_mix):
 *   - the bandit's weights against a reference written here from the paper's formulas
 *     (long double, no max shift, its own eps), 300 steps of noisy losses of 3 sources;
 *   - weights sum to 1, none below eps_{t+1}; the source with the highest loss is favoured;
 *   - a state copied as bytes after 40 updates and continued gives the same bits;
 *     a flipped byte, another K and bad settings are refused;
 *   - a loader of 3 in-memory sources driven by the bandit (the losses a function of the
 *     rows' sources): the same sources every step with prefetch 4 and prefetch 0, and a
 *     loader + bandit stopped after step 20 and resumed (states as bytes) continues the
 *     stream exactly; weights for a step already built are refused; every row's tokens are
 *     of the source the batch names.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/data.h"
#include "testutil.h"

enum { K = 3, STEPS = 300 };

/* the loss source i shows at step s: a level and a deterministic wobble */
static double synth_loss(int i, int s) {
    static const double level[K] = {2.0, 3.5, 2.5};
    return level[i] + 0.2 * sin(0.37 * s + i);
}

static long double ref_eps(int k, long double t) {
    if (t < 1) t = 1;
    long double e = sqrtl(logl((long double)k) / ((long double)k * t));
    return e < 1.0L / k ? e : 1.0L / k;
}

static void test_reference(void) {
    st_err err = {0};
    st_data_mix_online m;
    CHECK(st_data_mix_online_init(&m, K, 0.9, 2, &err) == ST_OK, "%s", err.msg);
    long double R[K] = {0}, pi[K] = {1.0L / 3, 1.0L / 3, 1.0L / 3};
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        double sum[K], cnt[K];
        for (int i = 0; i < K; i++) {
            cnt[i] = (s + i) % 5 == 0 ? 0 : 100 + i; /* a source absent now and then */
            sum[i] = synth_loss(i, s) * cnt[i];
        }
        CHECK(st_data_mix_online_update(&m, sum, cnt, &err) == ST_OK, "%s", err.msg);
        /* the reference: R_i <- a R_i + (1 - a) loss_i / pi_i; pi from eps of step s + 2 and s + 1 */
        for (int i = 0; i < K; i++)
            if (cnt[i] > 0) R[i] = 0.9L * R[i] + 0.1L * ((long double)sum[i] / cnt[i]) / pi[i];
        long double et = ref_eps(K, s + 2), ep = ref_eps(K, s + 1), z = 0;
        for (int i = 0; i < K; i++) z += expl(ep * R[i]);
        double tot = 0;
        for (int i = 0; i < K; i++) {
            pi[i] = (1 - K * et) * expl(ep * R[i]) / z + et;
            double d = fabs(m.weights[i] - (double)pi[i]) / (double)pi[i];
            if (d > worst) worst = d;
            tot += m.weights[i];
            CHECK(m.weights[i] >= (double)et * (1 - 1e-12), "step %d source %d weight %g below eps %g", s, i,
                  m.weights[i], (double)et);
        }
        CHECK(fabs(tot - 1) < 1e-12, "step %d: weights sum to %.17g", s, tot);
    }
    CHECK(worst < 1e-12, "weights differ from the reference by %g (relative)", worst);
    CHECK(m.weights[1] > m.weights[2] && m.weights[2] > m.weights[0],
          "the highest-loss source is not favoured: %g %g %g", m.weights[0], m.weights[1], m.weights[2]);
    printf("mix_online: after %d steps of losses 2.0/3.5/2.5 the weights are %.3f %.3f %.3f (reference within %.1e)\n",
           STEPS, m.weights[0], m.weights[1], m.weights[2], worst);
}

static void test_state(void) {
    st_err err = {0};
    st_data_mix_online a, b;
    CHECK(st_data_mix_online_init(&a, K, 0.5, 3, &err) == ST_OK, "%s", err.msg);
    unsigned char bytes[sizeof a];
    for (int s = 0; s < 80; s++) {
        if (s == 40) {
            st_data_mix_online_seal(&a);
            memcpy(bytes, &a, sizeof a);
            memcpy(&b, bytes, sizeof b);
            CHECK(st_data_mix_online_check(&b, K, "state", &err) == ST_OK, "%s", err.msg);
        }
        double sum[K], cnt[K] = {10, 20, 30};
        for (int i = 0; i < K; i++) sum[i] = synth_loss(i, s) * cnt[i];
        st_data_mix_online_update(&a, sum, cnt, &err);
        if (s >= 40) st_data_mix_online_update(&b, sum, cnt, &err);
    }
    CHECK(!memcmp(a.weights, b.weights, sizeof a.weights) && !memcmp(a.ring, b.ring, sizeof a.ring),
          "a resumed state differs: %.17g vs %.17g", a.weights[0], b.weights[0]);
    CHECK(st_data_mix_online_weights_for(&a, 80) && st_data_mix_online_weights_for(&a, 82) &&
          !st_data_mix_online_weights_for(&a, 83) && !st_data_mix_online_weights_for(&a, 79),
          "weights_for holds steps [t, t + delay)");
    memcpy(&b, bytes, sizeof b);
    ((unsigned char *)&b)[100] ^= 1;
    CHECK(st_data_mix_online_check(&b, K, "state", &err) == ST_ERR_FORMAT && strstr(err.msg, "CRC"), "flip: %s",
          err.msg);
    memcpy(&b, bytes, sizeof b);
    CHECK(st_data_mix_online_check(&b, 4, "ckpt/x", &err) == ST_ERR_INVALID && strstr(err.msg, "ckpt/x"),
          "K: %s", err.msg);
    CHECK(st_data_mix_online_init(&b, 1, 0.5, 2, &err) == ST_ERR_INVALID, "one source accepted");
    CHECK(st_data_mix_online_init(&b, K, 1.0, 2, &err) == ST_ERR_INVALID && strstr(err.msg, "mix_smoothing"),
          "alpha 1: %s", err.msg);
    CHECK(st_data_mix_online_init(&b, K, 0.5, 0, &err) == ST_ERR_INVALID, "delay 0 accepted");
    double sum[K] = {NAN, 1, 1}, cnt[K] = {1, 1, 1};
    CHECK(st_data_mix_online_update(&a, sum, cnt, &err) == ST_ERR_INVALID && strstr(err.msg, "source 0"),
          "NaN loss: %s", err.msg);
}

/* --- the loader driven by the bandit */
enum { NTOK = 20000, B = 4, T = 16, DELAY = 2, LSTEPS = 60, STOP = 20 };
static uint16_t toks[K][NTOK];

static st_status open_loader(st_data_loader **dl, int prefetch, st_err *err) {
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    c.n_sources = K;
    for (int i = 0; i < K; i++)
        c.sources[i] = (st_data_source_config){.format = ST_DATA_FORMAT_MEMORY, .mem = toks[i], .mem_tokens = NTOK,
                                               .mem_itemsize = 2, .weight = 1};
    c.B = B, c.T = T, c.world = 2, c.rank = 0, c.seed = 5, c.prefetch = prefetch, c.online_mix = 1;
    return st_data_loader_open(dl, &c, err);
}

/* Steps [from, to) of a loader whose weights for [from, from + DELAY) are set; the rows'
 * sources land in src (B a step). The loss of a row: its source's level. */
static int drive(st_data_loader *dl, st_data_mix_online *m, int from, int to, uint8_t *src, st_err *err) {
    for (int s = from; s < to; s++) {
        st_data_batch b;
        if (st_data_loader_next(dl, &b, err)) return 1;
        CHECK(b.step == (uint64_t)s, "batch step %llu, want %d", (unsigned long long)b.step, s);
        double sum[K] = {0}, cnt[K] = {0};
        for (int r = 0; r < B; r++) {
            int i = b.source[r];
            CHECK(b.tokens[(size_t)r * (T + 1)] / 1000 == i, "row %d of step %d: token %d not of source %d", r, s,
                  b.tokens[(size_t)r * (T + 1)], i);
            src[(size_t)s * B + r] = (uint8_t)i;
            sum[i] += synth_loss(i, 0) * T, cnt[i] += T;
        }
        if (st_data_mix_online_update(m, sum, cnt, err)) return 1;
        if (st_data_loader_set_step_weights(dl, (uint64_t)s + DELAY, st_data_mix_online_weights_for(m, s + DELAY),
                                            err))
            return 1;
    }
    return 0;
}

static int start(st_data_loader *dl, const st_data_mix_online *m, st_err *err) {
    for (uint64_t q = m->t; q < m->t + DELAY; q++)
        if (st_data_loader_set_step_weights(dl, q, st_data_mix_online_weights_for(m, q), err)) return 1;
    return 0;
}

static void test_loader(void) {
    for (int i = 0; i < K; i++)
        for (int j = 0; j < NTOK; j++) toks[i][j] = (uint16_t)(1000 * i + j % 997);
    st_err err = {0};
    static uint8_t src[3][LSTEPS * B];
    const int prefetch[3] = {4, 0, 4};
    for (int run = 0; run < 3; run++) {
        st_data_loader *dl = NULL;
        st_data_mix_online m;
        st_data_mix_online_init(&m, K, 0.9, DELAY, &err);
        CHECK(open_loader(&dl, prefetch[run], &err) == ST_OK && start(dl, &m, &err) == 0, "%s", err.msg);
        if (run < 2) {
            CHECK(drive(dl, &m, 0, LSTEPS, src[run], &err) == 0, "run %d: %s", run, err.msg);
        } else { /* stopped after step STOP, states kept as bytes, resumed in a new loader */
            CHECK(drive(dl, &m, 0, STOP, src[run], &err) == 0, "%s", err.msg);
            st_data_loader_state ls;
            st_data_loader_get_state(dl, &ls);
            st_data_mix_online_seal(&m);
            unsigned char lb[sizeof ls], mb[sizeof m];
            memcpy(lb, &ls, sizeof ls), memcpy(mb, &m, sizeof m);
            /* a step already built: refused naming the steps */
            double w[K] = {1, 1, 1};
            CHECK(st_data_loader_set_step_weights(dl, 1, w, &err) == ST_ERR_INVALID && strstr(err.msg, "step 1"),
                  "a built step's weights: %s", err.msg);
            st_data_loader_close(dl);
            memset(&m, 0, sizeof m), memset(&ls, 0, sizeof ls);
            memcpy(&ls, lb, sizeof ls), memcpy(&m, mb, sizeof m);
            CHECK(st_data_mix_online_check(&m, K, "resume", &err) == ST_OK, "%s", err.msg);
            CHECK(open_loader(&dl, 4, &err) == ST_OK && st_data_loader_set_state(dl, &ls, &err) == ST_OK &&
                  start(dl, &m, &err) == 0, "%s", err.msg);
            CHECK(drive(dl, &m, STOP, LSTEPS, src[run], &err) == 0, "resumed: %s", err.msg);
        }
        st_data_loader_close(dl);
    }
    CHECK(!memcmp(src[0], src[1], sizeof src[0]), "prefetch 4 and prefetch 0 draw different sources");
    CHECK(!memcmp(src[0], src[2], sizeof src[0]), "the resumed run draws different sources");
    int late[K] = {0};
    for (int r = (LSTEPS - 20) * B; r < LSTEPS * B; r++) late[src[0][r]]++;
    printf("mix_online: loader, rows of the last 20 steps by source: %d %d %d\n", late[0], late[1], late[2]);
}

int main(void) {
    test_reference();
    test_state();
    test_loader();
    return test_finish("data_mix_online");
}

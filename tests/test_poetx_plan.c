/* test_poetx_plan.c - strata plan's memory account for method poetx (st_train_mem_plan) holds
 * what POET-X keeps besides the trained vector's state:
 *   - the kept inputs of the backward: with poetx_recompute 0 every matmul weight's h = u W0^T
 *     (N x d_out floats) from the forward; recompute 1 keeps none. The two accounts differ by
 *     exactly 4 N sum(d_out) bytes, sum(d_out) derived here by hand from the tiny models' shapes
 *     (gpt2-tiny: C 32, 2 layers, 9C a layer = 576; llama-tiny: C 32, heads 4 x 8 and 2 x 8,
 *     F 48, 2 layers, q 32 + k 16 + v 16 + o 32 + gate 48 + up 48 + down 32 = 224 a layer = 448),
 *     and equal to what the POET-X model built over the same shape allocates for them
 *     (st_poetx_extra_bytes after alloc_acts);
 *   - the checkpoint's staging: the trained vector and every permutation (W0 is written from
 *     the base's own vector in host memory)
 *     (4 (n_trained + sum(d_in d_out) + sum(d_in + d_out)) bytes, the sums by hand too).
 */
#include <stdio.h>
#include <string.h>

#include "strata/backend.h"
#include "strata/model.h"
#include "strata/plan.h"
#include "strata/poetx.h"
#include "strata/train.h"
#include "testutil.h"

enum { B = 2, T = 8, BLOCK = 16 };

static int account(const char *preset, int recompute, st_mem_plan *e) {
    st_train_config c;
    st_train_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "%s", preset);
    snprintf(c.method, sizeof c.method, "poetx");
    c.batch = B;
    c.seq = T;
    c.poetx_block = BLOCK;
    c.poetx_recompute = recompute;
    st_err err = {0};
    if (st_train_mem_plan(&c, NULL, e, &err)) {
        CHECK(0, "%s recompute %d: %s", preset, recompute, err.msg);
        return -1;
    }
    return 0;
}

/* The kept h the POET-X model over preset allocates at B x T (poetx.c's own count). */
static double built_kept_h(st_backend *be, const char *preset) {
    st_err err = {0};
    st_model *base = NULL, *m = NULL;
    st_poetx_config pc = {.block = BLOCK, .terms = 4, .recompute = 0};
    if (st_model_create(&base, preset, NULL, be, &err) || st_poetx_model_create(&m, base, &pc, 1, &err) ||
        m->ops->alloc_acts(m, B, T, &err)) {
        CHECK(0, "%s: %s", preset, err.msg);
        if (m) st_model_free(m);
        return -1;
    }
    size_t g = 0, h = 0;
    st_poetx_extra_bytes(m, &g, &h);
    st_model_free(m);
    return (double)h;
}

static void one(st_backend *be, const char *preset, double sum_out, double sum_w0, double sum_perm) {
    st_mem_plan e0, e1;
    if (account(preset, 0, &e0) || account(preset, 1, &e1)) return;
    double h = 4.0 * B * T * sum_out;
    CHECK(e0.acts_stored - e1.acts_stored == h, "%s: activations with h kept %.0f, recomputed %.0f: differ by %.0f, "
          "want 4 N sum(d_out) = %.0f", preset, e0.acts_stored, e1.acts_stored, e0.acts_stored - e1.acts_stored, h);
    CHECK(e0.tier_need[ST_MEM_TIER_HOST] - e1.tier_need[ST_MEM_TIER_HOST] == h,
          "%s: host peak %.0f with h kept, %.0f recomputed: want them %.0f apart", preset,
          e0.tier_need[ST_MEM_TIER_HOST], e1.tier_need[ST_MEM_TIER_HOST], h);
    double built = built_kept_h(be, preset);
    CHECK(built == h, "%s: the model built allocates %.0f bytes of kept h, the account %.0f", preset, built, h);
    double staging = 4.0 * (e0.n_trainable + sum_perm);
    CHECK(e0.init_scratch == staging && e1.init_scratch == staging,
          "%s: checkpoint staging %.0f (recompute 1: %.0f), want 4 (trained %.0f + permutations %.0f) = %.0f (W0, %.0f, "
          "written from the base's vector)", preset, e0.init_scratch, e1.init_scratch, e0.n_trainable, sum_perm, staging,
          sum_w0);
}

int main(void) {
    st_backend *be = NULL;
    st_err err = {0};
    if (st_backend_cpu_create(&be, 1, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    /* gpt2-tiny, C 32: c_attn 32 x 96, attn.c_proj 32 x 32, c_fc 32 x 128, mlp.c_proj 128 x 32 */
    one(be, "gpt2-tiny", 2 * (96 + 32 + 128 + 32), 2 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32),
        2 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32)));
    /* llama-tiny, C 32, q 32, k and v 16, F 48: q 32x32, k 16x32, v 16x32, o 32x32, gate 48x32,
     * up 48x32, down 32x48 */
    one(be, "llama-tiny", 2 * (32 + 16 + 16 + 32 + 48 + 48 + 32),
        2 * (32 * 32 + 16 * 32 + 16 * 32 + 32 * 32 + 48 * 32 + 48 * 32 + 32 * 48),
        2 * (64 + 48 + 48 + 64 + 80 + 80 + 80));
    st_backend_free(be);
    return test_finish("poetx_plan");
}

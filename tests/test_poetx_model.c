/* test_poetx_model.c - POET-X over every matmul weight of the tiny GPT-2 and Llama models
 * (strata/poetx.h) against tests/fixtures/poetx_{gpt2,llama}_tiny.safetensors, written by
 * tools/gen_poetx_fixtures.py from the papers' equations (dense R W0 P, fp64, autograd).
 *
 * Tolerances, those of test_gpt2_fixture.c:
 *   loss        |d| <= 1e-5 relative
 *   gradients   |d| <= 1e-6 + 1e-3 |ref|  (every packed Q, every embedding, norm and bias)
 *   merged W    |d| <= 1e-5 max|ref| + 1e-4 |ref|  (test_poetx_fixture.c's)
 * Both with h kept from the forward and with it formed again in the backward (recompute).
 * Also: save_hf's dense model (R W0 P folded) read back gives the same loss (1e-5 relative); no
 * gradient of W0 is formed (the base keeps no gradient vector); a
 * merge leaves the loss within 1e-5 relative, Q at 0; a block size that divides no dimension of
 * some weight is refused naming the key and the tensor, before anything is allocated.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/poetx.h"
#include "strata/safetensors.h"
#include "testutil.h"

static int is_mm_weight(const char *n) {
    static const char *suf[] = {"c_attn.weight", "c_proj.weight", "c_fc.weight", "_proj.weight"};
    size_t ln = strlen(n);
    for (int i = 0; i < 4; i++) {
        size_t ls = strlen(suf[i]);
        if (ln >= ls && !strcmp(n + ln - ls, suf[i])) return 1;
    }
    return 0;
}

static void run_fixture(st_backend *be, const char *file, const char *preset, int recompute) {
    st_err err = {0};
    char path[512], bpath[512];
    snprintf(path, sizeof path, "tests/fixtures/%s", file);
    st_safetensors *fx, *bx;
    if (st_safetensors_open(&fx, test_source_path(path), &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    snprintf(bpath, sizeof bpath, "tests/fixtures/%s", st_safetensors_meta(fx, "weights"));
    st_model *base = NULL, *m = NULL;
    if (st_safetensors_open(&bx, test_source_path(bpath), &err)) {
        CHECK(0, "%s", err.msg);
        st_safetensors_close(fx);
        return;
    }
    if (st_model_create(&base, preset, NULL, be, &err) ||
        test_load_params(bx, base->tensors, base->n_tensors, base->n_params, be, base->params, &err)) {
        CHECK(0, "%s: base: %s", file, err.msg);
        st_model_free(base);
        st_safetensors_close(fx);
        st_safetensors_close(bx);
        return;
    }
    st_poetx_config pc = {.block = test_meta_int(fx, "b"), .terms = test_meta_int(fx, "k"), .recompute = recompute};
    const st_tensor_entry *ei = st_safetensors_find(fx, "inputs");
    int B = (int)ei->shape[0], T = (int)ei->shape[1], N = B * T;
    if (st_poetx_model_create(&m, base, &pc, 7, &err) || m->ops->alloc_acts(m, B, T, &err)) {
        CHECK(0, "%s: poetx model: %s", file, err.msg);
        st_model_free(m);
        st_safetensors_close(fx);
        st_safetensors_close(bx);
        return;
    }
    base = st_poetx_base(m);
    /* the fixture's Q's and permutations */
    int n_q = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const st_param_info *t = &m->tensors[i];
        if (!strstr(t->name, ".poet_q_")) continue;
        float *q = test_read_f32(fx, t->name, t->numel);
        CHECK(q != NULL, "%s: %s present", file, t->name);
        if (q) be->ops->copy_to_device(be, m->params + t->offset, q, t->numel * sizeof(float));
        free(q);
        n_q++;
    }
    int n_w = 0;
    for (int i = 0; i < base->n_tensors; i++) {
        const char *bn = base->tensors[i].name;
        if (!is_mm_weight(bn)) continue;
        char pin[200], pout[200];
        snprintf(pin, sizeof pin, "%.*s.perm_in", (int)strlen(bn) - 7, bn);
        snprintf(pout, sizeof pout, "%.*s.perm_out", (int)strlen(bn) - 7, bn);
        const st_tensor_entry *a = st_safetensors_find(fx, pin), *b = st_safetensors_find(fx, pout);
        CHECK(a && b, "%s: %s present", file, pin);
        if (a && b)
            CHECK(!st_poetx_set_perms(m, bn, st_safetensors_data(fx, a), st_safetensors_data(fx, b), &err), "%s: %s",
                  file, err.msg);
        n_w++;
    }
    CHECK(n_q == 2 * n_w && n_w > 0, "%s: %d packed Q's for %d weights", file, n_q, n_w);

    const int32_t *inputs = st_safetensors_data(fx, ei),
                  *targets = st_safetensors_data(fx, st_safetensors_find(fx, "targets"));
    float *ref_loss = test_read_f32(fx, "loss", 1);
    st_model_zero_grad(m);
    float loss = m->ops->forward(m, inputs, targets, 1.0f / N);
    m->ops->backward(m);
    CHECK(ref_loss && fabsf(loss - ref_loss[0]) <= 1e-5f * ref_loss[0], "%s: loss %.7f vs reference %.7f", file, loss,
          ref_loss ? ref_loss[0] : NAN);
    double rsum = 0;
    for (int i = 0; m->row_losses && i < N; i++) rsum += m->row_losses[i];
    CHECK(m->row_losses && fabs(rsum / N - loss) <= 1e-5 * loss, "%s: row losses' mean %.7f vs loss %.7f", file,
          rsum / N, loss);
    int n_checked = 0;
    float *g = malloc(m->n_params * sizeof(float));
    be->ops->copy_to_host(be, g, m->grads, m->n_params * sizeof(float));
    for (int i = 0; i < m->n_tensors; i++) {
        const st_param_info *t = &m->tensors[i];
        char name[200], what[300];
        snprintf(name, sizeof name, "grad.%s", t->name);
        float *ref = test_read_f32(fx, name, t->numel);
        CHECK(ref != NULL, "%s: %s present", file, name);
        if (ref) {
            snprintf(what, sizeof what, "%s %s", file, name);
            check_close_f32(what, g + t->offset, ref, t->numel, 1e-6, 1e-3);
            n_checked++;
        }
        free(ref);
    }
    int n_fx = 0;
    for (int i = 0; i < st_safetensors_count(fx); i++)
        if (!strncmp(st_safetensors_entry(fx, i)->name, "grad.", 5)) n_fx++;
    CHECK(n_checked == n_fx && n_fx == m->n_tensors, "%s: %d gradients compared, fixture has %d, model %d", file,
          n_checked, n_fx, m->n_tensors);
    /* no gradient of W0: the base keeps no gradient vector at all (the trainables' gradients,
     * compared above, are formed in m's own vector) */
    CHECK(base->grads == NULL, "%s: the base still holds a gradient vector (%zu floats)", file, base->n_params);

    /* --save_hf's merged dense model, read back as a plain model: the same loss; the POET-X model
     * itself unchanged by the save */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/merged_%s", test_tmpdir(), file);
    st_model *mm = NULL;
    if (m->ops->save_hf(m, dir, ST_F32, &err) || st_model_create_from(&mm, NULL, dir, NULL, 1, be, &err) ||
        mm->ops->alloc_acts(mm, B, T, &err)) {
        CHECK(0, "%s: merged model: %s", file, err.msg);
    } else {
        float lm = mm->ops->forward(mm, inputs, targets, 0.0f);
        CHECK(fabsf(lm - loss) <= 1e-5f * loss, "%s: save_hf's model's loss %.7f vs %.7f", file, lm, loss);
        float again = m->ops->forward(m, inputs, targets, 0.0f);
        CHECK(again == loss, "%s: loss after save_hf %.9g vs before %.9g", file, again, loss);
    }
    st_model_free(mm);

    /* a merge: W0 <- R W0 P as the reference's (read back in the base's layout: the model holds
     * it pre-permuted in the frame of the new permutations), Q <- 0, the loss unchanged */
    CHECK(!st_poetx_merge(m, 7, 200, &err), "%s: merge: %s", file, err.msg);
    float *bp = malloc(base->n_params * sizeof(float));
    int n_merged = 0;
    for (int i = 0; i < base->n_tensors; i++) {
        const st_param_info *t = &base->tensors[i];
        if (!is_mm_weight(t->name)) continue;
        char name[200], what[300];
        snprintf(name, sizeof name, "merged.%s", t->name);
        float *ref = test_read_f32(fx, name, t->numel);
        CHECK(!st_poetx_w0(m, t->name, bp + t->offset, &err), "%s: %s", file, err.msg);
        if (ref) {
            float mx = 0;
            for (size_t j = 0; j < t->numel; j++) mx = fmaxf(mx, fabsf(ref[j]));
            snprintf(what, sizeof what, "%s %s", file, name);
            check_close_f32(what, bp + t->offset, ref, t->numel, 1e-5 * mx, 1e-4);
            n_merged++;
        }
        free(ref);
    }
    CHECK(n_merged == n_w, "%s: %d merged weights compared of %d", file, n_merged, n_w);
    float *p = malloc(m->n_params * sizeof(float));
    be->ops->copy_to_host(be, p, m->params, m->n_params * sizeof(float));
    size_t qnz = 0;
    for (size_t j = st_poetx_q_offset(m); j < m->n_params; j++) qnz += p[j] != 0.0f;
    CHECK(qnz == 0, "%s: %zu Q entries nonzero after the merge", file, qnz);
    float after = m->ops->forward(m, inputs, targets, 0.0f);
    double rel = fabs((double)after - loss) / loss;
    CHECK(rel <= 1e-5, "%s: loss after the merge %.9g vs before %.9g (%.2g relative)", file, after, loss, rel);
    printf("%s (recompute %d): loss %.7f (reference %.7f), %d gradients, %d merged weights, merge changed the loss "
           "by %.2g relative\n", file, recompute, loss, ref_loss ? ref_loss[0] : NAN, n_checked, n_merged, rel);
    free(p);
    free(bp);
    free(g);
    free(ref_loss);
    st_model_free(m);
    st_safetensors_close(fx);
    st_safetensors_close(bx);
}

static void expect_refused(st_backend *be, const char *preset, int block, int terms, const char *want1,
                           const char *want2) {
    st_err err = {0};
    st_model *base = NULL, *m = NULL;
    if (st_model_create(&base, preset, NULL, be, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    st_poetx_config pc = {.block = block, .terms = terms};
    st_status s = st_poetx_model_create(&m, base, &pc, 1, &err); /* base freed either way */
    CHECK(s == ST_ERR_INVALID && m == NULL, "%s b=%d k=%d: refused (got %d)", preset, block, terms, (int)s);
    CHECK(strstr(err.msg, want1) && strstr(err.msg, want2), "%s: message names '%s' and '%s': %s", preset, want1,
          want2, err.msg);
    st_model_free(m);
}

int main(void) {
    st_err err = {0};
    st_backend *be = NULL;
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    for (int rc = 0; rc <= 1; rc++) { /* h kept from the forward, and formed again in the backward */
        run_fixture(be, "poetx_gpt2_tiny.safetensors", "gpt2-tiny", rc);
        run_fixture(be, "poetx_llama_tiny.safetensors", "llama-tiny", rc);
    }
    /* gpt2-tiny: C = 32, so 12 divides c_attn's 96 outputs but not its 32 inputs */
    expect_refused(be, "gpt2-tiny", 12, 3, "poetx_block", "transformer.h.0.attn.c_attn.weight");
    /* llama-tiny: 32 divides q (32 x 32) but not k's 16 outputs */
    expect_refused(be, "llama-tiny", 32, 3, "poetx_block", "model.layers.0.self_attn.k_proj.weight");
    expect_refused(be, "llama-tiny", 8, -1, "poetx_terms", "-1");
    st_backend_free(be);
    return test_finish("poetx_model");
}

/* test_lora_fixture.c - LoRA over frozen base weights (strata/lora.h) against Hugging Face PEFT:
 * tests/fixtures/lora_*.safetensors (tools/gen_lora_fixtures.py) hold adapters on the tiny
 * GPT-2 and Llama fixtures, PEFT's loss and the gradient of every adapter matrix (fp64).
 *
 * Tolerances, as test_gpt2_fixture.c:
 *   loss        |d| <= 1e-5 relative
 *   gradients   |d| <= 1e-6 + 1e-3 |ref|  (every lora_A and lora_B)
 * Also: the base has no gradient vector; the merged model (--save_hf's W0 + s B A) read back
 * as a plain model gives the same loss (1e-5 relative); the bad inputs are refused by key and
 * tensor before anything is allocated.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/lora.h"
#include "strata/model.h"
#include "strata/safetensors.h"
#include "testutil.h"

static void run_fixture(st_backend *be, const char *file, const char *preset) {
    st_err err = {0};
    char path[512], bpath[512];
    snprintf(path, sizeof path, "tests/fixtures/%s", file);
    st_safetensors *fx;
    if (st_safetensors_open(&fx, test_source_path(path), &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    snprintf(bpath, sizeof bpath, "tests/fixtures/%s", st_safetensors_meta(fx, "weights"));
    st_safetensors *bx;
    st_model *base = NULL, *m = NULL;
    if (st_safetensors_open(&bx, test_source_path(bpath), &err) ||
        st_model_create(&base, preset, NULL, be, &err)) {
        CHECK(0, "%s: %s", file, err.msg);
        st_safetensors_close(fx);
        return;
    }
    CHECK(test_load_params(bx, base->tensors, base->n_tensors, base->n_params, be, base->params, &err) == 0,
          "%s: base weights: %s", file, err.msg);
    st_lora_config lc = {.rank = test_meta_int(fx, "r"), .alpha = test_meta_int(fx, "lora_alpha")};
    snprintf(lc.targets, sizeof lc.targets, "%s", st_safetensors_meta(fx, "target_modules"));
    const st_tensor_entry *ei = st_safetensors_find(fx, "inputs");
    int B = (int)ei->shape[0], T = (int)ei->shape[1], N = B * T;
    if (st_lora_model_create(&m, base, &lc, 7, &err) || m->ops->alloc_acts(m, B, T, &err) ||
        m->ops->load(m, test_source_path(path), &err)) {
        CHECK(0, "%s: lora model: %s", file, err.msg);
        st_model_free(m);
        st_safetensors_close(fx);
        st_safetensors_close(bx);
        return;
    }
    CHECK(st_lora_base(m)->grads == NULL, "%s: the frozen base keeps no gradient vector", file);
    const int32_t *inputs = st_safetensors_data(fx, ei), *targets = st_safetensors_data(fx, st_safetensors_find(fx, "targets"));
    float *ref_loss = test_read_f32(fx, "loss", 1);
    st_model_zero_grad(m);
    float loss = m->ops->forward(m, inputs, targets, 1.0f / N);
    m->ops->backward(m);
    CHECK(fabsf(loss - ref_loss[0]) <= 1e-5f * ref_loss[0], "%s: loss %.7f vs PEFT %.7f", file, loss, ref_loss[0]);
    double rsum = 0; /* the per-row losses the run's hooks read are the LoRA forward's */
    for (int i = 0; m->row_losses && i < N; i++) rsum += m->row_losses[i];
    CHECK(m->row_losses && fabs(rsum / N - loss) <= 1e-5 * loss, "%s: row losses' mean %.7f vs loss %.7f", file,
          rsum / N, loss);
    int n_checked = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const st_param_info *t = &m->tensors[i];
        char name[160];
        snprintf(name, sizeof name, "grad.%s", t->name);
        float *ref = test_read_f32(fx, name, t->numel);
        CHECK(ref != NULL, "%s: %s present", file, name);
        if (ref) {
            char what[200];
            snprintf(what, sizeof what, "%s %s", file, name);
            check_close_f32(what, m->grads + t->offset, ref, t->numel, 1e-6, 1e-3);
            n_checked++;
        }
        free(ref);
    }
    /* every adapter matrix of the fixture is one of the model's */
    int n_fx = 0;
    for (int i = 0; i < st_safetensors_count(fx); i++)
        if (!strncmp(st_safetensors_entry(fx, i)->name, "grad.", 5)) n_fx++;
    CHECK(n_checked == n_fx && n_fx == m->n_tensors, "%s: %d adapter gradients compared, fixture has %d", file,
          n_checked, n_fx);

    /* the merged model (W0 + s B A) as a plain model: the same loss */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/merged_%s", test_tmpdir(), file);
    st_model *mm = NULL;
    if (st_lora_save_merged_hf(m, dir, ST_F32, &err) || st_model_create_from(&mm, NULL, dir, NULL, 1, be, &err) ||
        mm->ops->alloc_acts(mm, B, T, &err)) {
        CHECK(0, "%s: merged model: %s", file, err.msg);
    } else {
        float lm = mm->ops->forward(mm, inputs, targets, 0.0f);
        CHECK(fabsf(lm - ref_loss[0]) <= 1e-5f * ref_loss[0], "%s: merged model's loss %.7f vs PEFT %.7f", file, lm,
              ref_loss[0]);
        /* and the LoRA model's base is untouched by the merge */
        float again = m->ops->forward(m, inputs, targets, 0.0f);
        CHECK(again == loss, "%s: loss after the merge %.9g vs before %.9g", file, again, loss);
    }
    st_model_free(mm);
    free(ref_loss);
    st_model_free(m);
    st_safetensors_close(fx);
    st_safetensors_close(bx);
}

static void expect_refused(st_backend *be, const char *preset, int rank, const char *targets, const char *want1,
                           const char *want2) {
    st_err err = {0};
    st_model *base = NULL, *m = NULL;
    if (st_model_create(&base, preset, NULL, be, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    st_lora_config lc = {.rank = rank, .alpha = 8};
    snprintf(lc.targets, sizeof lc.targets, "%s", targets);
    st_status s = st_lora_model_create(&m, base, &lc, 1, &err); /* base is freed either way */
    CHECK(s == ST_ERR_INVALID && m == NULL, "%s r=%d targets=%s: refused (got %d)", preset, rank, targets, (int)s);
    CHECK(strstr(err.msg, want1) && strstr(err.msg, want2), "%s: message names '%s' and '%s': %s", preset, want1,
          want2, err.msg);
    st_model_free(m);
}

/* axpy_rows (the op the adapters add with) on the CPU backend against the reference backend
 * and a plain loop: strided rows of a packed output, both directions. */
static void check_axpy_rows(st_backend *cpu) {
    st_err err = {0};
    st_backend *ref;
    if (st_backend_ref_create(&ref, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    enum { N = 5, LD = 11, W = 4, COL = 3 };
    float y[N * LD], yr[N * LD], want[N * LD], x[N * W];
    st_rng r;
    st_rng_seed(&r, 3);
    for (int i = 0; i < N * LD; i++) y[i] = yr[i] = want[i] = st_rng_normal(&r);
    for (int i = 0; i < N * W; i++) x[i] = st_rng_normal(&r);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < W; i++) want[n * LD + COL + i] = (float)((double)want[n * LD + COL + i] + 0.75 * x[n * W + i]);
    cpu->ops->axpy_rows(cpu, y + COL, LD, x, W, 0.75f, N, W);
    ref->ops->axpy_rows(ref, yr + COL, LD, x, W, 0.75f, N, W);
    check_close_f32("axpy_rows cpu", y, want, N * LD, 1e-6, 1e-6);
    check_close_f32("axpy_rows ref", yr, want, N * LD, 0, 0);
    float g[N * W] = {0};
    cpu->ops->axpy_rows(cpu, g, W, want + COL, LD, 2.0f, N, W);
    int ok = 1;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < W; i++) ok &= g[n * W + i] == 2.0f * want[n * LD + COL + i];
    CHECK(ok, "axpy_rows gathers the columns back");
    st_backend_free(ref);
}

int main(void) {
    st_err err = {0};
    st_backend *be;
    if (st_backend_cpu_create(&be, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    check_axpy_rows(be);
    run_fixture(be, "lora_gpt2_tiny.safetensors", "gpt2-tiny");
    run_fixture(be, "lora_llama_tiny.safetensors", "llama-tiny");
    run_fixture(be, "lora_llama_tiny_qv.safetensors", "llama-tiny");
    /* rank above a projection's smaller dimension (gpt2-tiny C = 32; llama-tiny k_proj 16 x 32) */
    expect_refused(be, "gpt2-tiny", 33, "c_attn", "lora_rank", "transformer.h.0.attn.c_attn.weight");
    expect_refused(be, "llama-tiny", 17, "q_proj,k_proj", "lora_rank", "model.layers.0.self_attn.k_proj.weight");
    expect_refused(be, "gpt2-tiny", 4, "c_attn,q_proj", "lora_targets", "'q_proj'");
    expect_refused(be, "llama-tiny", 4, "c_fc", "lora_targets", "'c_fc'");
    expect_refused(be, "gpt2-tiny", 0, "c_attn", "lora_rank", ">= 1");
    st_backend_free(be);
    return test_finish("lora_fixture");
}

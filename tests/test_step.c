/* test_step.c - the step's loss is the mean over the unmasked targets of the whole step.
 *
 * A step of two micro-batches of (B, T) whose targets are partly masked (-1, as an SFT
 * loss mask leaves them, unevenly between the micro-batches) must give the loss and the
 * gradient of one forward and backward over the (2B, T) batch with the mean taken over
 * all its unmasked targets, as Hugging Face averages a batch whose labels are -100: the
 * same numbers up to the order of float sums (1e-5 relative), for GPT-2 and a Llama. A
 * step with nothing masked keeps the plain mean of the micro-batches' means. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/llama.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/step.h"
#include "strata/block.h"
#include "strata/stream.h"
#include "strata/tier.h"
#include "testutil.h"

enum { B = 2, T = 8 };

typedef struct row_sums {
    int calls, order_ok;
    long counted;
    double sum;
} row_sums;

static void row_hook(void *ctx, int k, const float *losses, const int32_t *targets, size_t n) {
    row_sums *rs = ctx;
    rs->order_ok = (rs->calls == 0 || rs->order_ok) && k == rs->calls;
    rs->calls++;
    for (size_t i = 0; i < n; i++)
        if (targets[i] >= 0) {
            rs->sum += losses[i];
            rs->counted++;
        }
}

static void check_model(const char *preset) {
    st_err err = {0};
    st_backend *be = NULL;
    st_model *m = NULL, *ref = NULL;
    st_optim *opt = NULL;
    st_step *step = NULL;
    CHECK(st_backend_cpu_create(&be, 1, &err) == ST_OK, "backend: %s", err.msg);
    if (st_model_create(&m, preset, NULL, be, &err) || st_model_create(&ref, preset, NULL, be, &err) ||
        m->ops->alloc_acts(m, B, T, &err) || ref->ops->alloc_acts(ref, 2 * B, T, &err)) {
        CHECK(0, "%s: %s", preset, err.msg);
        goto out;
    }
    m->ops->init_random(m, 3);
    ref->ops->init_random(ref, 3);
    st_optim_segment seg = {.offset = 0, .n = m->n_params, .weight_decay = 0.0f};
    CHECK(st_optim_create(&opt, &seg, 1, ST_OPTIM_STATE_F32, &err) == ST_OK, "optim: %s", err.msg);
    CHECK(st_step_create(&step, &(st_step_setup){.m = m, .opt = opt, .max_micro = 2}, &err) == ST_OK, "step: %s",
          err.msg);
    if (!step) goto out;
    row_sums rs = {0};
    st_step_set_row_hook(step, row_hook, &rs);

    int32_t in[2 * B * T], tg[2 * B * T];
    st_rng r;
    st_rng_seed(&r, 11);
    long unmasked = 0;
    for (int i = 0; i < 2 * B * T; i++) {
        in[i] = (int32_t)(st_rng_u64(&r) % (uint64_t)m->vocab_size);
        /* the first micro-batch mostly masked, the second mostly not */
        float keep = i < B * T ? 0.25f : 0.9f;
        tg[i] = st_rng_uniform(&r) < keep ? (int32_t)(st_rng_u64(&r) % (uint64_t)m->vocab_size) : -1;
        unmasked += tg[i] >= 0;
    }
    /* lr 0 and no decay: the update leaves the weights, the gradient stays for the check */
    st_step_hp hp = {.adam = {0.0f, 0.9f, 0.95f, 1e-8f, 1, 1.0f}, .grad_clip = 0};
    st_step_result res;
    CHECK(st_step_run(step, 2, B, T, in, tg, &hp, &res, &err) == ST_OK, "%s: step: %s", preset, err.msg);
    CHECK(res.n_targets == unmasked, "%s: %ld targets counted, %ld unmasked", preset, res.n_targets, unmasked);
    /* the row hook: each micro-batch's per-row losses, in order; their mean over the step's
     * targets is the step's loss */
    CHECK(rs.calls == 2 && rs.order_ok, "%s: row hook called %d times, in order %d", preset, rs.calls, rs.order_ok);
    CHECK(rs.counted == unmasked && fabs(rs.sum / (double)unmasked - res.loss) <= 1e-5 * fabs(res.loss),
          "%s: row losses %.8f over %ld rows, step loss %.8f", preset, rs.sum / (double)rs.counted, rs.counted,
          res.loss);
    st_step_set_row_hook(step, NULL, NULL);

    /* the reference: one (2B, T) batch, the mean over all its unmasked targets */
    st_model_zero_grad(ref);
    float ref_loss = ref->ops->forward(ref, in, tg, 1.0f / (float)unmasked);
    ref->ops->backward(ref);
    CHECK(fabs(res.loss - ref_loss) <= 1e-5 * fabs(ref_loss), "%s: step loss %.8f, one-batch mean %.8f", preset,
          res.loss, ref_loss);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < m->n_params; i++) scale = fmax(scale, fabs(ref->grads[i]));
    for (size_t i = 0; i < m->n_params; i++) worst = fmax(worst, fabs(m->grads[i] - ref->grads[i]) / scale);
    CHECK(worst <= 1e-5, "%s: gradient differs from the one-batch mean's by %.3g of its largest element", preset,
          worst);
    /* the plain mean over micro-batches would weigh the sparse first micro-batch as much as
     * the second: a different loss, so the check above can fail */
    float m0 = m->ops->forward(m, in, tg, 0), m1 = m->ops->forward(m, in + B * T, tg + B * T, 0);
    CHECK(fabs(0.5 * (m0 + m1) - ref_loss) > 1e-4, "%s: the masks are too even to tell the rules apart", preset);
    printf("  %-10s %ld of %d targets: loss %.6f (one batch %.6f, plain mean of means %.6f), grad within %.2g\n",
           preset, unmasked, 2 * B * T, res.loss, ref_loss, 0.5 * (m0 + m1), worst);

    /* nothing masked: the step's loss is the mean of the micro-batches' means, as before */
    for (int i = 0; i < 2 * B * T; i++)
        if (tg[i] < 0) tg[i] = (int32_t)(i % m->vocab_size);
    CHECK(st_step_run(step, 2, B, T, in, tg, &hp, &res, &err) == ST_OK, "%s: step: %s", preset, err.msg);
    float a = m->ops->forward(m, in, tg, 0), b = m->ops->forward(m, in + B * T, tg + B * T, 0);
    double plain = 0;
    plain += a / 2;
    plain += b / 2;
    CHECK(res.loss == plain, "%s: unmasked step loss %.9g, mean of means %.9g", preset, res.loss, plain);
out:
    st_step_destroy(step);
    st_optim_free(opt);
    st_model_free(m);
    st_model_free(ref);
    st_backend_free(be);
}

/* Streamed with grad_accum 2: the executor hands each micro-batch's rows to the step's hook. */
static void check_streamed_rows(void) {
    st_err err = {0};
    st_backend *cpu = NULL, *dev = NULL;
    st_arch *arch = NULL;
    st_stream_exec *x = NULL;
    st_step *step = NULL;
    st_gpt2_config cfg;
    st_stream_plan plan;
    CHECK(st_backend_cpu_create(&cpu, 1, &err) == ST_OK && st_backend_with_budget(&dev, cpu, 16u << 20, &err) == ST_OK &&
              st_gpt2_config_preset("gpt2-tiny", &cfg, &err) == ST_OK && st_arch_gpt2(&arch, &cfg, &err) == ST_OK,
          "streamed: %s", err.msg);
    if (!arch) goto out;
    st_stream_plan_default(&plan, cfg.n_layer);
    st_stream_config sc = {.arch = arch, .B = B, .T = T, .weight_decay = 0.0f, .grad_accum = 2};
    CHECK(st_stream_exec_create(&x, &sc, &plan, dev, &err) == ST_OK, "streamed: create: %s", err.msg);
    if (!x) goto out;
    st_stream_init_random(x, 3);
    CHECK(st_step_create(&step, &(st_step_setup){.sx = x, .max_micro = 2}, &err) == ST_OK, "streamed step: %s",
          err.msg);
    if (!step) goto out;
    row_sums rs = {0};
    st_step_set_row_hook(step, row_hook, &rs);
    int32_t in[2 * B * T], tg[2 * B * T];
    long unmasked = 0;
    for (int i = 0; i < 2 * B * T; i++) {
        in[i] = (int32_t)((i * 7 + 3) % cfg.vocab_size);
        tg[i] = i % 5 == 0 ? -1 : (int32_t)((i * 13 + 1) % cfg.vocab_size);
        unmasked += tg[i] >= 0;
    }
    st_step_hp hp = {.adam = {0.0f, 0.9f, 0.95f, 1e-8f, 1, 1.0f}, .grad_clip = 0};
    st_step_result res;
    CHECK(st_step_run(step, 2, B, T, in, tg, &hp, &res, &err) == ST_OK, "streamed step: %s", err.msg);
    CHECK(rs.calls == 2 && rs.order_ok, "streamed: row hook called %d times, in order %d", rs.calls, rs.order_ok);
    CHECK(rs.counted == unmasked && fabs(rs.sum / (double)unmasked - res.loss) <= 1e-5 * fabs(res.loss),
          "streamed: row losses %.8f over %ld rows, step loss %.8f", rs.sum / (double)rs.counted, rs.counted,
          res.loss);
    printf("  streamed   %ld of %d targets: loss %.6f, rows %.6f\n", unmasked, 2 * B * T, res.loss,
           rs.sum / (double)unmasked);
out:
    st_step_destroy(step);
    st_stream_exec_free(x);
    st_arch_free(arch);
    st_backend_free(dev);
    st_backend_free(cpu);
}

int main(void) {
    check_streamed_rows();
    check_model("gpt2-tiny");
    check_model("llama-tiny");
    return test_finish("step");
}

/* test_step_resident.c - the in-memory step through the block executor (every block
 * resident in the model's own vectors, stream.h's plan.resident) equals, bit for bit, the
 * model's own forward and backward followed by the norm and the update written out here:
 * the body strata trained with before the executor took the in-memory step.
 *
 * For GPT-2 and a Llama, three steps each of: one micro-batch; two micro-batches with
 * uneven masks; a clip below the norm (scaled updates); packed documents; 8-bit moments.
 * After every step the loss, every parameter and every moment are compared with memcmp,
 * and the forward-only evaluation (st_step_eval) with the model's forward. The same again
 * under matmul bf16 (a build with oneDNN), where the executor's matmuls read the weights'
 * bf16 copy that the optimizer's pass writes and the model's forward rounds every weight at
 * every call: the same bits expected. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/model.h"
#include "strata/optim.h"
#include "strata/step.h"
#include "testutil.h"

enum { B = 2, T = 16, STEPS = 3 };

typedef struct side {
    st_model *m;
    st_optim *opt;
    st_optim_segment *segs;
} side;

static int side_open(side *s, const char *preset, st_backend *be, st_optim_state_format fmt, st_err *err) {
    memset(s, 0, sizeof *s);
    if (st_model_create(&s->m, preset, NULL, be, err) || s->m->ops->alloc_acts(s->m, B, T, err)) return 1;
    s->m->ops->init_random(s->m, 5);
    if (!(s->segs = calloc((size_t)s->m->n_tensors, sizeof *s->segs))) return 1;
    st_params_decay_segments(s->m->tensors, s->m->n_tensors, 0.1f, s->segs);
    return st_optim_create(&s->opt, s->segs, s->m->n_tensors, fmt, err) != ST_OK;
}

static void side_close(side *s) {
    st_optim_free(s->opt);
    free(s->segs);
    st_model_free(s->m);
}

/* The reference: the model's forward and backward per micro-batch, the micro-batches summed
 * in order, the norm over the whole gradient, the update with the clip scale. */
static double ref_step(side *s, int n_micro, const int32_t *in, const int32_t *tg, const int32_t *pos,
                       const int32_t *ds, const st_step_hp *hp, float *acc, st_err *err) {
    st_model *m = s->m;
    size_t N = (size_t)B * T, n = m->n_params;
    long total;
    float dloss = st_step_dloss(tg, N * (size_t)n_micro, &total);
    double loss = 0;
    for (int k = 0; k < n_micro; k++) {
        if (ds && st_model_set_docs(m, pos + k * N, ds + k * N, err)) return NAN;
        st_model_zero_grad(m);
        float mean = m->ops->forward(m, in + k * N, tg + k * N, dloss);
        m->ops->backward(m);
        if (n_micro > 1) {
            if (k == 0) memcpy(acc, m->grads, n * sizeof(float));
            else if (k < n_micro - 1) for (size_t i = 0; i < n; i++) acc[i] += m->grads[i];
            else for (size_t i = 0; i < n; i++) m->grads[i] += acc[i];
        }
        loss += st_step_micro_loss(mean, tg + k * N, N, n_micro, total);
    }
    double sumsq = st_optim_grad_sumsq_f32(m->grads, n);
    if (!isfinite(sqrt(sumsq))) return loss;
    st_adamw_params a = hp->adam;
    a.grad_scale = st_optim_clip_scale(sumsq, 1.0f, hp->grad_clip);
    st_optim_step_args oa = {.params = m->params, .grads = m->grads, .grad_dtype = ST_F32, .grad_sumsq = sumsq};
    if (st_optim_step_ex(s->opt, &oa, &a, err)) return NAN;
    return loss;
}

static int same_state(const side *a, const side *b) {
    if (memcmp(a->m->params, b->m->params, a->m->n_params * sizeof(float))) return 0;
    for (int i = 0; i < st_optim_state_count(a->opt); i++) {
        size_t na, nb;
        void *pa = st_optim_state_buffer(a->opt, i, &na), *pb = st_optim_state_buffer(b->opt, i, &nb);
        if (na != nb || memcmp(pa, pb, na)) return 0;
    }
    return 1;
}

static void check(const char *preset, int n_micro, float clip, int docs, st_optim_state_format fmt, int bf16) {
    st_err err = {0};
    st_backend *be = NULL;
    side res = {0}, ref = {0};
    st_step *step = NULL;
    float *acc = NULL;
    char what[96];
    snprintf(what, sizeof what, "%s, %d micro-batches, clip %g%s%s%s", preset, n_micro, clip, docs ? ", documents" : "",
             fmt == ST_OPTIM_STATE_8BIT ? ", 8-bit" : "", bf16 ? ", bf16" : "");
    if (st_backend_cpu_create(&be, 1, &err) || (bf16 && st_backend_set_matmul(be, "bf16", &err)) ||
        side_open(&res, preset, be, fmt, &err) ||
        side_open(&ref, preset, be, fmt, &err)) {
        CHECK(0, "%s: %s", what, err.msg);
        goto out;
    }
    CHECK(st_step_in_blocks(res.m), "%s: the model has no block interface", what);
    CHECK(st_step_create(&step, &(st_step_setup){.m = res.m, .opt = res.opt, .max_micro = n_micro}, &err) == ST_OK,
          "%s: step: %s", what, err.msg);
    acc = malloc(ref.m->n_params * sizeof(float));
    if (!step || !acc) goto out;
    size_t N = (size_t)B * T, all = N * (size_t)n_micro;
    int32_t *in = malloc(all * 4), *tg = malloc(all * 4), *pos = malloc(all * 4), *ds = malloc(all * 4);
    if (!in || !tg || !pos || !ds) {
        free(in), free(tg), free(pos), free(ds);
        goto out;
    }
    st_rng r;
    st_rng_seed(&r, 17);
    if (docs) st_step_set_docs(step, pos, ds);
    int same = 1, clipped = 0;
    for (int s = 0; s < STEPS && same; s++) {
        for (size_t i = 0; i < all; i++) {
            in[i] = (int32_t)(st_rng_u64(&r) % (uint64_t)res.m->vocab_size);
            float keep = n_micro > 1 && i < N ? 0.3f : 0.95f; /* uneven masks across micro-batches */
            tg[i] = st_rng_uniform(&r) < keep ? (int32_t)(st_rng_u64(&r) % (uint64_t)res.m->vocab_size) : -1;
            /* documents of 5 tokens, packed back to back in every row */
            size_t t = i % T;
            pos[i] = (int32_t)(t % 5);
            ds[i] = (int32_t)(t - t % 5);
        }
        st_step_hp hp = {.adam = {1e-3f, 0.9f, 0.95f, 1e-8f, s + 1, 1.0f}, .grad_clip = clip};
        st_step_result rr;
        CHECK(st_step_run(step, n_micro, B, T, in, tg, &hp, &rr, &err) == ST_OK, "%s: step %d: %s", what, s, err.msg);
        double lr = ref_step(&ref, n_micro, in, tg, docs ? pos : NULL, docs ? ds : NULL, &hp, acc, &err);
        CHECK(!isnan(lr), "%s: reference: %s", what, err.msg);
        clipped += rr.clipped;
        CHECK(memcmp(&rr.loss, &lr, sizeof lr) == 0, "%s: step %d: loss %.9g, reference %.9g", what, s, rr.loss, lr);
        same = same_state(&res, &ref);
        CHECK(same, "%s: step %d: parameters or moments differ from the reference's", what, s);
    }
    if (clip > 0 && clip < 1.0f) CHECK(clipped == STEPS, "%s: %d of %d steps clipped: the clip is not exercised", what, clipped, STEPS);
    /* the forward-only evaluation through the step's body, and the model's */
    float le = 0;
    CHECK(st_step_eval(step, B, T, in, tg, docs ? pos : NULL, docs ? ds : NULL, &le, &err) == ST_OK, "%s: eval: %s",
          what, err.msg);
    if (docs) st_model_set_docs(ref.m, pos, ds, &err);
    float lm = ref.m->ops->forward(ref.m, in, tg, 0.0f);
    CHECK(memcmp(&le, &lm, sizeof le) == 0, "%s: eval %.9g, the model's forward %.9g", what, le, lm);
    printf("  %-44s %d steps equal (%d clipped), eval %.6f\n", what, STEPS, clipped, le);
    free(in), free(tg), free(pos), free(ds);
out:
    free(acc);
    st_step_destroy(step);
    side_close(&res);
    side_close(&ref);
    st_backend_free(be);
}

int main(void) {
    const char *models[] = {"gpt2-tiny", "llama-tiny"};
    for (int i = 0; i < 2; i++) {
        check(models[i], 1, 0.0f, 0, ST_OPTIM_STATE_F32, 0);
        check(models[i], 2, 0.0f, 0, ST_OPTIM_STATE_F32, 0);
        check(models[i], 2, 0.05f, 0, ST_OPTIM_STATE_F32, 0);
        check(models[i], 1, 1.0f, 1, ST_OPTIM_STATE_F32, 0);
        check(models[i], 3, 1.0f, 0, ST_OPTIM_STATE_8BIT, 0);
    }
    /* matmul bf16: the weights' bf16 copy (a build without oneDNN has no bf16 matmuls) */
    st_err e = {0};
    if (st_backend_matmul_check("cpu", "bf16", &e) == ST_OK) {
        for (int i = 0; i < 2; i++) {
            check(models[i], 1, 0.0f, 0, ST_OPTIM_STATE_F32, 1);
            check(models[i], 2, 0.05f, 0, ST_OPTIM_STATE_F32, 1);
            check(models[i], 1, 1.0f, 1, ST_OPTIM_STATE_8BIT, 1);
        }
    } else {
        printf("  matmul bf16 not checked: %s\n", e.msg);
    }
    return test_finish("step_resident");
}

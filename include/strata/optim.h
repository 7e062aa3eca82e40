/* optim.h - the optimizer engine: AdamW over a flat parameter vector.
 *
 * The vector is described by segments (one per tensor): each has its own weight decay
 * (decided by tensor role, by name, in the model layer). State formats: fp32 moments,
 * or 8-bit blockwise moments (see optim_state_format).
 *
 *     optim_segment segs[] = {{0, 1000, 0.1f}, {1000, 10, 0.0f}};
 *     optim *o;
 *     optim_create(&o, segs, 2, OPTIM_STATE_F32, &err);
 *     adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
 *                        .step = 1, .grad_scale = 1.0f};
 *     optim_step(o, params, grads, &hp);
 */
#ifndef STRATA_OPTIM_H
#define STRATA_OPTIM_H

#include "strata/core.h"
#include "strata/tensor.h"

typedef enum optim_state_format { OPTIM_STATE_F32 = 0, OPTIM_STATE_8BIT = 1 } optim_state_format;

typedef struct optim_segment {
    size_t offset;      /* elements from the start of the flat vector */
    size_t n;           /* elements */
    float weight_decay; /* decoupled: p -= lr * wd * p */
} optim_segment;

typedef struct adamw_params {
    float lr, beta1, beta2, eps;
    long step;        /* 1-based step number, for bias correction */
    float grad_scale; /* every gradient is multiplied by this first (clip * 1/loss_scale) */
} adamw_params;

typedef struct optim optim;

st_status optim_create(optim **out, const optim_segment *segs, int n_segs, optim_state_format fmt,
                       st_err *err);
void optim_free(optim *o);
size_t optim_numel(const optim *o);
optim_state_format optim_format(const optim *o);

/* One AdamW step over every segment: params and grads are fp32 flat vectors. */
void optim_step(optim *o, float *params, const float *grads, const adamw_params *hp);

/* The state as opaque byte buffers, for checkpoints: count, then each buffer's pointer and size. */
int optim_state_count(const optim *o);
void *optim_state_buffer(optim *o, int i, size_t *bytes);
/* Host bytes of state per parameter (fp32: 8 for the moments). */
double optim_state_bytes_per_param(const optim *o);

/* Sum of squares of a gradient, accumulated in double. NaN/Inf propagate, so a
 * non-finite result means the gradient had a non-finite element. */
double optim_grad_sumsq_f32(const float *g, size_t n);
double optim_grad_sumsq_bf16(const uint16_t *g, size_t n);

/* The plain scalar reference (fp32 state), one segment: the tests' oracle. */
void adamw_ref_f32(float *p, const float *g, float *m, float *v, size_t n, float weight_decay,
                   const adamw_params *hp);

#endif

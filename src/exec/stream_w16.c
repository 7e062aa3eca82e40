/* stream_w16.c - the block executor's bf16 copy of the weights, for a device whose bf16
 * matmuls read one (the CPU backend under matmul bf16: st_backend_bf16_weights_read).
 *
 * The copy (2 bytes a parameter, host memory, made at the first step that reads it) is
 * kept equal to the host weights rounded by st_f32_to_bf16: rounded whole once where it is
 * not known to be (the first step, after st_stream_set_params, init_random,
 * st_stream_params_changed, a rollback, the disk state's update, a failed step, or a step
 * run without it), and otherwise written by the optimizer's own pass (st_optim_step_args.work)
 * as it updates each weight. The step's matmuls then read their weight operands from it
 * (st_backend_bf16_weights_map) instead of rounding each weight at each use, forward and
 * backward: the same rounding of the same weights, so the step's results are bit for bit
 * those of rounding at each call. Mapped: resident, the whole vector; streamed, the
 * embedding's and head's device copies and, before each block's compute, the block's slot.
 * The ranks' step (weights gathered, updated elsewhere) and a chunked vocabulary's head
 * chunks read no copy (rounded at each use, as before). */
#include "exec/stream_internal.h"

enum { W16_PRE = 0, W16_POST = 1, W16_BLOCK = 2 }; /* backend regions */

/* A held base (x->held): the blocks' matmul weights are not in the host vector (their pages given
 * back; the hook reads its held copy) and no slot maps a copy, so only the ends are rounded and
 * kept: [0, block_offset0) then [post_offset, n_params), one after the other. */
static size_t w16_floats(const st_stream_exec *x) {
    return x->held ? x->block_offset0 + (x->n_params - x->post_offset) : x->n_params;
}
static size_t w16_post(const st_stream_exec *x) { return x->held ? x->block_offset0 : x->post_offset; }

size_t st_stream_bf16_weight_bytes(const st_stream_config *c) {
    const st_arch_layout *y = &c->arch->lay;
    if (c->hook && c->hook->held_block_bytes > 0) return (y->block_offset0 + (y->n_params - y->norm_offset)) * 2;
    return y->n_params * 2;
}

int stream_w16_begin(st_stream_exec *x) {
    x->w16_on = 0;
    if (x->dist_mode || !st_backend_bf16_weights_read(x->dev)) {
        x->w16_valid = 0; /* the optimizer will not keep it: rounded whole when next read */
        return 0;
    }
    if (!x->w16 && !x->w16_failed) {
        x->w16 = st_alloc(w16_floats(x) * sizeof(uint16_t));
        if (!x->w16) {
            x->w16_failed = 1; /* said once; each matmul rounds its weight, as without the copy */
            st_log(1, "stream: no room for the weights' bf16 copy (%zu bytes): matmul bf16 rounds each weight at "
                   "each use instead\n", w16_floats(x) * sizeof(uint16_t));
        }
    }
    if (!x->w16) return 0;
    if (!x->w16_valid) {
        st_prof_span sp = st_prof_begin(ST_PROF_CAT_COMPUTE, "weights to bf16", -1);
        if (x->held) { /* the ends only */
            st_backend_bf16_weights_round(x->dev, x->w16, x->host_params, x->block_offset0);
            st_backend_bf16_weights_round(x->dev, x->w16 + w16_post(x), x->host_params + x->post_offset,
                                          x->n_params - x->post_offset);
        } else {
            st_backend_bf16_weights_round(x->dev, x->w16, x->host_params, x->n_params);
        }
        st_prof_end(&sp);
        x->w16_valid = 1;
    }
    x->w16_on = 1;
    if (x->plan.resident) {
        st_backend_bf16_weights_map(x->dev, W16_PRE, x->host_params, x->w16, x->n_params);
    } else {
        if (!x->vocab_chunk) st_backend_bf16_weights_map(x->dev, W16_PRE, x->d_pre_w, x->w16, x->emb_numel);
        st_backend_bf16_weights_map(x->dev, W16_POST, x->d_post_w, x->w16 + w16_post(x), x->post_numel);
    }
    return 1;
}

void stream_w16_block(st_stream_exec *x, const float *slot, int l) {
    if (!x->w16_on || x->plan.resident || x->held) return; /* a held slab: no fp32 matmul weight in it */
    st_backend_bf16_weights_map(x->dev, W16_BLOCK, slot, x->w16 + x->block_offset0 + (size_t)l * x->block_numel,
                                x->block_numel);
}

void stream_w16_end(st_stream_exec *x) {
    if (x->w16_on) st_backend_bf16_weights_map(x->dev, -1, NULL, NULL, 0);
    x->w16_on = 0;
}

void stream_w16_free(st_stream_exec *x) {
    st_free(x->w16);
    x->w16 = NULL;
}

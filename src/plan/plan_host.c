/* plan_host.c - the host tier's bytes under a stream plan: what st_stream_exec_create
 * allocates in host memory (src/exec/stream_plan.c), so that a plan's host peak can be
 * predicted and checked against the measured one (strata bench plan). */
#include "strata/plan.h"

/* Everything but the optimizer's state (moments, speculative backups). */
static size_t host_bytes_common(const st_arch *a, int B, int T, const st_stream_plan *p) {
    const st_arch_layout *y = &a->lay;
    size_t n = y->n_params, N = (size_t)B * T, C = (size_t)y->n_embd;
    size_t bytes = n * 4 * 2   /* parameters, gradients (fp32) */
                 + N * 20;     /* per-row losses, running max, target logit, sum (double) */
    if (p->grad_dtype == ST_BF16) bytes += n * 2;
    size_t n_off = 0;
    for (int l = 0; l < p->n_layer; l++) n_off += p->act[l] == ST_STREAM_ACT_OFFLOAD;
    bytes += n_off * st_block_act_floats(a, B, T) * 4;
    if (p->vocab_chunk > 0) {
        size_t V = (size_t)y->vocab_size, vc = (size_t)p->vocab_chunk < V ? (size_t)p->vocab_chunk : V;
        size_t nvc = (V + vc - 1) / vc;
        bytes += 2 * N * C * 4;                          /* the embedding's output, the residual gradient */
        if (nvc > 2) bytes += N * (nvc - 2) * vc * 4;    /* logits of the chunks that leave the device */
        bytes += a->ops->bind_bytes(a, B, T);            /* the embedding's bindings on the host backend */
    }
    return bytes;
}

size_t st_plan_host_bytes(const st_arch *a, int B, int T, const st_stream_plan *p) {
    const st_arch_layout *y = &a->lay;
    size_t bytes = host_bytes_common(a, B, T, p) + y->n_params * 4 * 2; /* AdamW's moments m, v (fp32) */
    if (p->overlap_optim && p->clip != ST_STREAM_CLIP_DEFER) /* speculative backups of the blocks' p, m, v */
        bytes += (y->norm_offset - y->block_offset0) * 12;
    return bytes;
}

size_t st_plan_host_bytes_disk(const st_arch *a, int B, int T, const st_stream_plan *p) {
    return host_bytes_common(a, B, T, p);
}

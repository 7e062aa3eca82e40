/* stream_plan.c - the streaming executor's plan and its making: the plan's defaults, the
 * table of every device allocation a plan needs (st_stream_device_bytes sums it, create
 * allocates it: one source), the traced copy backend, create and free, and the accessors.
 */
#include <stdlib.h>
#include <string.h>

#include "exec/stream_internal.h"
#include "optim/adamw_kernels.h" /* SUMSQ_CHUNK: the number of norm partials */

/* ------------------------------------------------------------------ plan */

void st_stream_plan_default(st_stream_plan *p, int n_layer) {
    memset(p, 0, sizeof *p);
    p->prefetch_depth = 1;
    p->overlap_optim = 1;
    p->clip = ST_STREAM_CLIP_AUTO;
    p->grad_dtype = ST_F32;
    p->act_dtype = ST_F32;
    p->optim_threads = 1;
    p->n_layer = n_layer;
    st_stream_plan_set_all(p, ST_STREAM_ACT_RECOMPUTE);
}

void st_stream_plan_set_all(st_stream_plan *p, st_stream_act a) {
    int L = p->n_layer < ST_STREAM_MAX_LAYERS ? p->n_layer : ST_STREAM_MAX_LAYERS;
    for (int l = 0; l < L; l++) p->act[l] = (unsigned char)a;
}

void st_stream_plan_resident(st_stream_plan *p, int n_layer) {
    st_stream_plan_default(p, n_layer);
    p->resident = 1;
    p->clip = ST_STREAM_CLIP_DEFER;
    st_stream_plan_set_all(p, ST_STREAM_ACT_KEEP);
}

/* ------------------------------------------------------------------ a traced copy backend
 * On a backend without copy_async the copy engine calls its backend's copy ops on its
 * worker thread; wrapping them puts every transfer in the trace as a COPY span with its
 * bytes, on the copy thread (so it is not counted as exposed transfer time of the step
 * thread). The copy_async path is traced by the engine's observer (below). */

static void traced_h2d(st_backend *be, void *dst, const void *src, size_t bytes) {
    traced_be *t = (traced_be *)be;
    st_prof_thread_name("copy engine");
    st_prof_span s = st_prof_begin(ST_PROF_CAT_COPY, "h2d", -1);
    t->inner->ops->copy_to_device(t->inner, dst, src, bytes);
    st_prof_end_bytes(&s, (int64_t)bytes);
}

static void traced_d2h(st_backend *be, void *dst, const void *src, size_t bytes) {
    traced_be *t = (traced_be *)be;
    st_prof_thread_name("copy engine");
    st_prof_span s = st_prof_begin(ST_PROF_CAT_COPY, "d2h", -1);
    t->inner->ops->copy_to_host(t->inner, dst, src, bytes);
    st_prof_end_bytes(&s, (int64_t)bytes);
}

/* A backend with copy_async (CUDA) runs the copies on its copy streams, on no thread of
 * ours: the engine's observer thread (st_copy_engine_observe, while a trace is open) waits
 * for each and reports it here, on that thread, also named "copy engine". The span runs
 * from the copy's submission to the completion that thread saw, so it includes the time
 * the copy queued behind the compute stream's earlier ops and its direction's earlier
 * copies: an upper bound of the transfer. */
static void traced_async_done(void *ctx, int d2h, size_t bytes, double t_submit, double t_done) {
    (void)ctx, (void)t_done;
    st_prof_thread_name("copy engine");
    st_prof_span s = st_prof_begin(ST_PROF_CAT_COPY, d2h ? "d2h" : "h2d", -1);
    if (s.t0_ns) s.t0_ns = (uint64_t)(t_submit * 1e9); /* st_now and the trace: CLOCK_MONOTONIC */
    st_prof_end_bytes(&s, (int64_t)bytes);
}

/* ------------------------------------------------------------------ host buffers that cross
 * The host buffers the executor allocates itself and copies to or from the device come
 * from the device's host_alloc when it has one (CUDA: page-locked, so a copy runs at the
 * link's speed without the driver staging it through a bounce buffer, and truly
 * beside the compute), each once at the plan's size; else st_alloc. Both are zeroed. */
static void *host_buf(st_stream_exec *x, size_t bytes) {
    const st_backend_ops *o = x->dev->ops;
    return o->host_alloc && o->host_free ? o->host_alloc(x->dev, bytes) : st_alloc(bytes);
}
static void host_buf_free(st_stream_exec *x, void *p) {
    const st_backend_ops *o = x->dev->ops;
    if (!p) return;
    if (o->host_alloc && o->host_free) o->host_free(x->dev, p);
    else st_free(p);
}

/* ------------------------------------------------------------------ device allocations */

/* A hook's base (st_stream_config.hook): the caller's optimizer, no gradient slots, host gradient
 * vector or moments. Frozen (LoRA): no gradient of the arch's anywhere; else (POET-X) the hook
 * trains the ends: the embedding's and head's gradients formed on the device (ends_cfg). */
static int hook_base_cfg(const st_stream_config *c) { return c->hook != NULL; }
static int ends_cfg(const st_stream_config *c) { return c->hook && !c->hook->frozen; }

static size_t rnd(size_t bytes) { return (bytes + ST_ARENA_ALIGN - 1) / ST_ARENA_ALIGN * ST_ARENA_ALIGN; }

/* A hook holding the base's matmul weights (held_block_bytes > 0): the slots are held slabs. */
static int held_cfg(const st_stream_config *c) { return c->hook && c->hook->held_block_bytes > 0; }

/* The floats of a block's 1-D tensors (norms, biases): a held slab's fp32 part (block.h). */
static size_t held_slab_floats(const st_arch_layout *y) {
    size_t n = 0;
    for (int i = 0; i < y->tensors_per_block; i++) {
        const st_param_info *t = &y->tensors[y->n_pre_tensors + i];
        if (t->ndim == 1) n += t->numel;
    }
    return n;
}

/* Where a held slab's held run starts, in bytes (its fp32 part rounded up to 64 bytes). */
static size_t held_run_at(const st_stream_config *c) { return (held_slab_floats(&c->arch->lay) * 4 + 63) / 64 * 64; }

/* One weight slot's bytes: a block's fp32 slab, or a held slab with the block's held run. */
static size_t slot_bytes(const st_stream_config *c) {
    return held_cfg(c) ? held_run_at(c) + c->hook->held_block_bytes : c->arch->lay.block_numel * 4;
}

/* Every device allocation of a plan, in one table: st_stream_device_bytes sums it (with
 * the arch's bound state) and st_stream_exec_create allocates it, so the two cannot differ.
 * x NULL: sizes only. */
typedef struct dev_alloc {
    void **ptr;
    size_t bytes;
} dev_alloc;
#define MAX_ALLOCS 32

static int alloc_table(const st_stream_config *c, const st_stream_plan *p, st_stream_exec *x, dev_alloc *t) {
    const st_arch_layout *y = &c->arch->lay;
    size_t N = (size_t)c->B * c->T, C = (size_t)y->n_embd, L = (size_t)y->n_blocks, V = (size_t)y->vocab_size;
    size_t NC = N * C, bn = y->block_numel, setf = st_block_act_floats(c->arch, c->B, c->T);
    size_t n_keep = 0, n_off = 0, rc = 0;
    int fz = hook_base_cfg(c) && !ends_cfg(c); /* the final norm's gradient still formed (the op always does), dropped */
    int no_slots = hook_base_cfg(c); /* the blocks' gradients: none, or the hook's (grad_at) */
    for (size_t l = 0; l < L; l++) {
        if (p->act[l] == ST_STREAM_ACT_KEEP) n_keep++;
        else if (p->act[l] == ST_STREAM_ACT_OFFLOAD) n_off++;
        else rc = 1;
    }
    int k = 0;
#define A(field, nbytes) t[k++] = (dev_alloc){x ? (void **)&x->field : NULL, (nbytes)}
    A(d_emb_out, NC * 4);                                   /* block 0's input */
    A(d_dres, NC * 4);                                      /* the residual stream's gradient */
    A(d_xn, NC * 4);                                        /* the final norm's output */
    A(d_dxn, NC * 4);                                       /* ... and its gradient */
    A(d_nstats, N * (size_t)y->norm_stat_floats * 4);       /* the final norm's row statistics */
    A(d_tgt, N * 4);                                        /* targets */
    if (p->vocab_chunk > 0) {
        size_t vc = (size_t)p->vocab_chunk < V ? (size_t)p->vocab_chunk : V, nvc = (V + vc - 1) / vc;
        A(d_vocab_w, 2 * vc * C * 4);                            /* head chunk slots: weights */
        if (!fz) A(d_vocab_g, 2 * vc * C * 4);                   /* ... and gradients */
        A(d_logits, (nvc < 2 ? 1 : 2) * N * vc * 4);        /* logits chunk slots */
        A(d_rmax, N * 4);                                   /* online-softmax row statistics */
        A(d_tlogit, N * 4);
        A(d_rsum, N * 8);
        A(d_post_w, y->norm_numel * 4);                     /* the norm (the head streams) */
        A(d_post_g, y->norm_numel * 4);
    } else {
        if (!p->resident) A(d_pre_w, y->emb_numel * 4);     /* the embedding (resident: the host's) */
        if (!p->resident && !fz) A(d_pre_g, y->emb_numel * 4);
        A(d_logits, N * V * 4);
        A(d_losses, N * 4);
        if (!p->resident) A(d_post_w, (y->n_params - y->norm_offset) * 4); /* the norm and an untied head */
        if (!p->resident) A(d_post_g, (fz ? y->norm_numel : y->n_params - y->norm_offset) * 4);
    }
    A(d_outs, L * NC * 4);                                  /* block outputs (checkpoints) */
    if (!p->resident) A(d_w, (size_t)(p->prefetch_depth + 1) * slot_bytes(c)); /* weight slots */
    if (!p->resident && !no_slots) A(d_g, 2 * bn * 4);      /* gradient slots */
    if (p->grad_dtype == ST_BF16 && !no_slots) A(d_g16, 2 * bn * 2); /* their bf16 staging */
    size_t esz = p->act_dtype == ST_BF16 ? 2 : 4;            /* a stored activation */
    if (n_keep) A(d_keep, n_keep * setf * esz);
    if (rc) A(d_recompute, setf * esz);
    if (n_off) A(d_offload, (n_off < 2 ? n_off : 2) * setf * esz);
    if (esz == 2) A(d_act_work, setf * 4);                  /* bf16: the set every block computes in */
#undef A
    return k;
}

size_t st_stream_device_bytes(const st_stream_config *c, const st_stream_plan *p) {
    dev_alloc t[MAX_ALLOCS];
    int k = alloc_table(c, p, NULL, t);
    size_t b = c->arch->ops->bind_bytes(c->arch, c->B, c->T); /* token ids, block scratch */
    for (int i = 0; i < k; i++) b += rnd(t[i].bytes);
    return b;
}

/* ------------------------------------------------------------------ host allocations */

typedef enum host_kind { HOST_MALLOC, HOST_PINNED, HOST_ALIGNED } host_kind; /* malloc, host_buf, st_alloc */
typedef struct host_alloc {
    void **ptr;
    size_t bytes;
    host_kind kind;
    const char *what;
} host_alloc;

/* The speculative update's backups: the blocks' p, m, v, with the state in RAM in fp32. */
static int speculates(const st_stream_config *c, const st_stream_plan *p) {
    return !c->external_optimizer && p->overlap_optim && p->clip != ST_STREAM_CLIP_DEFER &&
           c->state_format == ST_OPTIM_STATE_F32;
}

/* Every host buffer the executor allocates besides the host vectors and the optimizer, in
 * one table: st_stream_host_bytes sums it and st_stream_exec_create allocates it. */
static int host_table(const st_stream_config *c, const st_stream_plan *p, st_stream_exec *x, host_alloc *t) {
    const st_arch_layout *y = &c->arch->lay;
    size_t N = (size_t)c->B * c->T, C = (size_t)y->n_embd, V = (size_t)y->vocab_size, n = y->n_params;
    size_t n_off = 0;
    for (int l = 0; l < p->n_layer; l++) n_off += p->act[l] == ST_STREAM_ACT_OFFLOAD;
    int k = 0, fz = hook_base_cfg(c);
#define H(field, nbytes, kind, what) t[k++] = (host_alloc){x ? (void **)&x->field : NULL, (nbytes), kind, what}
    H(h_losses, N * 4, HOST_MALLOC, "the per-row losses");
    H(h_rmax, N * 4, HOST_MALLOC, "the rows' running max");
    H(h_tlogit, N * 4, HOST_MALLOC, "the target logits");
    H(h_rsum, N * 8, HOST_MALLOC, "the rows' sums");
    if (p->grad_dtype == ST_BF16 && !fz) H(host_grads_bf16, n * 2, HOST_PINNED, "the bf16 gradients");
    if (p->vocab_chunk > 0) {
        size_t vc = (size_t)p->vocab_chunk < V ? (size_t)p->vocab_chunk : V, nvc = (V + vc - 1) / vc;
        H(h_enc, N * C * 4, HOST_PINNED, "the embedding's output");
        H(h_dres, N * C * 4, HOST_PINNED, "the residual stream's gradient");
        /* only chunks 0..nvc-3 leave the device (the last two stay in their slots) */
        if (nvc > 2) H(h_logits, N * (nvc - 2) * vc * 4, HOST_PINNED, "the chunks' logits");
    }
    if (c->grad_accum > 1 && !fz) H(host_grads_micro, n * 4, HOST_PINNED, "grad_accum's second fp32 gradient");
    if (n_off) H(host_acts, n_off * st_block_act_floats(c->arch, c->B, c->T) * (p->act_dtype == ST_BF16 ? 2 : 4),
                 HOST_PINNED, "offloaded activations");
    if (speculates(c, p) && !fz) { /* only the blocks are updated speculatively: [b0, post_off), indexed from b0 */
        size_t nb = y->norm_offset - y->block_offset0;
        H(backup_params, nb * 4, HOST_ALIGNED, "speculative-update backups");
        H(backup_m, nb * 4, HOST_ALIGNED, "speculative-update backups");
        H(backup_v, nb * 4, HOST_ALIGNED, "speculative-update backups");
    }
#undef H
    return k;
}

/* The optimizer's moments for the arch's tensors in c->state_format (st_optim_create's layout:
 * fp32 m, v; 8-bit codes per element, each segment padded to whole blocks, an fp32 absmax
 * per block for each). */
static size_t moment_bytes(const st_stream_config *c) {
    const st_arch_layout *y = &c->arch->lay;
    if (c->state_format == ST_OPTIM_STATE_F32) return y->n_params * 8; /* either 8-bit map: the same bytes */
    size_t b = 0;
    for (int i = 0; i < y->n_tensors; i++) {
        size_t blocks = (y->tensors[i].numel + ST_OPTIM_Q8_BLOCK - 1) / ST_OPTIM_Q8_BLOCK;
        b += 2 * blocks * ST_OPTIM_Q8_BLOCK + 2 * blocks * sizeof(float);
    }
    return b;
}

size_t st_stream_host_bytes(const st_stream_config *c, const st_stream_plan *p) {
    host_alloc t[MAX_ALLOCS];
    int k = host_table(c, p, NULL, t);
    int fz = hook_base_cfg(c);
    /* the host vectors: parameters, gradients (fp32); a frozen base: its parameters only */
    size_t b = c->arch->lay.n_params * 4 * (fz ? 1 : 2);
    for (int i = 0; i < k; i++) b += t[i].bytes;
    if (p->vocab_chunk > 0) b += c->arch->ops->bind_bytes(c->arch, c->B, c->T); /* the embedding's host bindings */
    if (!c->external_optimizer && !fz) b += moment_bytes(c);
    return b;
}

/* ------------------------------------------------------------------ create / free */

st_status st_stream_exec_create(st_stream_exec **out, const st_stream_config *c, const st_stream_plan *p, st_backend *dev,
                             st_err *err) {
    *out = NULL;
    st_status s = ST_OK;
    if (!c->arch) return st_errf(err, ST_ERR_INVALID, "stream: no model (st_stream_config.arch)");
    int L = c->arch->lay.n_blocks;
    if (p->n_layer != L)
        return st_errf(err, ST_ERR_INVALID, "stream plan is for %d blocks, the model has %d", p->n_layer, L);
    if ((int)p->clip < ST_STREAM_CLIP_SPECULATE || p->clip > ST_STREAM_CLIP_AUTO)
        return st_errf(err, ST_ERR_INVALID, "stream plan: clip mode %d unknown (speculate, defer or auto)", (int)p->clip);
    if (p->prefetch_depth < 1 || p->prefetch_depth > 64)
        return st_errf(err, ST_ERR_INVALID, "stream plan: prefetch depth %d out of range [1, 64]", p->prefetch_depth);
    if (p->grad_dtype != ST_F32 && p->grad_dtype != ST_BF16)
        return st_errf(err, ST_ERR_UNSUPPORTED,
                       "stream plan: gradient drain dtype %s is not supported (use F32 or BF16)",
                       st_dtype_name(p->grad_dtype));
    if (p->act_dtype != ST_F32 && p->act_dtype != ST_BF16)
        return st_errf(err, ST_ERR_UNSUPPORTED, "stream plan: activation dtype %s is not supported (use F32 or BF16)",
                       st_dtype_name(p->act_dtype));
    if (p->act_dtype == ST_BF16 && (!dev->ops->to_bf16 || !dev->ops->from_bf16))
        return st_errf(err, ST_ERR_UNSUPPORTED, "stream plan: activations in bf16 need the backend's to_bf16 and "
                       "from_bf16; backend '%s' lacks them (act_dtype f32)", dev->ops->name ? dev->ops->name : "?");
    for (int l = 0; l < L; l++)
        if (p->act[l] > ST_STREAM_ACT_OFFLOAD)
            return st_errf(err, ST_ERR_INVALID, "stream plan: block %d has unknown activation policy %d", l, p->act[l]);
    if (p->resident && (st_backend_arena(dev) || !st_backend_host_memory(dev) || p->vocab_chunk > 0 ||
                        p->grad_dtype != ST_F32))
        return st_errf(err, ST_ERR_INVALID, "stream plan: resident weights need a device whose memory is the host's "
                       "(the CPU backend, no budget; this one: %s%s), an fp32 drain and no vocabulary chunks",
                       dev->ops->name ? dev->ops->name : "?", st_backend_arena(dev) ? ", budgeted" : "");
    if (ends_cfg(c) && !c->hook->grad_at)
        return st_errf(err, ST_ERR_INVALID, "stream: a hook that trains the base (frozen 0) says where its gradients go "
                       "(st_linear_hook.grad_at); this one does not");
    if (ends_cfg(c) && p->vocab_chunk > 0 && c->hook->grad_at) {
        /* a chunked vocabulary's embedding backward runs on the host, into the hook's gradients
         * laid out as the arch's (its tensors before the blocks at their offsets from the first) */
        const st_arch_layout *y = &c->arch->lay;
        float *e0 = c->hook->grad_at(c->hook, -1, 0);
        for (int i = 0; e0 && i < y->n_pre_tensors; i++)
            if (c->hook->grad_at(c->hook, -1, y->tensors[i].offset) != e0 + y->tensors[i].offset)
                return st_errf(err, ST_ERR_UNSUPPORTED, "stream: vocab_chunk %d: the hook keeps the gradient of "
                               "tensor '%s' apart from the embedding's first (st_linear_hook.grad_at); a chunked "
                               "vocabulary forms the embedding's gradients on the host in the model's layout: give "
                               "a plan without vocabulary chunks (vocab_chunk 0)", p->vocab_chunk,
                               y->tensors[i].name);
    }
    if (held_cfg(c) && !c->hook->held_host)
        return st_errf(err, ST_ERR_INVALID, "stream: a hook that holds the base's matmul weights (held_block_bytes) "
                       "says where each block's are (st_linear_hook.held_host); this one does not");
    if (hook_base_cfg(c) && (p->resident || !st_backend_host_memory(dev) || c->external_optimizer || c->optim))
        return st_errf(err, ST_ERR_UNSUPPORTED, "stream: a hook's base (st_stream_config.hook: LoRA's, POET-X's) keeps its "
                       "parameters and gradients in host memory: it streams to a device whose memory is the host's "
                       "(the CPU backend; this one: %s), not resident, with no optimizer of the executor's (the "
                       "caller's updates the hook's parameters)", dev->ops->name ? dev->ops->name : "?");
    if (c->B < 1 || c->T < 1 || c->T > c->arch->lay.max_seq)
        return st_errf(err, ST_ERR_INVALID, "stream: batch %d x seq %d (max_seq %d)", c->B, c->T, c->arch->lay.max_seq);
    st_arena *arena = st_backend_arena(dev);
    size_t need = st_stream_device_bytes(c, p);
    if (arena && need > st_arena_budget(arena) - st_arena_used(arena))
        return st_errf(err, ST_ERR_NOMEM,
                       "stream plan needs %zu device bytes, the device has %zu free of a %zu budget: %zu bytes missing "
                       "(fewer prefetched blocks, recompute instead of keep, a smaller batch, or a larger budget)",
                       need, st_arena_budget(arena) - st_arena_used(arena), st_arena_budget(arena),
                       need - (st_arena_budget(arena) - st_arena_used(arena)));

    st_stream_exec *x = calloc(1, sizeof *x);
    if (!x) return st_errf(err, ST_ERR_NOMEM, "stream: out of memory");
    x->cfg = *c;
    x->plan = *p;
    x->dev = dev;
    x->hook_base = hook_base_cfg(c);
    x->ends = ends_cfg(c);
    if (x->hook_base) { /* nothing of the arch's is updated: no optimizer thread, no accumulation */
        x->plan.overlap_optim = 0;
        x->cfg.host_grads = NULL;
        x->cfg.grad_accum = 1;
    }
    x->n_blocks = L;
    x->held = held_cfg(c);
    x->slot_bytes = slot_bytes(c);
    x->held_at = x->held ? held_run_at(c) : 0;
    x->depth = p->prefetch_depth;
    x->n_slots = x->depth + 1;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_job, NULL);
    pthread_cond_init(&x->cv_done, NULL);
#define FAIL(code, ...) do { s = st_errf(err, code, __VA_ARGS__); goto fail; } while (0)
    x->arch = c->arch;
    x->ly = &c->arch->lay;
    const st_arch_layout *y = x->ly;
    size_t N = (size_t)c->B * c->T, C = (size_t)y->n_embd;
    if (p->vocab_chunk > 0) {
        x->vocab_chunk = p->vocab_chunk < y->vocab_size ? p->vocab_chunk : y->vocab_size;
        x->n_vocab_chunks = (y->vocab_size + x->vocab_chunk - 1) / x->vocab_chunk;
    }
    x->n_params = y->n_params;
    x->block_numel = y->block_numel;
    x->block_offset0 = y->block_offset0;
    x->emb_numel = y->emb_numel;
    x->post_offset = y->norm_offset;
    x->post_numel = x->vocab_chunk ? y->norm_numel : x->n_params - y->norm_offset;
    x->resid_numel = N * C;
    x->act_set_floats = st_block_act_floats(c->arch, c->B, c->T);
    x->act16 = p->act_dtype == ST_BF16;
    x->act_set_bytes = x->act_set_floats * (x->act16 ? 2 : 4);
    if ((s = st_blocks_bind(&x->dev_blocks, c->arch, dev, c->B, c->T, err))) goto fail;
    x->dev_blocks->hook = c->hook; /* the device's blocks call it; the host's only embed */
    x->host_be = c->host_be;
    if (x->vocab_chunk) {
        /* the embedding runs on the host: its own CPU backend unless the caller gave one
         * (a budgeted device must not hold the host side's token ids) */
        if (!x->host_be) {
            if ((s = st_backend_cpu_create(&x->own_host_be, 0, err))) goto fail;
            x->host_be = x->own_host_be;
        }
        if ((s = st_blocks_bind(&x->host_blocks, c->arch, x->host_be, c->B, c->T, err))) goto fail;
    }

    if (x->held) { /* the 1-D tensors' runs of the host slab, packed into the slot */
        const st_arch_layout *ly = &c->arch->lay;
        x->held_runs = calloc((size_t)ly->tensors_per_block + 1, sizeof *x->held_runs);
        if (!x->held_runs) FAIL(ST_ERR_NOMEM, "stream: out of memory");
        size_t dst = 0;
        for (int i = 0; i < ly->tensors_per_block; i++) {
            const st_param_info *t = &ly->tensors[ly->n_pre_tensors + i];
            if (t->ndim != 1) continue;
            size_t src = t->offset - ly->block_offset0;
            struct held_run *r = x->n_held_runs ? &x->held_runs[x->n_held_runs - 1] : NULL;
            if (r && r->src + r->n == src) r->n += t->numel; /* adjacent in the host slab too: one copy */
            else x->held_runs[x->n_held_runs++] = (struct held_run){src, dst, t->numel};
            dst += t->numel;
        }
    }
    x->act_slot = calloc((size_t)L, sizeof *x->act_slot);
    x->w_ticket = calloc((size_t)L, sizeof *x->w_ticket);
    x->act_ticket = calloc((size_t)L, sizeof *x->act_ticket);
    x->jobs = calloc((size_t)L + 1, sizeof *x->jobs);
    if (!x->act_slot || !x->w_ticket || !x->act_ticket || !x->jobs) FAIL(ST_ERR_NOMEM, "stream: out of memory");
    for (int l = 0; l < L; l++) {
        if (p->act[l] == ST_STREAM_ACT_KEEP) x->act_slot[l] = x->n_keep++;
        else if (p->act[l] == ST_STREAM_ACT_OFFLOAD) x->act_slot[l] = x->n_off++;
        else x->has_rc = 1;
    }

    /* device tier: the table st_stream_device_bytes sums */
    dev_alloc tab[MAX_ALLOCS];
    int na = alloc_table(c, p, x, tab);
    for (int i = 0; i < na; i++) {
        *tab[i].ptr = dev->ops->alloc(dev, tab[i].bytes);
        if (!*tab[i].ptr) FAIL(ST_ERR_NOMEM, "stream: device allocation %d (%zu bytes) of the plan's %zu failed", i,
                               tab[i].bytes, need);
    }
    x->bf16 = p->grad_dtype == ST_BF16 && !x->hook_base;
    if (x->vocab_chunk) {
        x->vocab_w_ticket = calloc((size_t)x->n_vocab_chunks, sizeof *x->vocab_w_ticket);
        if (!x->vocab_w_ticket) FAIL(ST_ERR_NOMEM, "stream: out of memory");
    }
    if (x->cfg.grad_accum > 1 && x->bf16)
        FAIL(ST_ERR_UNSUPPORTED, "stream: gradient accumulation adds fp32 gradients; drain them as fp32, not bf16");
    /* host buffers: the table st_stream_host_bytes sums */
    host_alloc ht[MAX_ALLOCS];
    int nh = host_table(&x->cfg, p, x, ht);
    for (int i = 0; i < nh; i++) {
        *ht[i].ptr = ht[i].kind == HOST_MALLOC ? malloc(ht[i].bytes)
                   : ht[i].kind == HOST_PINNED ? host_buf(x, ht[i].bytes) : st_alloc(ht[i].bytes);
        if (!*ht[i].ptr)
            FAIL(ST_ERR_NOMEM, "stream: cannot allocate %zu host bytes for %s (the plan's host tier: %zu bytes)%s",
                 ht[i].bytes, ht[i].what, st_stream_host_bytes(c, p),
                 ht[i].ptr == (void **)&x->host_grads_micro ? "; use grad_accum 1 or a larger host" : "");
    }

    /* host tier. The caller's vectors (strata train passes the model's) stay the caller's,
     * page-locked here where the device can (host_register: the CUDA backend's
     * cudaHostRegister), since every weight fetch and gradient drain copies them: from
     * pageable memory a copy is staged by the driver, synchronous device-to-host, overlaps
     * nothing and runs slower than the pinned bandwidth the planner measured. Refused, they
     * stay pageable: correct, slower, and said. */
    x->host_params = c->host_params ? c->host_params : host_buf(x, x->n_params * 4);
    x->host_grads = x->hook_base ? NULL : c->host_grads ? c->host_grads : host_buf(x, x->n_params * 4);
    if (dev->ops->host_register && dev->ops->host_unregister) {
        if (c->host_params && x->host_params) x->host_params_registered = dev->ops->host_register(dev, x->host_params, x->n_params * 4) == 0;
        if (x->cfg.host_grads && x->host_grads) x->host_grads_registered = dev->ops->host_register(dev, x->host_grads, x->n_params * 4) == 0;
        if ((c->host_params && !x->host_params_registered) || (x->cfg.host_grads && !x->host_grads_registered))
            st_log(1, "stream: the device could not page-lock the caller's %s (%zu bytes each): their copies stay "
                   "pageable, slower than the planner's pinned bandwidth and not overlapped (raise the memlock "
                   "limit, ulimit -l, or leave the host vectors to the executor)\n",
                   c->host_params && !x->host_params_registered ? (x->cfg.host_grads && !x->host_grads_registered ? "parameters and "
                   "gradients" : "parameters") : "gradients", x->n_params * 4);
    }
    if (!x->host_params || (!x->host_grads && !x->hook_base)) FAIL(ST_ERR_NOMEM, "stream: cannot allocate %zu host bytes of parameters and gradients",
                               x->n_params * 8);
    if (p->resident) { /* the device's weights are the host's (the gradients: stream_bind_grads) */
        x->d_pre_w = x->host_params;
        x->d_post_w = x->host_params + x->post_offset;
        x->d_w = x->host_params + x->block_offset0;
        stream_bind_grads(x, x->host_grads);
    }
    x->segs = calloc((size_t)y->n_tensors, sizeof *x->segs);
    if (!x->segs) FAIL(ST_ERR_NOMEM, "stream: out of memory");
    st_params_decay_segments(y->tensors, y->n_tensors, c->weight_decay, x->segs);
    x->external = c->external_optimizer;
    if (x->hook_base) {
        /* no optimizer: the hook's parameters are the caller's to update */
    } else if (!x->external && c->optim) {
        if (st_optim_format(c->optim) != c->state_format)
            FAIL(ST_ERR_INVALID, "stream: the caller's optimizer keeps %s moments, the configuration says %s",
                 st_optim_format(c->optim) == ST_OPTIM_STATE_F32 ? "fp32" : "8-bit",
                 c->state_format == ST_OPTIM_STATE_F32 ? "fp32" : "8-bit");
        if (st_optim_segment_count(c->optim) != y->n_tensors || st_optim_numel(c->optim) != y->n_params)
            FAIL(ST_ERR_INVALID, "stream: the caller's optimizer has %d segments over %zu parameters; the executor "
                 "updates the model's %d tensors (%zu parameters), one segment each (st_params_decay_segments)",
                 st_optim_segment_count(c->optim), st_optim_numel(c->optim), y->n_tensors, y->n_params);
        x->opt = c->optim;
    } else if (!x->external && (s = st_optim_create(&x->opt, x->segs, y->n_tensors, c->state_format, err))) {
        goto fail;
    }
    x->nchunks = (x->n_params + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    x->chunk_part = calloc(x->nchunks, sizeof *x->chunk_part);
    x->chunk_done = calloc(x->nchunks, 1);
    if (!x->chunk_part || !x->chunk_done) FAIL(ST_ERR_NOMEM, "stream: out of memory");

    /* engines */
    x->tbe.inner = dev;
    x->tbe.ops = *dev->ops;
    x->tbe.ops.copy_to_device = traced_h2d;
    x->tbe.ops.copy_to_host = traced_d2h;
    x->tbe.base.ops = &x->tbe.ops;
    x->tbe.base.ctx = dev->ctx;
    if ((s = st_copy_engine_create(&x->ce, &x->tbe.base, err))) goto fail;
    st_copy_engine_observe(x->ce, &(st_copy_observer){st_prof_trace_active, traced_async_done, x});
    if (p->overlap_optim) {
        if (pthread_create(&x->worker, NULL, stream_opt_worker, x) != 0)
            FAIL(ST_ERR_NOMEM, "stream: cannot start the optimizer thread");
        x->th_started = 1;
    }
#undef FAIL
    *out = x;
    return ST_OK;
fail:
    st_stream_exec_free(x);
    return s;
}

void st_stream_exec_free(st_stream_exec *x) {
    if (!x) return;
    if (x->th_started) {
        pthread_mutex_lock(&x->mu);
        x->stop = 1;
        pthread_cond_broadcast(&x->cv_job);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->worker, NULL);
    }
    st_copy_engine_destroy(x->ce); /* waits for outstanding copies before buffers go */
    st_backend *dev = x->dev;
    dev_alloc tab[MAX_ALLOCS];
    int na = alloc_table(&x->cfg, &x->plan, x, tab);
    for (int i = 0; i < na; i++)
        if (*tab[i].ptr) dev->ops->dealloc(dev, *tab[i].ptr);
    st_blocks_free(x->dev_blocks);
    st_blocks_free(x->host_blocks);
    st_backend_free(x->own_host_be);
    host_alloc ht[MAX_ALLOCS];
    int nh = host_table(&x->cfg, &x->plan, x, ht);
    for (int i = 0; i < nh; i++) {
        if (ht[i].kind == HOST_MALLOC) free(*ht[i].ptr);
        else if (ht[i].kind == HOST_PINNED) host_buf_free(x, *ht[i].ptr);
        else st_free(*ht[i].ptr);
    }
    if (x->host_params != x->cfg.host_params) host_buf_free(x, x->host_params);
    else if (x->host_params_registered) dev->ops->host_unregister(dev, x->host_params);
    if (x->host_grads != x->cfg.host_grads) host_buf_free(x, x->host_grads);
    else if (x->host_grads_registered) dev->ops->host_unregister(dev, x->host_grads);
    stream_w16_free(x);
    free(x->vocab_w_ticket);
    free(x->gspans);
    if (x->opt != x->cfg.optim) st_optim_free(x->opt);
    free(x->segs);
    free(x->held_runs);
    free(x->act_slot);
    free(x->w_ticket);
    free(x->act_ticket);
    free(x->jobs);
    free(x->chunk_part);
    free(x->chunk_done);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv_job);
    pthread_cond_destroy(&x->cv_done);
    free(x);
}

float *st_stream_params(st_stream_exec *x) { return x->host_params; }
float *st_stream_grads(st_stream_exec *x) { return x->host_grads; }
const st_arch *st_stream_arch(const st_stream_exec *x) { return x->arch; }
st_optim *st_stream_optim(st_stream_exec *x) { return x->opt; }

st_status st_stream_attach_store(st_stream_exec *x, st_store *store, const void *blob, size_t blob_bytes, st_err *err) {
    if (!x->external)
        return st_errf(err, ST_ERR_INVALID, "stream: a state store needs st_stream_config.external_optimizer = 1");
    if (st_store_numel(store) != x->n_params)
        return st_errf(err, ST_ERR_SHAPE, "stream: the state store holds %zu parameters, the model %zu",
                       st_store_numel(store), x->n_params);
    x->store = store;
    x->store_blob = blob;
    x->store_blob_bytes = blob_bytes;
    return ST_OK;
}

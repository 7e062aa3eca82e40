/* plan_cost.c - the cost model of one streamed step (see plan.h for the windows), and
 * st_plan_predict, its closed form for a given plan. */
#include <math.h>
#include <string.h>

#include <stdlib.h>

#include "plan/plan_cost.h"
#include "strata/store.h"

static int pos(double v) { return isfinite(v) && v > 0; }

st_status plan_cost_init(plan_cost *c, const st_arch *a, int B, int T, const st_plan_profile *hw, st_err *err) {
    memset(c, 0, sizeof *c);
    if (!a || !hw) return st_errf(err, ST_ERR_INVALID, "plan: no model or no hardware profile");
    if (hw->version != ST_PLAN_PROFILE_VERSION)
        return st_errf(err, ST_ERR_FORMAT, "plan: hardware profile version %d, this strata reads %d (measure it "
                       "again: strata plan --save_profile FILE)", hw->version, ST_PLAN_PROFILE_VERSION);
    if (!pos(hw->sgemm_flops) || !pos(hw->h2d_bytes_per_s) || !pos(hw->d2h_bytes_per_s) ||
        !pos(hw->mem_bytes_per_s) || !(isfinite(hw->optim_ns_per_param) && hw->optim_ns_per_param >= 0) ||
        !pos(hw->block_fwd_flops) || !pos(hw->block_bwd_flops) || !pos(hw->head_flops) ||
        !(isfinite(hw->host_work_slowdown) && hw->host_work_slowdown >= 0))
        return st_errf(err, ST_ERR_INVALID, "plan: the hardware profile has a missing, zero or non-finite figure "
                       "(sgemm_flops %g, h2d %g, d2h %g, mem %g B/s, optimizer %g ns/param, block %g/%g FLOP/s, "
                       "head %g FLOP/s)", hw->sgemm_flops, hw->h2d_bytes_per_s, hw->d2h_bytes_per_s,
                       hw->mem_bytes_per_s, hw->optim_ns_per_param, hw->block_fwd_flops, hw->block_bwd_flops,
                       hw->head_flops);
    if (B < 1 || T < 1 || T > a->lay.max_seq)
        return st_errf(err, ST_ERR_INVALID, "plan: batch %d x seq %d (max_seq %d)", B, T, a->lay.max_seq);
    const st_arch_layout *y = &a->lay;
    double N = (double)B * T;
    c->a = a;
    c->L = y->n_blocks;
    c->B = B;
    c->T = T;
    c->mem_bps = hw->mem_bytes_per_s;
    c->h2d = hw->h2d_bytes_per_s;
    c->d2h = hw->d2h_bytes_per_s;
    /* the block's and the classifier's compute: their measured times at this shape when the
     * profile has them, else the arch's FLOPs at the reference block's measured rates (the
     * real ops: attention, norms and activations around the matmuls, not sgemm's peak) */
    const st_plan_shape_time *st = st_plan_profile_shape(hw, a, B, T);
    double blk = a->ops->block_flops_per_token(a, T) * N; /* forward + backward */
    c->fwd = st ? st->block_fwd_s : blk / 3.0 / hw->block_fwd_flops;
    c->bwd = st ? st->block_bwd_s : blk * 2.0 / 3.0 / hw->block_bwd_flops;
    c->measured_shape = st != NULL;
    c->slow = hw->host_work_slowdown;
    double wb = (double)y->block_numel * 4.0, sb = (double)st_block_act_floats(a, B, T) * 4.0;
    c->tw = wb / c->h2d;
    c->tg = wb / c->d2h;
    c->ta_out = sb / c->d2h;
    c->ta_in = sb / c->h2d;
    /* the update, plus the speculative backup of parameters and both moments (12 bytes
     * read and written per parameter) */
    double per_param = hw->optim_ns_per_param * 1e-9 + 24.0 / c->mem_bps;
    c->opt_block = (double)y->block_numel * per_param;
    c->opt_nonblock = (double)(y->n_params - (size_t)c->L * y->block_numel) * hw->optim_ns_per_param * 1e-9;
    c->head_compute = st ? st->head_s_per_chunk + st->head_s_per_row * y->vocab_size
                         : a->ops->head_flops_per_token(a) * N / hw->head_flops;
    c->head_chunk = st ? st->head_s_per_chunk : 0;
    return ST_OK;
}

void plan_cost_frozen(plan_cost *c, int frozen_base, size_t held_block_bytes) {
    if (!frozen_base) return;
    const st_arch_layout *y = &c->a->lay;
    double mm = 0, flat = 0; /* one block's matmul weights and 1-D tensors, in elements */
    for (int i = 0; i < y->tensors_per_block; i++) {
        const st_param_info *t = &y->tensors[y->n_pre_tensors + i];
        *(t->ndim == 2 ? &mm : &flat) += (double)t->numel;
    }
    double N = (double)c->B * c->T;
    double bwd_flops = c->a->ops->block_flops_per_token(c->a, c->T) * N * 2.0 / 3.0, dw = 2.0 * N * mm;
    double share = bwd_flops > 0 ? dw / bwd_flops : 0;
    if (share > 0.5) share = 0.5; /* dW is one of the backward's two matmuls a weight */
    /* LoRA's adapters are small beside it; POET-X's rotations of x and of the gradient, and the
     * gradients of its packed Q, are not: its backward is taken as measured (gpt2-124m B2 T256
     * int8 streamed: the whole step predicted 2.08 s with the share taken off, 3.02 s measured) */
    if (frozen_base == 1) c->bwd *= 1.0 - share;
    if (held_block_bytes > 0) c->tw = ((double)held_block_bytes + 4.0 * flat) / c->h2d;
    c->tg = 0;
    c->opt_block = 0;
    if (frozen_base == 1) { /* LoRA: the ends frozen too, no gradient of them, no optimizer over them */
        c->frozen_ends = 1;
        c->opt_nonblock = 0;
    }
}

void plan_cost_act(plan_cost *c, st_dtype dt) {
    if (dt != ST_BF16) return;
    double conv = 6.0 * (double)st_block_act_floats(c->a, c->B, c->T) / c->mem_bps;
    c->ta_out /= 2.0;
    c->ta_in /= 2.0;
    c->fwd += conv;
    c->bwd += conv;
}

void plan_cost_const(const plan_cost *c, int vchunk, double *compute_s, double *exposed_s, double *optim_s) {
    const st_arch_layout *y = &c->a->lay;
    double N = (double)c->B * c->T, C = y->n_embd, V = y->vocab_size;
    double post = (double)(y->n_params - y->norm_offset) * 4.0, norm = (double)y->norm_numel * 4.0;
    double exposed = c->tw + c->tg; /* block 0: its first fetch, its last drain */
    if (vchunk <= 0) {
        /* the embedding and head live on the device: sent after each update, gradients drained at the
         * end (frozen ends: sent once, none drained) */
        double nb = (double)y->emb_numel * 4.0 + post;
        if (!c->frozen_ends) exposed += nb / c->h2d + nb / c->d2h;
        *compute_s = c->head_compute;
    } else {
        double vc = vchunk < V ? vchunk : V, nvc = ceil(V / vc);
        double head = c->head_compute + (nvc - 1) * c->head_chunk;
        /* two passes over the chunks: weights in each (the last two stay), logits out and
         * back, each chunk's head gradient drained (frozen ends: none) */
        double h2d = ((2 * nvc - (nvc < 2 ? nvc : 2)) * vc * C * 4.0 + (nvc > 2 ? nvc - 2 : 0) * N * vc * 4.0) / c->h2d;
        double d2h = (nvc * N * vc * 4.0 + (c->frozen_ends ? 0 : nvc * vc * C * 4.0)) / c->d2h;
        double over = h2d + d2h - head;
        exposed += over > 0 ? over : 0;
        /* the embedding on the host: its output crosses, the residual gradient returns;
         * the norm's weights and gradient cross (frozen ends: no gradient returns) */
        exposed += N * C * 4.0 / c->h2d + norm / c->h2d + (c->frozen_ends ? 0 : N * C * 4.0 / c->d2h + norm / c->d2h);
        /* the gather and the scatter-add on the host (frozen ends: the gather) */
        exposed += (c->frozen_ends ? 1.0 : 2.0) * N * C * 4.0 / c->mem_bps;
        *compute_s = head;
    }
    *exposed_s = exposed;
    *optim_s = c->opt_nonblock;
}

double plan_cost_host_work(const plan_cost *c, int vchunk, int d) {
    if (c->slow <= 0) return 0;
    const st_arch_layout *y = &c->a->lay;
    int L = c->L;
    double N = (double)c->B * c->T, C = y->n_embd, V = y->vocab_size;
    double post = (double)(y->n_params - y->norm_offset) * 4.0, norm = (double)y->norm_numel * 4.0;
    int fetches = 2 * L - d - 1; /* the executor's count (stream.h) */
    if (fetches < L) fetches = L;
    double t = fetches * c->tw + L * c->tg + L * c->opt_block + c->opt_nonblock;
    if (vchunk <= 0) {
        double nb = (double)y->emb_numel * 4.0 + post;
        if (!c->frozen_ends) t += nb / c->h2d + nb / c->d2h;
    } else {
        double vc = vchunk < V ? vchunk : V, nvc = ceil(V / vc);
        t += ((2 * nvc - (nvc < 2 ? nvc : 2)) * vc * C * 4.0 + (nvc > 2 ? nvc - 2 : 0) * N * vc * 4.0) / c->h2d;
        t += (nvc * N * vc * 4.0 + (c->frozen_ends ? 0 : nvc * vc * C * 4.0)) / c->d2h;
        t += N * C * 4.0 / c->h2d + norm / c->h2d + (c->frozen_ends ? 0 : N * C * 4.0 / c->d2h + norm / c->d2h);
    }
    return c->slow * t;
}

double plan_cost_wfetch_fwd(const plan_cost *c, int d, int w) {
    double t = 0;
    for (int j = w + 1; j <= w + d && j < c->L; j++) { /* fetches that may run during window w */
        int first = j - d > 0 ? j - d : 0;
        t += c->tw / (double)(j - first);
    }
    return t;
}

double plan_cost_wfetch_bwd(const plan_cost *c, int d, int w) {
    double t = 0;
    for (int j = w - d; j <= w - 1; j++) /* block j's fetch spreads over windows j+1 .. j+d */
        if (j >= 0 && j <= c->L - d - 2) t += c->tw / (double)d;
    return t;
}

/* The store's figures of a disk-state step (st_plan_disk_cost), NULL for the state in RAM. */
static st_status predict(const plan_cost *cp, const st_arch *a, int B, int T, const st_stream_plan *p,
                         st_plan_disk_cost *dk, int beside, double cpu_slow, st_plan_prediction *pred, st_err *err) {
    plan_cost c = *cp;
    plan_cost_act(&c, p->act_dtype); /* the sets' dtype: their copies and conversions */
    int L = c.L, d = p->prefetch_depth;
    if (p->n_layer != L) return st_errf(err, ST_ERR_INVALID, "plan: the plan is for %d blocks, the model has %d", p->n_layer, L);
    if (d < 1) return st_errf(err, ST_ERR_INVALID, "plan: prefetch depth %d (>= 1)", d);
    memset(pred, 0, sizeof *pred);
    /* which offloaded blocks move (all but the last two) and which recompute block reruns (all but the last) */
    unsigned char moves[ST_STREAM_MAX_LAYERS], reruns[ST_STREAM_MAX_LAYERS];
    int seen_off = 0, seen_rc = 0;
    for (int l = L - 1; l >= 0; l--) {
        moves[l] = p->act[l] == ST_STREAM_ACT_OFFLOAD && seen_off++ >= 2;
        reruns[l] = p->act[l] == ST_STREAM_ACT_RECOMPUTE && seen_rc++ >= 1;
        pred->n_keep += p->act[l] == ST_STREAM_ACT_KEEP;
        pred->n_offload += p->act[l] == ST_STREAM_ACT_OFFLOAD;
        pred->n_recompute += p->act[l] == ST_STREAM_ACT_RECOMPUTE;
    }
    double exposed = 0, bwd_below = 0, rec = 0;
    for (int w = 0; w < L; w++) {
        double xf = plan_cost_wfetch_fwd(&c, d, w) + (w > 0 && moves[w - 1] ? c.ta_out : 0);
        double over = xf - c.fwd;
        exposed += over > 0 ? over : 0;
        double cw = c.bwd + (reruns[w] ? c.fwd : 0);
        double xb = plan_cost_wfetch_bwd(&c, d, w) + (w + 1 < L ? c.tg : 0) + (w > 0 && moves[w - 1] ? c.ta_in : 0);
        over = xb - cw;
        exposed += over > 0 ? over : 0;
        rec += reruns[w] ? c.fwd : 0;
        if (w < L - 1) bwd_below += cw;
    }
    double head, cexp, copt;
    plan_cost_const(&c, p->vocab_chunk, &head, &cexp, &copt);
    double opt = (double)L * c.opt_block - bwd_below;
    if (opt < c.opt_block) opt = c.opt_block;
    pred->block_fwd_s = c.fwd;
    pred->block_bwd_s = c.bwd;
    pred->compute_s = (double)L * (c.fwd + c.bwd) + head;
    pred->recompute_s = rec;
    pred->transfer_exposed_s = exposed + cexp;
    pred->optim_exposed_s = opt + copt;
    int n_moves = 0;
    for (int l = 0; l < L; l++) n_moves += moves[l];
    pred->host_work_s = plan_cost_host_work(&c, p->vocab_chunk, d) + c.slow * n_moves * (c.ta_out + c.ta_in);
    if (dk) {
        /* the store instead of the in-RAM optimizer: hidden behind the backward only beside it */
        pred->host_work_s -= c.slow * ((double)L * c.opt_block + c.opt_nonblock);
        if (pred->host_work_s < 0) pred->host_work_s = 0;
        /* beside: the store runs from the first gradient to its last write while the backward
         * (the blocks' backward and recomputed forwards), stretched by the store's own CPU work
         * on the compute's cores, runs beside it: the stretched backward is the window it hides in */
        double cpu_beside = beside ? cpu_slow * dk->cpu_s : 0;
        double window = (double)L * c.bwd + rec + cpu_beside;
        dk->hidden_s = beside ? (dk->store_s < window ? dk->store_s : window) : 0;
        pred->optim_exposed_s = dk->store_s - dk->hidden_s;
        pred->host_work_s += cpu_beside;
    }
    pred->step_s = pred->compute_s + pred->recompute_s + pred->transfer_exposed_s + pred->optim_exposed_s +
                   pred->host_work_s;
    st_stream_config sc = {.arch = a, .B = B, .T = T};
    pred->device_bytes = st_stream_device_bytes(&sc, p);
    pred->optimal = 1;
    return ST_OK;
}

st_status st_plan_predict(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                       st_plan_prediction *pred, st_err *err) {
    return st_plan_predict_frozen(a, B, T, hw, p, 0, 0, pred, err);
}

st_status st_plan_predict_frozen(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                                 int frozen_base, size_t held_block_bytes, st_plan_prediction *pred, st_err *err) {
    plan_cost c;
    st_status s = plan_cost_init(&c, a, B, T, hw, err);
    if (s) return s;
    plan_cost_frozen(&c, frozen_base, held_block_bytes);
    return predict(&c, a, B, T, p, NULL, 0, 0, pred, err);
}

/* The executor's order of the store's subgroups beside the backward (stream_step.c's
 * store_order, ctx the blocks' span [block_offset0, norm_offset)), and a wait that is only
 * looked at for being set. */
static double grad_order(void *ctx, size_t first, size_t end) {
    const size_t *span = ctx; /* the executor's order (stream_step.c) */
    return st_stream_store_order(first, end, span[0], span[1]);
}
static st_status never_wait(void *ctx, size_t first, size_t n, st_err *err) {
    (void)ctx, (void)first, (void)n, (void)err;
    return ST_OK;
}

st_status st_plan_predict_disk(const st_arch *a, int B, int T, const st_plan_profile *hw, const st_stream_plan *p,
                               const st_plan_disk *disk, st_plan_prediction *pred, st_plan_disk_cost *dc,
                               st_err *err) {
    plan_cost c;
    st_status s = plan_cost_init(&c, a, B, T, hw, err);
    if (s) return s;
    if (!disk || disk->n_paths < 1 || disk->n_paths > ST_STORE_MAX_PATHS || !disk->paths || !disk->mixed_bytes_per_s)
        return st_errf(err, ST_ERR_INVALID, "plan: the disk state needs 1 to %d paths and each one's mixed bandwidth",
                       ST_STORE_MAX_PATHS);
    if (disk->fmt != ST_OPTIM_STATE_F32 && disk->fmt != ST_OPTIM_STATE_8BIT && disk->fmt != ST_OPTIM_STATE_8BIT_FP)
        return st_errf(err, ST_ERR_INVALID, "plan: unknown state format %d", disk->fmt);
    if (!(isfinite(disk->optim_ns_per_param) && disk->optim_ns_per_param >= 0))
        return st_errf(err, ST_ERR_INVALID, "plan: the disk state's optimizer figure %g ns/param", disk->optim_ns_per_param);
    for (int i = 0; i < disk->n_paths; i++)
        if (!pos(disk->mixed_bytes_per_s[i]))
            return st_errf(err, ST_ERR_INVALID, "plan: disk path '%s' has mixed bandwidth %g bytes/s; probe it "
                           "(strata probe --path DIR)", disk->paths[i] ? disk->paths[i] : "(null)",
                           disk->mixed_bytes_per_s[i]);
    const st_arch_layout *y = &a->lay;
    st_optim_segment *segs = calloc((size_t)y->n_tensors, sizeof *segs);
    if (!segs) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_params_decay_segments(y->tensors, y->n_tensors, disk->weight_decay, segs);
    st_store_config sc = {.paths = disk->paths, .n_paths = disk->n_paths, .path_weight = disk->path_weight,
                          .segs = segs, .n_segs = y->n_tensors, .fmt = (st_optim_state_format)disk->fmt,
                          .host_budget = disk->host_budget};
    /* the order the store's step takes: beside the backward the gradients' (st_stream_exec's
     * store_order: the blocks last to first, then the rest), read ahead with every buffer;
     * after it, alternating up and down */
    size_t span[2] = {y->block_offset0, y->norm_offset};
    st_store_step_args beside_args = {.wait = never_wait, .order_key = grad_order, .ctx = span};
    st_store_layout lay;
    s = st_store_plan_step(&sc, disk->beside ? &beside_args : NULL, &lay, err);
    free(segs);
    if (s) return s;
    st_plan_disk_cost k;
    memset(&k, 0, sizeof k);
    for (int i = 0; i < disk->n_paths; i++) {
        /* the cache's hits are not read (the mean of a step up and a step down: whole 4 KiB
         * regions, so exact); every region is written */
        uint64_t rd = (lay.read_bytes[0][i] + lay.read_bytes[1][i]) / 2;
        double t = (double)(rd + lay.write_bytes[i]) / disk->mixed_bytes_per_s[i];
        k.io_s = t > k.io_s ? t : k.io_s;
        k.disk_bytes += lay.path_bytes[i];
        k.read_bytes += rd;
        k.write_bytes += lay.write_bytes[i];
    }
    k.state_budget = disk->host_budget;
    k.n_subgroups = lay.n_subgroups;
    k.n_buffers = lay.n_buffers;
    k.cache_hits = (lay.hits[0] + lay.hits[1]) / 2.0;
    k.region_bytes = lay.region_bytes;
    double n = (double)y->n_params;
    double crc = disk->crc_bytes_per_s > 0 ? disk->crc_bytes_per_s : c.mem_bps;
    k.cpu_s = n * disk->optim_ns_per_param * 1e-9 + ((double)k.read_bytes + (double)k.write_bytes) / crc + 4.0 * n / c.mem_bps;
    k.store_s = k.io_s > k.cpu_s ? k.io_s : k.cpu_s;
    k.store_host_bytes = lay.host_bytes;
    k.host_bytes = st_plan_host_bytes_disk(a, B, T, p) + (size_t)lay.host_bytes;
    if ((s = predict(&c, a, B, T, p, &k, disk->beside != 0, disk->cpu_slowdown > 0 ? disk->cpu_slowdown : c.slow, pred, err)))
        return s;
    if (dc) *dc = k;
    return ST_OK;
}

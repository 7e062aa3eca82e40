/* run_poetx.c - strata train's method poetx: every matmul weight of the blocks trained as
 * R W0 P (strata/poetx.h) over the base model (a preset, randomly initialised from the seed, or
 * init_from's weights), the optimizer over the base's other tensors and the packed Q's (Adam on
 * Q without weight decay: the Q's have the bias role), a merge every poetx_merge_every steps,
 * checkpoints holding W0 and the permutations besides the trained tensors (the model's save).
 * Q's segments are the optimizer's second learning-rate class (poetx_lr); after each merge the
 * clip threshold may ramp back to grad_clip (poetx_clip_ramp). In memory (fp32 or 8-bit
 * optimizer state) or with the trained vector's state on disk (state_paths): W0 in its own files
 * beside the store, one per merge (run_poetx_open_disk); in one process or under ranks (each rank's
 * store with its own W0 files, the same bits on every rank). Or with layer streaming
 * (device_budget, one process, the cpu device): the base's blocks, W0 in them (as held), stream
 * through the budget, the hook runs R W0 P on them and the optimizer over the POET-X vector is
 * the one in memory (strata/step.h). */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "run/run_internal.h"
#include "run/run_poetx_internal.h"
#include "strata/block.h"
#include "strata/poetx.h"

static int is_poetx(const st_train_config *c) { return st_train_config_method_of(c) == ST_TRAIN_METHOD_POETX; }

static st_poetx_config poetx_config(const st_train_config *c) {
    int fd = st_train_config_frozen_dtype(c); /* checked by st_train_config_method */
    return (st_poetx_config){.block = c->poetx_block, .terms = c->poetx_terms,
                             .recompute = c->poetx_recompute > 0, /* auto: kept, until chosen */
                             .frozen_dtype = fd < 0 ? ST_FROZEN_F32 : (st_frozen_dtype)fd};
}

/* poetx_init as the run uses it: auto is orthogonal from scratch and model where W0 is given
 * (init_from) or on a resume (a run that recorded auto predates the key: its W0 was the
 * model's); a recorded config (was 1) says auto only where it predates the key. */
static const char *init_of(const st_train_config *c, int was) {
    if (strcmp(c->poetx_init, "auto")) return c->poetx_init;
    return was || c->init_from[0] || c->resume[0] ? "model" : "orthogonal";
}

st_status run_poetx_resolve_init(st_train_config *c, st_err *err) {
    if (!is_poetx(c) || strcmp(c->poetx_init, "auto")) return ST_OK;
    if (c->resume[0]) { /* left out on a resume: the run's own (its config.json, if the resume did not load it) */
        char path[2200];
        st_train_config *was = NULL;
        st_status s = run_resumed_config(c, &was, path, sizeof path, err);
        if (s) return s;
        if (was) {
            snprintf(c->poetx_init, sizeof c->poetx_init, "%s", init_of(was, 1));
            c->poetx_init_gain = was->poetx_init_gain;
            free(was);
            return ST_OK;
        }
    }
    snprintf(c->poetx_init, sizeof c->poetx_init, "%s", init_of(c, 0));
    return ST_OK;
}

/* A resume continues the run's own numerics: the block size and terms (the method itself:
 * run_lora_check), Q's learning rate, the clip ramp and the moments' restart at a merge,
 * W0's precision (frozen_dtype) and its initialisation (poetx_init: the disk state's resume before
 * the first merge draws W0 again). */
static st_status check_resume(const st_train_config *c, st_err *err) {
    char path[2200];
    st_train_config *was = NULL;
    st_status s = run_resumed_config(c, &was, path, sizeof path, err);
    if (was && is_poetx(was)) {
        char then[64] = "", now[64] = "";
        const char *key = NULL;
        if (was->poetx_block != c->poetx_block) {
            key = "poetx_block";
            snprintf(then, sizeof then, "%d", was->poetx_block), snprintf(now, sizeof now, "%d", c->poetx_block);
        } else if (was->poetx_terms != c->poetx_terms) {
            key = "poetx_terms";
            snprintf(then, sizeof then, "%d", was->poetx_terms), snprintf(now, sizeof now, "%d", c->poetx_terms);
        } else if (was->poetx_lr != c->poetx_lr) {
            key = "poetx_lr";
            snprintf(then, sizeof then, "%.17g", was->poetx_lr), snprintf(now, sizeof now, "%.17g", c->poetx_lr);
        } else if (was->poetx_clip_ramp != c->poetx_clip_ramp) {
            key = "poetx_clip_ramp";
            snprintf(then, sizeof then, "%d", was->poetx_clip_ramp), snprintf(now, sizeof now, "%d", c->poetx_clip_ramp);
        } else if (was->poetx_clip_ramp && was->poetx_clip_start != c->poetx_clip_start) {
            key = "poetx_clip_start";
            snprintf(then, sizeof then, "%.17g", was->poetx_clip_start);
            snprintf(now, sizeof now, "%.17g", c->poetx_clip_start);
        } else if (was->poetx_adam_restart != c->poetx_adam_restart) {
            key = "poetx_adam_restart";
            snprintf(then, sizeof then, "%d", was->poetx_adam_restart);
            snprintf(now, sizeof now, "%d", c->poetx_adam_restart);
        } else if (strcmp(was->frozen_dtype, c->frozen_dtype)) {
            key = "frozen_dtype";
            snprintf(then, sizeof then, "%s", was->frozen_dtype), snprintf(now, sizeof now, "%s", c->frozen_dtype);
        } else if (c->state_paths[0] && was->poetx_merge_every != c->poetx_merge_every) {
            /* the store's W0 files are the merges of the run's interval */
            key = "poetx_merge_every";
            snprintf(then, sizeof then, "%d", was->poetx_merge_every);
            snprintf(now, sizeof now, "%d", c->poetx_merge_every);
        } else if (strcmp(c->poetx_init, "auto") && strcmp(init_of(was, 1), c->poetx_init)) {
            /* given (auto: the run's own, run_poetx_resolve_init): W0 as the run drew it */
            key = "poetx_init";
            snprintf(then, sizeof then, "%s", init_of(was, 1)), snprintf(now, sizeof now, "%s", c->poetx_init);
        } else if (!strcmp(c->poetx_init, "orthogonal") && was->poetx_init_gain != c->poetx_init_gain) {
            key = "poetx_init_gain";
            snprintf(then, sizeof then, "%.17g", was->poetx_init_gain);
            snprintf(now, sizeof now, "%.17g", c->poetx_init_gain);
        }
        if (key)
            s = st_errf(err, ST_ERR_INVALID, "key '%s': the run in %s was trained with %s %s, this resume gives %s; "
                        "a resume continues it as it was: leave %s out, or start a new run", key, c->resume, key,
                        then, now, key);
    }
    free(was);
    return s;
}

/* The keys' values a run of method poetx cannot use, each named. */
static st_status check_keys(const st_train_config *c, st_err *err) {
    if (c->poetx_lr < 0 && c->poetx_lr != -1)
        return st_errf(err, ST_ERR_INVALID, "key 'poetx_lr': %g is not a learning rate; give one >= 0, or -1 (lr's)",
                       c->poetx_lr);
    if (c->poetx_clip_ramp > 0 && !(c->grad_clip > 0))
        return st_errf(err, ST_ERR_INVALID, "key 'poetx_clip_ramp': the ramp rises back to grad_clip, which is %g "
                       "(no clipping); give grad_clip > 0, or poetx_clip_ramp 0", c->grad_clip);
    if (strcmp(c->poetx_init, "auto") && strcmp(c->poetx_init, "model") && strcmp(c->poetx_init, "orthogonal"))
        return st_errf(err, ST_ERR_INVALID, "key 'poetx_init': '%s' is not auto, model or orthogonal", c->poetx_init);
    if (!strcmp(c->poetx_init, "orthogonal") && c->init_from[0])
        return st_errf(err, ST_ERR_INVALID, "key 'poetx_init': orthogonal replaces the initialisation of a run from "
                       "scratch, and init_from %s gives W0 itself; leave poetx_init out (or init_from, to train from "
                       "scratch)", c->init_from);
    if (c->state_paths[0] && c->steps > 0xffffffffL) /* run_poetx_disk's blob: the merge step in 32 bits */
        return st_errf(err, ST_ERR_INVALID, "key 'steps': %ld; method poetx with state_paths trains at most %lu "
                       "steps", c->steps, 0xfffffffful);
    if (c->poetx_clip_ramp > c->poetx_merge_every)
        return st_errf(err, ST_ERR_INVALID, "key 'poetx_clip_ramp': %d steps is longer than the %d between merges "
                       "(poetx_merge_every); give at most %d", c->poetx_clip_ramp, c->poetx_merge_every,
                       c->poetx_merge_every);
    return ST_OK;
}

/* Another method given POET-X's optimizer keys: refused naming the key (they would be
 * recorded in config.json and do nothing). */
static st_status check_not_poetx(const st_train_config *c, st_err *err) {
    st_train_config *d = malloc(sizeof *d); /* large: not on the stack */
    if (!d) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_train_config_defaults(d);
    const char *key = c->poetx_lr != d->poetx_lr                   ? "poetx_lr"
                      : c->poetx_clip_ramp != d->poetx_clip_ramp   ? "poetx_clip_ramp"
                      : c->poetx_clip_start != d->poetx_clip_start ? "poetx_clip_start"
                      : c->poetx_adam_restart != d->poetx_adam_restart ? "poetx_adam_restart"
                      : strcmp(c->poetx_init, d->poetx_init)           ? "poetx_init"
                      : c->poetx_init_gain != d->poetx_init_gain       ? "poetx_init_gain"
                                                                       : NULL;
    free(d);
    if (!key) return ST_OK;
    return st_errf(err, ST_ERR_INVALID, "key '%s' is method poetx's and this run's method is %s: leave %s out, or "
                   "give --method poetx", key, c->method, key);
}

st_status run_poetx_check(const st_train_config *c, st_err *err) {
    if (!is_poetx(c)) return check_not_poetx(c, err);
    st_status s = check_keys(c, err);
    if (s || (s = check_resume(c, err))) return s;
    /* the disk state holds the trained vector as any run's, W0 beside it (run_poetx_open_disk);
     * layer streaming (device_budget) moves the base's blocks (W0 in them, as held) through the budget
     * on the CPU device, the hook on its blocks in host memory, the trained vector's state in RAM or
     * on state_paths (W0's files beside the store written from the streamed base), one process
     * (mpirun: run_check) */
    int cuda_index = -1;
    if (c->device_budget > 0 && !st_backend_device_parse(c->device, &cuda_index, NULL) && cuda_index >= 0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'device': method poetx with device_budget streams the base "
                       "to the cpu device (the hook, its Q and its gradients are in host memory); device %s is "
                       "not taken: give device cpu, or leave device_budget out", c->device);
    if (st_train_config_places_state(c))
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'plan_state': method poetx trains with its state as given (its "
                       "trained vector's state on disk is taken: give state_paths); leave plan_state out");
    cuda_index = -1;
    if (st_train_config_frozen_dtype(c) > 0 && !st_backend_device_parse(c->device, &cuda_index, NULL) &&
        cuda_index >= 0)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'frozen_dtype': %s W0 is dequantised by the host; device %s "
                       "keeps the weights elsewhere: train on device cpu, or give frozen_dtype fp32", c->frozen_dtype,
                       c->device);
    /* ranks: every rank merges its whole copy alike (run_poetx_after_step) */
    st_model_overrides ov = st_train_config_overrides(c);
    st_model_shape shape;
    st_arch *arch = NULL;
    if ((s = st_model_resolve(c->model, c->init_from, &ov, 0, 0, &shape, &arch, err))) return s;
    st_poetx_config pc = poetx_config(c);
    s = st_poetx_check(arch->lay.tensors, arch->lay.n_tensors, shape.arch, &pc, NULL, NULL, err);
    st_arch_free(arch);
    return s;
}

st_status run_poetx_trainable(const st_train_config *c, const st_arch *a, const char *family, size_t *n, st_err *err) {
    st_poetx_config pc = poetx_config(c);
    return st_poetx_check(a->lay.tensors, a->lay.n_tensors, family, &pc, n, NULL, err);
}

int run_poetx_initialises(const st_train_config *c) { return is_poetx(c) && !c->init_from[0]; }

int run_poetx_loads_base(const st_train_config *c) { return is_poetx(c) && c->init_from[0]; }

/* A process's threads for poetx_init orthogonal's QRs: threads, or the cores online
 * (the start account counts as many). */
static long orth_threads(const st_train_config *c) {
    long threads = c->threads > 0 ? c->threads : sysconf(_SC_NPROCESSORS_ONLN);
    return threads < 1 ? 1 : threads;
}

/* One tensor of the table one of the matmul weights POET-X wraps (a W0)? */
static int is_w0(const st_param_info *t, const char *family, const st_poetx_config *pc) {
    size_t nq = 0;
    return t->ndim == 2 && !st_poetx_check(t, 1, family, pc, NULL, &nq, NULL) && nq;
}

st_status run_poetx_bytes_of(const st_train_config *c, const st_arch *a, const char *family, int B, int T,
                             run_poetx_bytes *out, st_err *err) {
    memset(out, 0, sizeof *out);
    st_poetx_config pc = poetx_config(c);
    size_t n_tr = 0;
    st_status s = st_poetx_check(a->lay.tensors, a->lay.n_tensors, family, &pc, &n_tr, NULL, err);
    if (s) return s;
    int gpt2 = !strcmp(family, "gpt2");
    double N = (double)B * T, b = pc.block, h_total = 0, nperm = 0, max_d = 0, gmax = 0, n_w0 = 0, w0_held = 0, max_numel = 0;
    /* poetx_init orthogonal: each thread's QR at once (src/model/poetx_init.c: the weight in fp64,
     * tau, the signs and LAPACK's workspace, about 64 blocks of the smaller side); the threads'
     * largest weights together bound it */
    long threads = orth_threads(c);
    double *qr = run_poetx_initialises(c) && !strcmp(init_of(c, 0), "orthogonal") ? calloc((size_t)threads, sizeof *qr)
                                                                                  : NULL;
    for (int i = 0; i < a->lay.n_tensors; i++) {
        const st_param_info *t = &a->lay.tensors[i];
        /* one tensor alone: Q's counted only where it is one of the matmul weights POET-X wraps */
        if (!is_w0(t, family, &pc)) continue;
        double d_out = gpt2 ? t->shape[1] : t->shape[0], d_in = gpt2 ? t->shape[0] : t->shape[1];
        h_total += d_out; /* Hugging Face layouts: GPT-2's Conv1D (in, out), the Llama family's (out, in) */
        n_w0 += (double)t->numel;
        if ((double)t->numel > max_numel) max_numel = (double)t->numel;
        w0_held += (double)st_frozen_bytes(pc.frozen_dtype, t->numel);
        nperm += d_in + d_out;
        if (d_in > max_d) max_d = d_in;
        if (d_out > max_d) max_d = d_out;
        if ((d_in + d_out) * b > gmax) gmax = (d_in + d_out) * b;
        /* the threads' largest QRs, kept in descending order */
        double q = 8.0 * (double)t->numel + 8.0 * 66.0 * (d_in < d_out ? d_in : d_out);
        for (long j = 0; qr && j < threads; j++)
            if (q > qr[j]) {
                double tmp = qr[j];
                qr[j] = q;
                q = tmp;
            }
    }
    double qr_bytes = 0;
    for (long j = 0; qr && j < threads; j++) qr_bytes += qr[j];
    free(qr);
    out->kept_h = pc.recompute ? 0 : 4.0 * N * h_total;
    out->scratch = 4.0 * (5.0 * N * max_d + 2.0 * (max_d / b) * b * b + gmax + nperm);
    /* the disk state: W0's file of the last merge stays until the next one's is in place (two);
     * under ranks the merge before it stays too, as a rank's store may return to the step before
     * (run_poetx_after_disk: three a rank while a merge's file is written). The ranks: the
     * launcher's, as strata train under mpirun (or strata plan under it) is started */
    int ranks = st_comm_launched_size();
    if (c->state_paths[0]) out->disk = (ranks == 1 ? 2.0 : 3.0) * (w0_held + 4.0 * nperm);
    out->save_staging = 4.0 * ((double)n_tr + nperm); /* W0 written from the base's vector (host memory) */
    /* --save_hf: the merged dense weights, every W0 at once in fp32 (with fp32 W0 a copy kept to
     * restore the run's; with bf16 or int8 the base's pages touched again, given back after) */
    if (c->save_hf[0]) out->save_staging += 4.0 * n_w0;
    double n = (double)a->lay.n_params;
    /* bf16, int8: the store's codes and its panel buffer; the base's fp32 pages of W0 given back */
    double panel = pc.frozen_dtype == ST_FROZEN_F32 ? 0 : (double)st_frozen_panel_bytes((size_t)max_numel);
    out->frozen = pc.frozen_dtype == ST_FROZEN_F32 ? 4.0 * n : 4.0 * (n - n_w0) + w0_held + panel;
    /* The start with fp32, once wrapped: the base's weights (built without a gradient vector, it is
     * frozen; in host memory, a device only streams), the trained vector with its gradients, the
     * blocks' G and the permutations, the QRs of an orthogonal W0 (many threads, few large weights) */
    if (pc.frozen_dtype == ST_FROZEN_F32) {
        out->start = 4.0 * n + 8.0 * (double)n_tr + 4.0 * (gmax + nperm) + qr_bytes;
        /* ... or, before the wrap, init_from's loader: the weights read in place, one tensor's
         * conversion beside them (a device: one tensor's staging) */
        double loading = 4.0 * n + (double)st_params_load_extra_bytes(a->lay.tensors, a->lay.n_tensors, 1);
        if (c->init_from[0] && loading > out->start) out->start = loading;
        return ST_OK;
    }
    /* bf16, int8: the model, its store and the permutations (a host copy beside them) first, then
     * the base read from init_from or drawn from the seed a tensor at a time in the table's order
     * into its vector (pages taken as written): the tensor in flight (read: its fp32 and its
     * file's pages; drawn: its fp32), the fp32 of the base's other tensors so far, each W0 as held
     * once w0_pass (its two fp32 buffers of the largest W0) has rounded it and given its fp32
     * pages back; poetx_init orthogonal: a batch of W0 in fp32 (a QR for each thread of every
     * rank) made orthogonal together first, the threads' QRs beside them */
    int orth = run_poetx_draws_base(c) && qr_bytes > 0;
    double batch = orth ? (double)threads * (ranks > 1 ? ranks : 1) : 1, fly_each = c->init_from[0] ? 8.0 : 4.0;
    double kept = 0, peak = 0, pend = 0, pend_held = 0, npend = 0, pass = 8.0 * max_numel;
    for (int i = 0; i <= a->lay.n_tensors; i++) {
        const st_param_info *t = i < a->lay.n_tensors ? &a->lay.tensors[i] : NULL;
        if (t && kept + pend + fly_each * (double)t->numel > peak) peak = kept + pend + fly_each * (double)t->numel;
        if (t && !is_w0(t, family, &pc)) {
            kept += 4.0 * (double)t->numel;
            continue;
        }
        if (t) { /* a W0 */
            pend += 4.0 * (double)t->numel;
            pend_held += (double)st_frozen_bytes(pc.frozen_dtype, t->numel);
            npend++;
        }
        if (npend && (npend >= batch || !t)) { /* the batch (the last: what remains) into the store */
            double work = orth && qr_bytes > pass ? qr_bytes : pass;
            /* the batch's held codes are written while its fp32 pages are still mapped */
            if (kept + pend + pend_held + work > peak) peak = kept + pend + pend_held + work;
            kept += pend_held;
            pend = pend_held = npend = 0;
        }
    }
    out->start = 8.0 * (double)n_tr + 4.0 * (gmax + 2.0 * nperm) + panel + (kept > peak ? kept : peak);
    return ST_OK;
}

/* poetx_init orthogonal under ranks over the weights ks[0..n_ks) of the walk (ks NULL: every one):
 * rank r draws the weights k with k % world == r (the bits one
 * process gives them), then each weight is broadcast from the rank that drew it: every rank holds
 * the same W0 even where the ranks' CPUs run LAPACK with other kernels (other bits), each drawing 1 / world
 * of the QRs. Collective: every rank calls it, a failure is agreed on first. */
static st_status orthogonal_ranks(st_model *base, const st_train_config *c, st_comm *comm, const int *ks, int n_ks,
                                  st_err *err) {
    int world = st_comm_size(comm), rank = st_comm_rank(comm);
    st_status s = ks ? st_poetx_orthogonal_some(base, (float)c->poetx_init_gain, c->seed, ks, n_ks, rank, world, err)
                     : st_poetx_orthogonal_base_part(base, (float)c->poetx_init_gain, c->seed, rank, world, err);
    int n = st_poetx_init_weights(base, NULL);
    if (!ks) n_ks = n;
    const st_param_info **t = malloc((size_t)(n ? n : 1) * sizeof *t);
    if (!s && !t) s = st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory");
    st_err aerr = {0};
    double bad = s ? 1.0 : 0.0; /* any rank's failure: every rank returns before the broadcasts */
    st_status cs = st_comm_allreduce_f64(comm, &bad, 1, "poetx_init orthogonal", &aerr);
    if (cs || bad > 0) {
        free(t);
        if (s) return s;
        if (cs) return st_errf(err, cs, "%s", aerr.msg);
        return st_errf(err, ST_ERR_INVALID,
                       "poetx_init orthogonal: another rank failed drawing its W0 (its log says why)");
    }
    st_poetx_init_weights(base, t);
    st_backend *be = base->be;
    float *host = NULL; /* a device's weights cross through host memory */
    size_t cap = 0;
    for (int j = 0; j < n_ks && !s; j++) {
        int k = ks ? ks[j] : j; /* st_poetx_orthogonal_some checked it */
        const st_param_info *w = t[k];
        float *buf = base->params + w->offset;
        if (!st_backend_host_memory(be)) {
            if (w->numel > cap) {
                free(host);
                cap = w->numel;
                if (!(host = malloc(cap * sizeof *host))) {
                    s = st_errf(err, ST_ERR_NOMEM, "poetx_init orthogonal: out of memory for %s", w->name);
                    break; /* the ranks' timeout ends the others' wait */
                }
            }
            if (k % world == rank) be->ops->copy_to_host(be, host, buf, w->numel * sizeof *host);
            buf = host;
        }
        s = st_comm_bcast(comm, buf, w->numel * sizeof *buf, k % world, "poetx_init orthogonal W0", err);
        if (!s && buf == host) be->ops->copy_to_device(be, base->params + w->offset, host, w->numel * sizeof *host);
    }
    free(host);
    free(t);
    return s;
}

/* A preset's weights from the seed, drawn only once wrapped: the wrap has freed the base's gradient
 * vector, so the start holds the base's weights and the initialisation's staging buffer (8 bytes a
 * parameter) and not the gradients besides (12: a 2B model's 24 GB). W0 then made flat where
 * orthogonal says so, the trainables copied into the POET-X vector again and the permutations of
 * step 0 drawn, as the wrap did: the same model bit for bit as initialising before the wrap. */
static st_status draw_start(const st_train_config *c, st_comm *comm, st_model *pm, int orthogonal, st_err *err) {
    st_model *base = st_poetx_base(pm);
    st_status s = ST_OK;
    base->ops->init_random(base, c->seed);
    if (orthogonal) {
        st_log(1, "poetx_init orthogonal: every block matmul weight's W0 a random orthogonal matrix with "
               "one singular value, %g x its initialisation's RMS one (poetx_init_gain)\n", c->poetx_init_gain);
        if (comm && st_comm_size(comm) > 1) s = orthogonal_ranks(base, c, comm, NULL, 0, err);
        else s = st_poetx_orthogonal_base(base, (float)c->poetx_init_gain, c->seed, err);
        if (s) return s;
    }
    return st_poetx_init_state(pm, c->seed, err);
}

/* The orthogonal W0 of a batch of drawn weights (st_poetx_orth): one process's threads, or under
 * ranks each weight drawn by one rank and broadcast (orthogonal_ranks). */
typedef struct orth_ctx {
    const st_train_config *c;
    st_comm *comm; /* NULL: one process */
} orth_ctx;

static st_status orthogonal_batch(void *ctx, st_model *base, const int *ks, int n, st_err *err) {
    const orth_ctx *o = ctx;
    if (o->comm) return orthogonal_ranks(base, o->c, o->comm, ks, n, err);
    return st_poetx_orthogonal_some(base, (float)o->c->poetx_init_gain, o->c->seed, ks, n, 0, 1, err);
}

/* How many weights an orthogonal W0's batch takes (st_poetx_orth.batch): a QR for each thread of
 * every rank; the ranks' threads summed, so that every rank makes the same batches (collective). */
static st_status orth_batch(const st_train_config *c, st_comm *comm, int *batch, st_err *err) {
    double t = (double)orth_threads(c);
    st_err aerr = {0};
    if (comm && st_comm_allreduce_f64(comm, &t, 1, "poetx_init orthogonal's batch", &aerr))
        return st_errf(err, ST_ERR_IO, "%s", aerr.msg);
    *batch = t > 1e6 ? 1000000 : (int)t;
    return ST_OK;
}

int run_poetx_draws_base(const st_train_config *c) {
    return run_poetx_initialises(c) && poetx_config(c).frozen_dtype != ST_FROZEN_F32;
}

st_status run_poetx_open(const st_train_config *c, st_comm *comm, st_model **m, st_err *err) {
    if (!is_poetx(c)) return ST_OK;
    st_poetx_config pc = poetx_config(c);
    st_model *pm = NULL;
    int orthogonal = !c->resume[0] && !strcmp(init_of(c, 0), "orthogonal");
    if (run_poetx_draws_base(c)) {
        /* a preset with bf16 or int8: the model and its W0 store made first, then the base drawn a
         * tensor at a time, each W0 (with orthogonal a batch of them, the threads' QRs) into the
         * store and its fp32 pages given back before the next is drawn: the base is never whole in
         * fp32. A resume's W0 comes from its checkpoint after, as from draw_start's. */
        orth_ctx oc = {c, comm && st_comm_size(comm) > 1 ? comm : NULL};
        st_poetx_orth orth = {orthogonal_batch, &oc, 1};
        st_status s = orthogonal ? orth_batch(c, oc.comm, &orth.batch, err) : ST_OK;
        if (s) {
            st_model_free(*m);
            *m = NULL;
            return s;
        }
        if (orthogonal)
            st_log(1, "poetx_init orthogonal: every block matmul weight's W0 a random orthogonal matrix with "
                   "one singular value, %g x its initialisation's RMS one (poetx_init_gain)\n", c->poetx_init_gain);
        s = st_poetx_model_create_drawn(&pm, *m, &pc, c->seed, orthogonal ? &orth : NULL, err);
        *m = pm; /* takes the base, and frees it on failure */
        return s;
    }
    /* both take the base, and free it on failure; init_from's weights read into it here, each W0
     * into the store as it is read */
    st_status s = run_poetx_loads_base(c) ? st_poetx_model_create_from(&pm, *m, c->init_from, &pc, c->seed, err)
                                          : st_poetx_model_create(&pm, *m, &pc, c->seed, err);
    *m = pm; /* its activations: the run's, as for any model the step trains through its own forward */
    if (s || !run_poetx_initialises(c)) return s;
    /* a resume takes W0 from its checkpoint or, with the disk state, from the store's W0 file of
     * the last merge or of the start (written for this W0: LAPACK's bits may differ elsewhere;
     * run_poetx_open_disk draws it again only for a store that never stepped and lacks it) */
    return draw_start(c, comm, pm, orthogonal, err);
}

double run_poetx_lr(const st_train_config *c) { return c->poetx_lr >= 0 ? c->poetx_lr : c->lr; }

double run_poetx_clip_at(const st_train_config *c, long step) {
    long n = c->poetx_clip_ramp, every = c->poetx_merge_every;
    if (!is_poetx(c) || n <= 0 || every <= 0 || step <= every) return c->grad_clip; /* no merge before it yet */
    long j = (step - 1) % every + 1; /* the step's place after the last merge, 1-based */
    if (j > n) return c->grad_clip;
    double f = c->poetx_clip_start;
    return c->grad_clip * (f + (1.0 - f) * (double)(j - 1) / (double)n);
}

void run_poetx_lr_classes(const st_model *m, st_optim_segment *segs, int n) {
    if (!st_model_is_poetx(m)) return;
    size_t q0 = st_poetx_q_offset(m);
    for (int i = 0; i < n; i++)
        if (segs[i].offset >= q0) segs[i].lr_class = ST_OPTIM_LR_SECOND;
}

st_status run_poetx_after_step(const st_train_config *c, st_model *m, st_optim *o, st_step *stp, long step,
                               st_err *err) {
    if (!st_model_is_poetx(m) || step % c->poetx_merge_every) return ST_OK;
    st_status s = stp ? st_step_sync(stp, err) : ST_OK; /* ranks: the whole vector gathered first */
    if (s || (s = st_poetx_merge(m, c->seed, step, err))) return s;
    /* Q's segments are the optimizer's second class (run_poetx_lr_classes); under ZeRO o holds
     * this rank's shard of them, whatever the state's format */
    if (o && c->poetx_adam_restart && (s = st_optim_reset_class(o, ST_OPTIM_LR_SECOND, NULL, err)))
        return st_err_prefix(err, "poetx: the merge at step %ld", step);
    return ST_OK;
}

/* ------------------------------------------------------------------ the disk state */

#define W0_PREFIX "strata-state.poetx-w0-"

size_t run_poetx_blob_bytes(const st_train_config *c) { return is_poetx(c) && c->state_paths[0] ? sizeof(uint64_t) : 0; }

/* The blob's 8 bytes: the merge step in the low 32 bits, the run's id in the high 32 (0: none, a
 * store written before the id, whose high bits were the step's and zero). */
static void set_w0_step(run_poetx_disk *x, uint64_t v) {
    uint64_t b = (uint64_t)x->run_id << 32 | (v & 0xffffffffu);
    memcpy(x->region, &b, sizeof b);
}

void run_poetx_bind(run_poetx_disk *x, const st_train_config *c, void *region, st_comm *comm) {
    memset(x, 0, sizeof *x);
    x->on = run_poetx_blob_bytes(c) > 0;
    x->region = region;
    x->comm = comm && st_comm_size(comm) > 1 ? comm : NULL;
    if (!x->on || c->resume[0]) return; /* a resume: the id the store committed (run_poetx_open_disk) */
    /* a new run: its id drawn here, so that the store's first commit (step 0) carries it; under
     * ranks rank 0's, every rank's blob the same */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    st_rng r;
    st_rng_seed(&r, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 16));
    uint32_t id = 0;
    while (!id) id = (uint32_t)(st_rng_u64(&r) >> 32);
    if (x->comm) x->bind_status = st_comm_bcast(x->comm, &id, sizeof id, 0, "poetx run id", &x->bind_err);
    x->run_id = id;
    set_w0_step(x, 0);
}

static void w0_path(const run_poetx_disk *x, long step, char *out, size_t cap) {
    snprintf(out, cap, "%s/" W0_PREFIX "%09ld.safetensors", x->dir, step);
}

/* W0 files of merges before `below` removed (a run started afresh: all of them), and of merges
 * after `above` (LONG_MAX: none): a timeline the store returned from (a rank's store back to its
 * previous commit) or abandoned, whose file of a merge the run may make again otherwise. */
static void prune_range(const run_poetx_disk *x, long below, long above) {
    DIR *d = opendir(x->dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t lp = strlen(W0_PREFIX);
        char *end = NULL;
        if (strncmp(e->d_name, W0_PREFIX, lp)) continue;
        long k = strtol(e->d_name + lp, &end, 10);
        int tmp = end && !strncmp(end, ".safetensors.tmp", 16); /* a write a kill cut short: never read */
        if (!end || (!tmp && (strcmp(end, ".safetensors") || (k >= below && k <= above)))) continue;
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", x->dir, e->d_name);
        unlink(path); /* one left behind is harmless: a resume reads the file of its merge by name */
    }
    if (d) closedir(d);
}

static void prune(const run_poetx_disk *x, long below) { prune_range(x, below, LONG_MAX); }

/* 1 where this store's directory holds a W0 file of some merge */
static int has_w0(const run_poetx_disk *x) {
    DIR *d = opendir(x->dir);
    struct dirent *e;
    int any = 0;
    while (!any && d && (e = readdir(d))) {
        size_t lp = strlen(W0_PREFIX), n = strlen(e->d_name);
        any = !strncmp(e->d_name, W0_PREFIX, lp) && n > 12 && !strcmp(e->d_name + n - 12, ".safetensors");
    }
    if (d) closedir(d);
    return any;
}


static void zero_q(st_model *m) {
    size_t q0 = st_poetx_q_offset(m);
    m->be->ops->memset0(m->be, m->params + q0, (m->n_params - q0) * sizeof(float));
}

/* A file of another layout (w0_locate) that is this run's: it exists and its poetx_run is this
 * run's (or it has none: written before the key). The first other run's file met is kept in
 * *other (its error naming the file and the key) for the caller that finds no file. */
static int this_runs(const run_poetx_disk *x, const char *path, st_err *other) {
    struct stat sb;
    if (stat(path, &sb)) return 0;
    st_err e = {0};
    if (!st_poetx_w0_check_run(path, x->run, &e)) return 1;
    if (other && !other->code) *other = e;
    return 0;
}

/* W0's file of the merge at step: this store's (1), else (a resume at another number of ranks,
 * whose stores the re-shard made anew) the same merge's file of this run beside a store of the
 * other layout under the first state path, the plain store's or some rank's (every rank writes
 * the same W0): its path in out (2); 0 where none is (other: another run's file of that merge
 * met there, passed over). */
static int w0_locate(const run_poetx_disk *x, long step, char *out, size_t cap, st_err *other) {
    struct stat sb;
    if (other) memset(other, 0, sizeof *other);
    w0_path(x, step, out, cap);
    if (!stat(out, &sb)) return 1;
    char base[2048], name[64];
    snprintf(base, sizeof base, "%s", x->dir);
    char *sl = strrchr(base, '/');
    int q, w, len = 0;
    if (sl && sscanf(sl + 1, "rank%d-of-%d%n", &q, &w, &len) == 2 && !sl[1 + len]) *sl = 0; /* a rank's: PATH */
    /* only for a store made by the re-shard, before it kept a file of its own: once it has one,
     * the other layouts' files may be of a timeline this run left */
    if (has_w0(x)) {
        w0_path(x, step, out, cap);
        return 0;
    }
    snprintf(name, sizeof name, W0_PREFIX "%09ld.safetensors", step);
    snprintf(out, cap, "%s/%s", base, name);
    if (strcmp(base, x->dir) && this_runs(x, out, other)) return 2;
    DIR *d = opendir(base);
    struct dirent *e;
    int found = 0;
    while (!found && d && (e = readdir(d))) {
        if (sscanf(e->d_name, "rank%d-of-%d%n", &q, &w, &len) != 2 || e->d_name[len]) continue;
        char dir[2320];
        snprintf(dir, sizeof dir, "%s/%s", base, e->d_name);
        snprintf(out, cap, "%s/%s", dir, name);
        found = strcmp(dir, x->dir) && this_runs(x, out, other);
    }
    if (d) closedir(d);
    if (!found) w0_path(x, step, out, cap);
    return found ? 2 : 0;
}

static st_status load_w0(const run_poetx_disk *x, st_model *m, long step, st_err *err) {
    char path[2400];
    st_err other;
    int where = w0_locate(x, step, path, sizeof path, &other);
    if (!where && other.code) { /* only another run's file of that merge */
        *err = other;
        return st_err_prefix(err, "method poetx with state_paths: W0 of the merge at step %ld", step);
    }
    /* another layout's file: its run checked by w0_locate */
    st_status s = st_poetx_load_w0(m, path, step, where == 2 ? NULL : x->run, err);
    if (!s && where == 2) { /* this store's own copy, for its later resumes and its pruning */
        char own[2400];
        w0_path(x, step, own, sizeof own);
        st_log(1, "method poetx: W0 of the merge at step %ld taken from %s (another rank's, or written at another "
               "number of ranks)\n", step, path);
        s = st_poetx_save_w0(m, own, step, x->run, err);
    }
    return s ? st_err_prefix(err, "method poetx with state_paths: W0 of the merge at step %ld", step) : ST_OK;
}

/* The fingerprint each W0 file of this run carries (metadata poetx_run): the run's id (drawn at
 * its start, committed in the store's blob and carried through a re-shard: the same on every rank
 * and at every number of ranks), W0's initialisation and the trained vector's size, which a
 * resume cannot change. */
static void set_run(run_poetx_disk *x, const st_train_config *c, const st_model *m) {
    char id[32] = "none"; /* a store written before the id */
    if (x->run_id) snprintf(id, sizeof id, "%08x", (unsigned)x->run_id);
    char gain[40] = "";
    if (!strcmp(c->poetx_init, "orthogonal")) snprintf(gain, sizeof gain, " gain %.9g", c->poetx_init_gain);
    snprintf(x->run, sizeof x->run, "run %s, poetx_init %s%s, %zu trained parameters", id, c->poetx_init, gain,
             m->n_params);
}

st_status run_poetx_open_disk(run_poetx_disk *x, const st_train_config *c, st_model *m, const char *manifest,
                              long hs_step, int fresh, st_err *err) {
    if (!x->on) return ST_OK;
    if (x->bind_status) { /* the run's id not broadcast (run_poetx_bind) */
        *err = x->bind_err;
        return st_err_prefix(err, "method poetx with state_paths: the run's id");
    }
    snprintf(x->dir, sizeof x->dir, "%s", manifest);
    char *sl = strrchr(x->dir, '/');
    if (sl) *sl = 0;
    else snprintf(x->dir, sizeof x->dir, ".");
    const int flat = !strcmp(c->poetx_init, "orthogonal"); /* W0 drawn by LAPACK: kept in a file, step 0 */
    uint64_t w;
    memcpy(&w, x->region, sizeof w);
    x->run_id = (uint32_t)(w >> 32); /* a new run's: run_poetx_bind's */
    w &= 0xffffffffu;
    set_run(x, c, m);
    if (fresh) { /* a new store: W0 files beside it are another run's */
        prune(x, LONG_MAX);
        set_w0_step(x, 0);
        if (!flat) return ST_OK; /* the model's initialisation: drawn again alike from the seed */
        char path0[2400];
        w0_path(x, 0, path0, sizeof path0);
        st_status s = st_poetx_save_w0(m, path0, 0, x->run, err);
        return s ? st_err_prefix(err, "method poetx with state_paths: W0 of the start (poetx_init orthogonal)") : ST_OK;
    }
    long every = c->poetx_merge_every, j = hs_step, ml = every > 0 ? j / every * every : 0;
    if ((long)w > ml || (every > 0 && (long)w % every))
        return st_errf(err, ST_ERR_FORMAT, "key 'poetx_merge_every': the state store %s at step %ld has taken the "
                       "merge of step %llu, which merge interval %ld does not give; resume with the run's "
                       "poetx_merge_every", manifest, j, (unsigned long long)w, every);
    x->committed = w;
    x->merged = ml;
    prune_range(x, LONG_MIN, j); /* merges after the store's step: a timeline it returned from */
    char path[2400];
    st_err other;
    int have = w0_locate(x, ml, path, sizeof path, &other);
    if (!ml && flat && j == 0 && w == 0 && run_poetx_initialises(c)) {
        /* killed after the store was created and before W0's file of the start was in place: the
         * store never stepped, so its trained vector is the start's; W0 drawn again from the seed
         * (on this machine's LAPACK, as a fresh start would; under ranks every rank at step 0,
         * collectively where any rank lacks its file) and its file written now */
        double missing = have ? 0.0 : 1.0;
        st_status s = x->comm ? st_comm_allreduce_f64(x->comm, &missing, 1, "poetx W0 of the start", err) : ST_OK;
        if (s || !(missing > 0)) return s ? s : load_w0(x, m, 0, err);
        st_log(1, "method poetx: the state store never stepped and its start's W0 file was not written; W0 "
               "drawn again from the seed (poetx_init orthogonal)\n");
        w0_path(x, 0, path, sizeof path);
        if (!(s = draw_start(c, x->comm, m, 1, err)) && (s = st_poetx_save_w0(m, path, 0, x->run, err)))
            st_err_prefix(err, "method poetx with state_paths: W0 of the start (poetx_init orthogonal)");
        return s;
    }
    if (!ml) return flat ? load_w0(x, m, 0, err) : ST_OK; /* W0 of the start: its file, or the base as built */
    if (have) {
        st_status s = load_w0(x, m, ml, err);
        if (!s && w < (uint64_t)ml) zero_q(m); /* merged; the store's Q reset with the next update */
        return s;
    }
    w0_path(x, ml, path, sizeof path);
    if ((j != ml || w == (uint64_t)ml) && other.code) { /* another run's file of that merge, none of this run's */
        *err = other;
        return st_err_prefix(err, "method poetx with state_paths: W0 of the merge at step %ld", ml);
    }
    if (j != ml || w == (uint64_t)ml)
        return st_errf(err, ST_ERR_FORMAT, "%s: missing; the state store %s is at step %ld, past the merge of step %ld "
                       "whose W0 that file holds: the disk state is incomplete; start the run again", path, manifest,
                       j, ml);
    /* killed after the store committed the merge's step and before W0's file was renamed into
     * place: the merge made again from W0 of the one before and the store's Q (zero where the
     * store never took that one's reset: no update since) */
    long prev = ml - every;
    st_status s = prev > 0 || flat ? load_w0(x, m, prev, err) : ST_OK;
    if (s) return s;
    if (w < (uint64_t)prev) zero_q(m);
    st_log(1, "method poetx: the state store has step %ld; the merge of that step is made again (its W0 file was "
           "not written)\n", j);
    if ((s = st_poetx_merge(m, c->seed, ml, err))) return s;
    if ((s = st_poetx_save_w0(m, path, ml, x->run, err))) return st_err_prefix(err, "method poetx with state_paths");
    prune(x, x->comm ? prev : ml); /* under ranks the merge before kept (run_poetx_after_disk) */
    return ST_OK;
}

void run_poetx_stage(run_poetx_disk *x, const st_train_config *c, st_step_hp *hp) {
    if (!x->on) return;
    if ((uint64_t)x->merged > x->committed) {
        hp->reset_master = 1;
        hp->reset_moments = c->poetx_adam_restart != 0;
        hp->reset_class = ST_OPTIM_LR_SECOND;
    }
    set_w0_step(x, (uint64_t)x->merged);
}

st_status run_poetx_after_disk(run_poetx_disk *x, const st_train_config *c, const st_model *m, long step,
                               int skipped, st_err *err) {
    if (!x->on) return ST_OK;
    if (skipped) set_w0_step(x, x->committed); /* no update: the blob committed alone keeps it */
    else x->committed = (uint64_t)x->merged;
    if (c->poetx_merge_every <= 0 || step % c->poetx_merge_every) return ST_OK;
    char path[2400];
    w0_path(x, step, path, sizeof path);
    st_status s = st_poetx_save_w0(m, path, step, x->run, err);
    if (s) return st_err_prefix(err, "method poetx with state_paths: the merge at step %ld", step);
    st_failpoint("poetx_w0_written"); /* tests: W0's file in place, the older ones not yet removed */
    x->merged = step;
    /* the store has committed this step (skipped: it has not yet; the file of the merge before
     * stays until the next merge). Under ranks another rank may not have committed it: after a
     * kill this rank's store returns to the step before (run_open_store), whose merge's file must
     * still be here, so the merge before this one is kept too */
    if (!skipped) prune(x, x->comm ? step - c->poetx_merge_every : step);
    return ST_OK;
}

st_status run_poetx_load_merged(const st_train_config *c, st_model **m, const char *weights, st_err *err) {
    st_model *pm = NULL;
    st_poetx_config pc = poetx_config(c);
    st_status s = st_poetx_model_create(&pm, *m, &pc, c->seed, err); /* takes the base, frees it on failure */
    *m = NULL;
    if (s) return s;
    if ((s = pm->ops->load(pm, weights, err))) {
        st_model_free(pm);
        return s;
    }
    return st_poetx_merged_base(pm, m, err); /* the base again, merged; pm freed */
}

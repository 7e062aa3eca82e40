/* train.c - the training run: open, loop, close.
 *
 *     st_train_run:  run_check    the configuration, the device, plan_state auto, the memory
 *                                 plan, the ranks' agreement (nothing written yet)
 *                    run_open_dir RUN_DIR and its lock
 *                    run_open     backend, model, executor (and the planner's choices), then
 *                                 config.json once, optimizer, data, state, outputs
 *                    run_loop     per step: next batch and step (run_step), validation
 *                                 (run_evaluate), the step's record (run_log_step), a sample
 *                                 (run_sample), the skip limit, the stop flag, a checkpoint
 *                    run_finish   the last checkpoint, the final weights, --save_hf
 *                    run_close    everything in reverse, in one place
 *
 * Determinism: for a fixed configuration and thread count every step is bit-for-bit
 * reproducible (the backend's reductions have a fixed order), and a checkpoint holds
 * everything a step depends on (weights, moments, step counters, RNG, data cursor),
 * so stopping and resuming continues exactly as if nothing had stopped.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileutil.h"
#include "run/run_internal.h"
#include "run/run_lora_internal.h"
#include "strata/lora.h"
#include "run/run_docs.h"
#include "run/run_poetx_internal.h"
#include "run/run_mix.h"
#include "run/run_stop_internal.h"
#include "strata/generate.h"
#include "strata/poetx.h"

/* A run: the configuration it runs (the caller's, with what the planner chose filled in),
 * what it opened, and what changes as it runs. */
typedef struct train_run {
    st_train_config c;           /* as run: plan_state auto's placement, the chosen state_budget */
    volatile int *stop_flag;     /* the caller's (st_train_hooks); NULL: none */
    run_dist dist;               /* the ranks (one process: a world of one) */
    run_mix mix;                 /* mix online (run_mix.c); off otherwise */
    run_docs docs;               /* doc_signals (run_docs.c); off otherwise */
    run_ckpt_extra extra;        /* what checkpoints hold besides the state (ckpt_extra) */
    int lead;                    /* rank 0: writes what is the run's, not a rank's */
    int quiet;                   /* no lines: the key quiet, or a rank other than 0 */
    int threads;
    st_lock lock;                /* RUN_DIR/strata.lock, held by rank 0 */
    st_mem_plan mem;    /* the memory plan checked before anything was allocated */
    int B, T;
    long end;                    /* the last step this call trains (stop_at or steps) */
    double step_tokens;          /* tokens of one step over all ranks */
    double flops_per_step;
    /* opened */
    st_backend *be;              /* the CPU backend: the model's (host) vectors */
    st_backend *dev;             /* layer streaming: the device the blocks stream to */
    st_model *m;
    st_arch *arch;
    st_stream_exec *sx;          /* layer streaming's executor (device_budget > 0) */
    st_optim *opt;               /* in memory, or a rank's shard; the executor's own when one process streams */
    st_optim_segment *segs;      /* the whole vector's segments, decay by role */
    st_optim_segment *opt_segs;  /* the optimizer's (and the store's): this rank's shard under ZeRO */
    int n_opt_segs;
    st_store *store;             /* the disk state (state_paths) */
    run_poetx_disk px;           /* method poetx with the disk state: W0's files, Q's reset */
    st_step *stp;                /* the step: in memory or streamed */
    run_data td;
    run_eval ev;
    st_train_state_header *hs;   /* the loop's state: step, adam step, data position */
    size_t blob_bytes;           /* with the disk state, what each step commits: hs, then the online
                                    mixture's state (run_mix.h) */
    int32_t *inputs, *targets;   /* a step's micro-batches at once */
    int32_t *positions, *doc_start; /* doc_mask: each micro-batch's documents */
    FILE *metrics;               /* RUN_DIR/metrics.jsonl (rank 0) */
    st_prof_tb *tb;              /* TensorBoard events: the scalars of metrics.jsonl */
    st_prof_run *pr;             /* trace, per-step monitor, progress line */
    /* the loop's figures */
    double tok_s_sum;
    long timed, steps_run, skipped_run; /* skipped_run: consecutive skipped steps */
    float last_loss;
    int saved_at_end;
    st_run_stop stop;            /* the schedule as it runs and the stopping rule (issue 28) */
} train_run;

/* One step as the loop accounts it. */
typedef struct train_step {
    long step;
    st_step_result sr;
    double loss, norm, lr, dt, tok_s, gflops;
    double lr2, clip;            /* method poetx: Q's learning rate and the clip threshold of the step */
    int skipped;
    double val;                  /* validation loss at this step (NAN: none) */
    double eval_s;
    char forecast_json[400];     /* the stopping rule's fields of an evaluation's record */
} train_step;

/* A number for a JSON document: JSON has no NaN or infinity, so those are null. */
static const char *json_num(char buf[32], double v, const char *fmt) {
    if (!isfinite(v)) return "null";
    snprintf(buf, 32, fmt, v);
    return buf;
}

/* ------------------------------------------------------------------ before anything is written */

static st_status run_check(train_run *r, const st_train_config *given, const st_train_hooks *h, st_err *err) {
    st_train_config *c = &r->c;
    *c = *given;
    st_comm *comm = h ? h->comm : NULL;
    r->stop_flag = h ? h->stop_flag : NULL;
    r->dist = (run_dist){.comm = comm, .rank = st_comm_rank(comm), .world = st_comm_size(comm), .zero = c->zero};
    r->lock.fd = -1;
    st_status s = run_lora_init_from(c, err); /* an init_from that is a LoRA adapter: its base, init_adapter */
    if (!s) s = st_train_config_check(c, err);
    if (!s) s = run_lora_check(c, err); /* method and its keys (run_lora.c) */
    if (!s) s = run_poetx_check(c, err); /* method poetx's keys (run_poetx.c) */
    if (s) return s;
    if ((s = run_poetx_resolve_init(c, err))) return s; /* poetx_init auto: what the run does, recorded as if given */
    /* a device this build lacks (cuda without the CUDA backend) is refused before anything
     * is planned or written: no run directory, no config.json */
    if ((s = st_backend_device_built(c->device, err))) return st_err_prefix(err, "key 'device'");
    /* plan_state auto: the state's format and tier chosen now, and run (and recorded in
     * config.json) as if given */
    if (st_train_config_places_state(c) && (s = run_place_state(c, r->dist.world, err))) return s;
    /* matmul auto: the precision this machine takes (bf16 where it has bf16 matrix units),
     * logged, and run and recorded in config.json as if given */
    st_matmul_mode matmul = ST_MATMUL_FP32; /* the key's one parser (backend.h); checked above */
    if (!st_backend_matmul_parse(c->matmul, &matmul, NULL) && matmul == ST_MATMUL_AUTO) {
        char why[200];
        snprintf(c->matmul, sizeof c->matmul, "%s", st_backend_matmul_name(st_backend_matmul_auto(c->device, why, sizeof why)));
        st_log(1, "matmul auto: %s (%s)\n", c->matmul, why);
    }
    if ((s = run_check_resume_numerics(c, err))) return s; /* another matmul or act_dtype than the resumed run's */
    char why[320]; /* poetx_recompute auto: kept where it fits, logged and recorded as if given */
    s = st_train_poetx_recompute_choose(c, why, sizeof why, err);
    if (r->dist.world > 1 && given->poetx_recompute < 0 && st_train_config_method_of(c) == ST_TRAIN_METHOD_POETX) {
        /* every rank the same choice (the ranks compare their keys below): recomputed where any
         * rank's memory needs it, each rank having judged its own */
        if (!(s = run_agree(&r->dist, s, "choosing poetx_recompute", err))) {
            int mine = c->poetx_recompute, *all = malloc(sizeof(int) * (size_t)r->dist.world);
            if (!all) return st_errf(err, ST_ERR_NOMEM, "out of memory");
            st_err cerr = {0};
            if (!(s = st_comm_allgather(r->dist.comm, &mine, sizeof mine, all, "poetx_recompute", &cerr)))
                for (int i = 0; i < r->dist.world; i++)
                    if (all[i] > c->poetx_recompute) c->poetx_recompute = all[i];
            free(all);
            if (s) return st_errf(err, s, "%s", cerr.msg);
            if (c->poetx_recompute != mine)
                snprintf(why, sizeof why, "poetx_recompute auto: 1, as another rank's memory needs it (this rank's "
                         "would keep the rotated inputs)");
        }
    }
    if (s) return s;
    if (why[0]) st_log(1, "%s\n", why);
    /* the memory plan, checked before anything is allocated or written */
    if ((s = st_train_mem_plan(c, NULL, &r->mem, err))) return s; /* streamed: the smallest plan's */
    double budgets[ST_MEM_TIER_COUNT] = {0, c->host_budget, 0};
    if ((s = st_mem_plan_check(&r->mem, budgets, err))) return s;
    if (!c->run_dir[0]) return st_errf(err, ST_ERR_INVALID, "key 'run_dir' is empty; name a directory for the run");
    r->lead = r->dist.rank == 0;
    if (r->dist.world > 1) {
        st_comm_set_timeout(r->dist.comm, c->dist_timeout);
        if ((s = run_dist_check_config(c, &r->dist, err))) return s;
    }
    /* the data lists opened and checked on every rank: a list refused here leaves no run
     * directory behind */
    st_model_shape shape;
    const char *val = run_val_spec(c);
    s = st_train_config_resolve(c, &shape, err);
    if (!s) s = st_data_list_check("data", c->data, c->seq, shape.vocab_size, err);
    if (!s && val) s = st_data_list_check("val_data", val, c->seq, shape.vocab_size, err);
    return run_agree(&r->dist, s, "checking the data lists", err);
}

/* One process per run directory: a second would interleave metrics and mix one process's
 * weights with the other's optimizer state in a checkpoint (under mpirun rank 0 holds it for
 * the job, and writes what is the run's, not a rank's). */
static st_status run_open_dir(train_run *r, st_err *err) {
    st_status s = ST_OK;
    if (r->dist.rank == 0) {
        char path[2200];
        s = st_mkdirs(r->c.run_dir, err);
        st_run_path(path, sizeof path, r->c.run_dir, ST_RUN_LOCK);
        if (!s) s = st_lock_acquire(&r->lock, path, "run directory", err);
    }
    return run_agree(&r->dist, s, "opening the run directory", err);
}

/* ------------------------------------------------------------------ opening */

/* The backend and the model (a preset with overrides, or init_from's shape and weights);
 * under layer streaming (device_budget > 0) the executor on the device, the model's vectors
 * on the CPU backend its host tier, the executor's optimizer the run's. */
static st_status open_model(train_run *r, st_err *err) {
    st_train_config *c = &r->c;
    st_status s;
    r->threads = c->threads;
    if (!r->threads && r->dist.world > 1) r->threads = st_comm_threads(r->dist.comm); /* the cores shared by the ranks here */
    if ((s = st_backend_cpu_create(&r->be, r->threads, err))) return s;
    if ((s = st_backend_set_matmul(r->be, c->matmul, err))) return s; /* key 'matmul' on the host's cores (named) */
    st_model_overrides ov = st_train_config_overrides(c);
    /* lora, poetx: the base is frozen, its gradient never allocated (the method trains its own) */
    ov.no_grads = st_train_config_method_of(c) != ST_TRAIN_METHOD_FULL;
    /* lora, poetx over init_from: the base built empty, its weights read once the method's held
     * store is made (run_lora_open, run_poetx_open), each block weight rounded into it as it is read */
    int loads = run_lora_loads_base(c) || run_poetx_loads_base(c);
    if ((s = st_model_create_from(&r->m, c->model, c->init_from, &ov, !loads, r->be, err))) return s;
    if (!c->init_from[0] && !run_poetx_initialises(c) && !run_lora_draws_base(c)) r->m->ops->init_random(r->m, c->seed); /* poetx, lora bf16/int8: once wrapped */
    else if (c->init_from[0] && !loads && (s = st_model_check_finite(r->m, c->init_from, err))) /* read whole */
        return s;
    if ((s = run_lora_open(c, &r->m, err))) return s;  /* method lora: the adapters over the base */
    if ((s = run_poetx_open(c, r->dist.comm, &r->m, err))) return s; /* method poetx: R W0 P over the base */
    /* in memory the step trains a model with blocks through the executor (its own
     * activations); the model's own forward (LoRA, POET-X) needs its activations */
    if (c->device_budget <= 0 && !st_step_in_blocks(r->m) && (s = r->m->ops->alloc_acts(r->m, r->B, r->T, err)))
        return s;
    if (c->device_budget <= 0) return ST_OK;
    double chosen_budget = 0; /* the store's host budget, where the planner chose it */
    st_stream_plan plan;
    /* method lora: the executor streams the frozen base, its hook the adapters; method poetx: the
     * base (W0 in its blocks), its hook R and P and the base's ends (run_plan.c) */
    st_model *host_m = st_model_is_lora(r->m) ? st_lora_base(r->m) : st_model_is_poetx(r->m) ? st_poetx_base(r->m) : r->m;
    /* with state_paths the store holds what the method trains (the step updates it through the
     * store after the executor's backward, open_state): the executor over the base is the one of
     * the state in RAM, never a store's, and its plan is chosen as that one's */
    int method_store = host_m != r->m && c->state_paths[0];
    st_train_config *sc = method_store ? malloc(sizeof *sc) : NULL; /* large: not on the stack */
    if (method_store && !sc) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    if (sc) {
        *sc = *c;
        sc->state_paths[0] = 0;
    }
    if (!(s = st_arch_of_model(&r->arch, host_m, err)))
        s = run_open_streamed(sc ? sc : c, r->m, r->arch, r->be, r->dist.world, &r->dev, &r->sx, &chosen_budget, &plan,
                              err);
    free(sc);
    if (s) return s;
    if (chosen_budget > 0 && !(c->state_budget > 0)) c->state_budget = chosen_budget; /* run, recorded, resumed */
    /* the memory account again under the plan chosen (run_check's, which refuses, was the smallest
     * plan's): the run's record of it; the planner chose from the machine's measured speed, so a
     * plan over host_budget is said, not refused (a refusal here would depend on the machine's load) */
    double budgets[ST_MEM_TIER_COUNT] = {0, c->host_budget, 0};
    if ((s = st_train_mem_plan(c, &plan, &r->mem, err))) return s;
    st_err over = {0};
    if (c->host_budget > 0 && st_mem_plan_check(&r->mem, budgets, &over))
        st_log(1, "memory: under the plan chosen %s\n", over.msg);
    r->opt = st_stream_optim(r->sx); /* NULL for a hook's base (LoRA, POET-X): open_optimizer makes the method's */
    st_stream_set_params(r->sx, host_m->params); /* the device copies of the embedding and head */
    return ST_OK;
}

/* The optimizer's segments (weight decay by role; under ZeRO 1 and 2 this rank's shard) and,
 * with the state in RAM and not the one-process executor's, the optimizer. */
static st_status open_optimizer(train_run *r, st_err *err) {
    st_model *m = r->m;
    run_dist *d = &r->dist;
    if (!(r->segs = calloc((size_t)m->n_tensors, sizeof *r->segs))) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_params_decay_segments(m->tensors, m->n_tensors, (float)r->c.weight_decay, r->segs);
    run_poetx_lr_classes(m, r->segs, m->n_tensors); /* method poetx: Q's own learning rate */
    d->hi = m->n_params;
    r->n_opt_segs = m->n_tensors;
    r->opt_segs = r->segs;
    if (d->world > 1) {
        if (!(d->bounds = malloc(sizeof(size_t) * (size_t)(d->world + 1))))
            return st_errf(err, ST_ERR_NOMEM, "out of memory");
        st_zero_bounds(r->segs, m->n_tensors, m->n_params, d->world, d->bounds);
        if (d->zero > 0) {
            for (int k = 0; k < d->world; k++)
                if (d->bounds[k + 1] == d->bounds[k])
                    return st_errf(err, ST_ERR_INVALID, "key 'zero': %zu parameters are too few to shard over %d ranks "
                                   "(each shard is whole %d-element chunks; rank %d would hold none); use --zero 0",
                                   m->n_params, d->world, ST_OPTIM_SUMSQ_CHUNK, k);
            d->lo = d->bounds[d->rank];
            d->hi = d->bounds[d->rank + 1];
            if (!(r->opt_segs = calloc((size_t)m->n_tensors, sizeof *r->opt_segs)))
                return st_errf(err, ST_ERR_NOMEM, "out of memory");
            r->n_opt_segs = st_zero_clip_segments(r->segs, m->n_tensors, d->lo, d->hi, r->opt_segs);
        }
    }
    if ((!r->sx || d->world > 1 || st_stream_hook_base(r->sx)) && !r->c.state_paths[0])
        return st_optim_create(&r->opt, r->opt_segs, r->n_opt_segs, st_train_config_state_format(&r->c), err);
    return ST_OK;
}

/* The training data, and validation's when it is token files (a bad one is said now, not
 * at step 50). */
static st_status open_data(train_run *r, st_err *err) {
    st_status s = run_data_open(&r->td, &r->c, &r->dist, "data", r->c.data, r->m->vocab_size, err);
    if (s || (s = run_mix_open_run(&r->mix, &r->c, r->dist.comm, err))) return s;
    r->ev.spec = run_val_spec(&r->c);
    if (r->ev.spec && !st_train_config_data_embedded(r->ev.spec)) {
        if ((s = run_data_open(&r->ev.vd, &r->c, NULL, "val_data", r->ev.spec, r->m->vocab_size, err))) return s;
        st_data_loader_get_state(r->ev.vd.dl, &r->ev.start);
    }
    return ST_OK;
}

/* The training state: the disk store (opened, created or re-sharded), or a checkpoint to
 * resume, or a fresh start; metrics.jsonl cut back to the step resumed. */
static st_status open_state(train_run *r, st_err *err) {
    const st_train_config *c = &r->c;
    st_model *m = r->m;
    st_status s;
    size_t mix_bytes = c->state_paths[0] ? run_mix_blob_bytes(&r->mix) : 0;
    r->blob_bytes = sizeof *r->hs + mix_bytes + run_poetx_blob_bytes(c);
    if (!(r->hs = calloc(1, r->blob_bytes))) return st_errf(err, ST_ERR_NOMEM, "out of memory"); /* 4 KiB: not on the stack */
    r->hs->n_params = m->n_params;
    if (c->state_paths[0]) {
        run_mix_bind(&r->mix, r->hs + 1); /* the mixture's state committed with each step, after hs */
        run_poetx_bind(&r->px, c, (char *)(r->hs + 1) + mix_bytes, r->dist.comm); /* ... then POET-X's merge taken */
        if ((s = run_open_store(c, &r->dist, m, r->opt_segs, r->n_opt_segs, st_train_config_state_format(c), &r->td,
                                r->hs, r->blob_bytes, &r->store, err)))
            return s; /* agreed by the ranks */
        s = run_mix_resume_blob(&r->mix, st_store_manifest_path(r->store), err);
        if (!s) s = run_poetx_open_disk(&r->px, c, m, st_store_manifest_path(r->store), (long)r->hs->step,
                                        !c->resume[0], err);
        /* one rank's failure (a W0 file it cannot read) stops every rank now, not at the step's
         * first collective after the ranks' timeout */
        if ((s = run_agree(&r->dist, s, "opening the files beside the state store", err))) return s;
        /* the executor updates through the store; its device copies follow the host. A hook's
         * base (LoRA, POET-X) does not: the store holds the method's vector, which the step
         * updates (st_step_run), and POET-X's trainables and W0 reach the executor's copies
         * before the first step (its base_follows) */
        if (r->sx && r->dist.world == 1) {
            if (!st_stream_hook_base(r->sx) && (s = st_stream_attach_store(r->sx, r->store, r->hs, r->blob_bytes, err)))
                return s;
            st_stream_set_params(r->sx, st_stream_params(r->sx));
        }
    } else if (c->resume[0]) {
        char ck[2048], path[2200];
        if ((s = run_resolve_resume(c->resume, ck, sizeof ck, err))) return s;
        snprintf(path, sizeof path, "%s/model.safetensors", ck);
        if ((s = m->ops->load(m, path, err)) || (s = st_model_check_finite(m, path, err))) return s;
        /* written at any number of ranks: this rank's shard (or the whole state) of it */
        if ((s = st_train_state_load_shard(ck, r->hs, r->opt, r->segs, m->n_tensors, r->dist.lo, r->dist.hi, err)))
            return s;
        if ((s = run_data_restore_state(&r->td, r->hs, path, err))) return s;
        if (r->mix.on && (s = run_mix_load(&r->mix, ck, err))) return s;
        if (r->sx) st_stream_set_params(r->sx, st_stream_params(r->sx)); /* the device copies follow the host */
        st_log(1, "resumed from %s at step %llu\n", ck, (unsigned long long)r->hs->step);
    }
    if (r->mix.on && (s = run_mix_start(&r->mix, r->td.dl, err))) return s;
    if (r->dist.rank == 0 && c->resume[0] && (s = run_metrics_truncate(c->run_dir, r->hs->step, err))) return s;
    if (r->hs->step > 0 && (long)r->hs->step >= r->end) /* said, never a silent zero-step run */
        st_log(1, "nothing to train: the run is at step %llu and %s is %ld; give --steps N with N > %llu to "
               "train further\n", (unsigned long long)r->hs->step, r->end == c->steps ? "steps" : "stop_at", r->end,
               (unsigned long long)r->hs->step);
    return ST_OK;
}

/* The step (strata/step.h): in memory or streamed, the ranks' hook, the documents. */
static st_status open_step(train_run *r, st_err *err) {
    const st_train_config *c = &r->c;
    st_status s;
    size_t n = (size_t)r->B * r->T * (size_t)c->grad_accum;
    /* under ranks the executor (if any) computes each micro-batch's gradient, the step does the
     * rest; the updated weights are gathered while the next step's forward runs, and whatever
     * else reads them (validation, a sample, a checkpoint, the saved model) waits for them first */
    st_step_setup su = {.m = r->m, .opt = r->opt, .store = r->store, .sx = r->sx, .max_micro = (int)c->grad_accum};
    if ((s = st_train_config_act_dtype(c, &su.act_dtype, err))) return s; /* in memory: the executor's sets */
    if (r->dist.world > 1) {
        su.comm = r->dist.comm;
        su.zero = r->dist.zero;
        su.bounds = r->dist.bounds;
        su.overlap_gather = 1;
    }
    if ((s = st_step_create(&r->stp, &su, err))) return s;
    if ((s = run_docs_open(&r->docs, c, r->td.dl, r->dist.comm, r->lead, r->hs->step, c->resume[0] != 0, &r->mix, err)))
        return s;
    if (r->docs.on) st_step_set_row_hook(r->stp, run_docs_row_hook, &r->docs); /* it calls mix's */
    else if (r->mix.on) st_step_set_row_hook(r->stp, run_mix_row_hook, &r->mix);
    if (c->doc_mask != 0) { /* document-aware packing (unset: on), in memory and streamed */
        r->positions = malloc(sizeof(int32_t) * n);
        r->doc_start = malloc(sizeof(int32_t) * n);
        if (!r->positions || !r->doc_start) return st_errf(err, ST_ERR_NOMEM, "out of memory");
        st_step_set_docs(r->stp, r->positions, r->doc_start);
    } else if (r->lead) {
        st_log(1, "doc_mask 0: rows are attended whole (positions 0..seq-1), packed documents see each other\n");
    }
    r->inputs = malloc(sizeof(int32_t) * n);
    r->targets = malloc(sizeof(int32_t) * n);
    if (!r->inputs || !r->targets) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    return ST_OK;
}

/* What the run writes as it goes: metrics.jsonl, TensorBoard events (rank 0), the trace and
 * the per-step monitor (each rank: rank r's in RUN_DIR/rank_r/), the opening lines. */
static st_status open_outputs(train_run *r, st_err *err) {
    const st_train_config *c = &r->c;
    st_status s;
    char path[2200];
    st_run_path(path, sizeof path, c->run_dir, ST_RUN_METRICS);
    if (r->lead && !(r->metrics = fopen(path, "a")))
        return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (r->lead && (s = st_prof_tb_open(&r->tb, c->run_dir, err))) return s;
    if (!r->quiet) {
        char desc[256];
        r->m->ops->describe(r->m, desc, sizeof desc);
        printf("model %s: %zu parameters (%s), batch %d x seq %d x accum %d, %ld steps, run dir %s\n",
               c->init_from[0] ? c->init_from : c->model, r->m->n_params, desc, r->B, r->T, c->grad_accum, c->steps,
               c->run_dir);
        if (r->dist.world > 1)
            printf("%d ranks over %s, ZeRO stage %d, %d threads a rank: a global batch of %d x %d x %d sequences\n",
                   r->dist.world, st_comm_engine(r->dist.comm), r->dist.zero, r->threads, r->dist.world, r->B,
                   c->grad_accum);
    }
    r->flops_per_step = r->m->ops->flops_per_token(r->m, r->T) * r->step_tokens;
    char label[128], rank_dir[2200];
    snprintf(label, sizeof label, "strata train %s", c->model);
    st_run_rank_path(rank_dir, sizeof rank_dir, c->run_dir, r->dist.rank);
    if (!r->lead && c->trace && (s = st_mkdirs(rank_dir, err))) return s;
    if (!r->lead) snprintf(label, sizeof label, "strata train %s rank %d", c->model, r->dist.rank);
    st_prof_run_config pc = {.run_dir = r->lead ? c->run_dir : rank_dir, .trace = c->trace, .label = label,
                             .flops_per_step = r->flops_per_step, .tokens_per_step = r->step_tokens,
                             .last_step = r->end, .host_plan_bytes = r->mem.tier_need[ST_MEM_TIER_HOST],
                             .progress = !r->quiet && r->dist.world == 1}; /* mpirun's forwarding garbles a live line */
    return st_prof_run_open(&r->pr, &pc, err);
}

static st_status run_open(train_run *r, st_err *err) {
    const st_train_config *c = &r->c;
    st_status s;
    r->B = c->batch;
    r->T = c->seq;
    r->end = c->stop_at > 0 && c->stop_at < c->steps ? c->stop_at : c->steps;
    r->quiet = c->quiet || !r->lead;
    r->step_tokens = (double)r->B * r->T * c->grad_accum * r->dist.world;
    r->last_loss = NAN;
    if ((s = open_model(r, err))) return s;
    /* config.json, once: the configuration as run, every choice made (plan_state, matmul
     * auto, the planner's state_budget) recorded as if given, so a resume runs the same */
    s = r->lead ? run_save_config(c, err) : ST_OK;
    if ((s = run_agree(&r->dist, s, "writing config.json", err))) return s;
    if ((s = open_optimizer(r, err)) || (s = open_data(r, err)) ||
        (s = open_state(r, err)) || (s = open_step(r, err)))
        return s;
    if ((s = open_outputs(r, err)) ||
        (s = st_run_stop_open(&r->stop, c, r->flops_per_step, (long)r->hs->step, r->end, err)))
        return s;
    if (r->stop.end < r->end) r->end = r->stop.end; /* a resumed run's decision */
    return ST_OK;
}

/* ------------------------------------------------------------------ the loop */

/* The step's micro-batches, in order, then one step (strata/step.h), and its accounting: the
 * loop's state (step, adam step, data position) moves on; with the disk state it is committed
 * with the update, so a skipped update still commits the loop's state alone. */
static st_status run_step(train_run *r, long step, train_step *o, st_err *err) {
    const st_train_config *c = &r->c;
    st_train_state_header *hs = r->hs;
    st_status s = ST_OK;
    double t0 = st_now();
    st_prof_step_begin(r->pr, step);
    for (long k = 0; k < c->grad_accum && !s; k++) {
        size_t at = (size_t)k * r->B * r->T;
        st_prof_span pd = st_prof_begin(ST_PROF_CAT_DATA, "data wait", -1);
        s = run_data_next(&r->td, r->B, r->T, r->inputs + at, r->targets + at, r->positions ? r->positions + at : NULL,
                          r->doc_start ? r->doc_start + at : NULL, err);
        st_prof_end(&pd);
        if (!s) run_mix_note_sources(&r->mix, (int)k, r->td.source);
        if (!s) run_docs_note(&r->docs, (int)k, r->td.dl);
    }
    if (s) return s;
    /* method poetx: Q's rate on the same schedule, the clip threshold ramped after a merge */
    st_step_hp shp = {.adam = {.lr = (float)st_run_stop_lr(&r->stop, step), .beta1 = (float)c->beta1,
                               .beta2 = (float)c->beta2, .eps = (float)c->eps, .step = (long)hs->adam_step + 1,
                               .grad_scale = 1.0f, .lr2 = (float)st_run_stop_lr_peak(&r->stop, step, run_poetx_lr(c))},
                      .grad_clip = (float)run_poetx_clip_at(c, step)};
    if (r->store) { /* the loop's state after this step: committed with the update */
        hs->step = (uint64_t)step;
        run_data_save_state(&r->td, hs);
        hs->adam_step++;
        run_mix_stage(&r->mix, 1); /* the bandit before this step's update; the row hook writes the sums */
        shp.blob = hs;
        shp.blob_bytes = r->blob_bytes;
        run_poetx_stage(&r->px, c, &shp); /* method poetx: Q's reset after a merge, committed with it */
    }
    if ((s = st_step_run(r->stp, (int)c->grad_accum, r->B, r->T, r->inputs, r->targets, &shp, &o->sr, err)))
        return s;
    if (r->store) st_failpoint("train_update_committed"); /* tests: the store has the step, the mixture not yet */
    if ((s = run_mix_after_step(&r->mix, r->td.dl, err)) || (s = run_docs_after_step(&r->docs, step, err)) ||
        (s = run_poetx_after_step(c, r->m, r->opt, r->stp, step, err)) || /* method poetx: a merge every interval */
        (s = run_poetx_after_disk(&r->px, c, r->m, step, o->sr.skipped, err))) /* ... and W0's file */
        return s;
    /* a GPU's ops report nothing when they fail: a failed kernel or copy stops the run
     * here, before this step is logged or checkpointed, not trained on as garbage */
    if (r->dev && (s = st_backend_status(r->dev, err))) return st_err_prefix(err, "step %ld on device %s", step, c->device);
    o->step = step;
    o->loss = o->sr.loss;
    o->norm = o->sr.grad_norm;
    o->skipped = o->sr.skipped;
    if (!r->store && !o->skipped) hs->adam_step++;
    if (o->skipped) {
        st_log(1, "step %ld: non-finite gradient norm; update skipped, no state changed\n", step);
        if (r->store) { /* no update: only the loop's state moves on */
            hs->adam_step--;
            run_mix_stage(&r->mix, 0); /* the update made: nothing pending */
            if ((s = st_store_commit_blob(r->store, hs, r->blob_bytes, err))) return s;
        }
    } else if (r->store) {
        st_failpoint("train_step_committed"); /* committed, not yet logged */
    }
    o->lr = st_run_stop_lr(&r->stop, step);
    o->lr2 = shp.adam.lr2;
    o->clip = shp.grad_clip;
    hs->step = (uint64_t)step;
    run_data_save_state(&r->td, hs);
    o->dt = st_now() - t0;
    st_prof_step_end(r->pr);
    o->tok_s = r->step_tokens / o->dt;
    o->gflops = r->flops_per_step / o->dt / 1e9;
    r->last_loss = (float)o->loss;
    if (step > 1) {
        r->tok_s_sum += o->tok_s;
        r->timed++;
    }
    r->steps_run++;
    st_prof_progress_clear(r->pr);
    return ST_OK;
}

/* Validation every eval_every steps and at the last: after the step, outside its time. */
static st_status run_evaluate(train_run *r, train_step *o, st_err *err) {
    o->val = NAN;
    o->eval_s = 0;
    o->forecast_json[0] = 0;
    if (!r->lead || !r->ev.spec || (o->step % r->c.eval_every != 0 && o->step != r->end)) return ST_OK;
    st_status s = st_step_sync(r->stp, err);
    if (s) return s;
    double te = st_now();
    st_prof_span pv = st_prof_begin(ST_PROF_CAT_OTHER, "validation", -1);
    s = run_eval_loss(&r->c, r->m, r->stp, &r->ev, r->inputs, r->targets, r->positions, r->doc_start, &o->val, err);
    st_prof_end(&pv);
    if (s) return s;
    o->eval_s = st_now() - te;
    if ((s = st_prof_tb_scalar(r->tb, "val/loss", o->step, o->val, err)) ||
        (s = st_run_stop_eval(&r->stop, o->step, o->val, r->quiet, o->forecast_json, sizeof o->forecast_json, err)))
        return s;
    if (r->stop.fc_ok && !(s = st_prof_tb_scalar(r->tb, "forecast/forecast_final", o->step, r->stop.fc_final, err)))
        s = st_prof_tb_scalar(r->tb, "forecast/forecast_band", o->step, r->stop.fc_band, err);
    return s;
}

/* The stopping rule's decision, rank 0's on every rank, taken: the run ends at its end. */
static st_status run_stop_rule(train_run *r, long step, st_err *err) {
    st_status s = ST_OK;
    if (r->dist.world > 1 && r->c.eval_every > 0 && (step % r->c.eval_every == 0 || step == r->end))
        s = st_run_stop_share(&r->stop, r->dist.comm, r->lead, err);
    if (r->stop.end < r->end) r->end = r->stop.end;
    return s;
}

/* The step's record, one definition written three ways: the console line, a line of
 * metrics.jsonl (rank 0; a run whose metrics are lost is not a run users can read, so a
 * failed write stops it) and TensorBoard's scalars. */
static st_status run_log_step(train_run *r, const train_step *o, st_err *err) {
    const st_train_config *c = &r->c;
    long step = o->step;
    int has_val = r->lead && r->ev.spec && (step % c->eval_every == 0 || step == r->end);
    char vtxt[160] = "", vjson[640] = "";
    if (has_val) {
        char jv[32], jp[32]; /* a diverged model's loss is not a JSON number */
        snprintf(vtxt, sizeof vtxt, " | val %.4f (ppl %.2f)%s", o->val, exp(o->val), r->stop.line);
        snprintf(vjson, sizeof vjson, ",\"val_loss\":%s,\"val_ppl\":%s,\"eval_ms\":%.3f",
                 json_num(jv, o->val, "%.6f"), json_num(jp, exp(o->val), "%.4f"), o->eval_s * 1e3);
        snprintf(vjson + strlen(vjson), sizeof vjson - strlen(vjson), "%s", o->forecast_json);
    }
    if (!r->quiet && (step % c->log_every == 0 || step == r->end || vtxt[0]))
        printf("step %6ld/%ld | loss %.4f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | %6.1f GFLOP/s%s%s\n", step,
               c->steps, o->loss, o->lr, o->norm, o->dt * 1e3, o->tok_s, o->gflops, vtxt, o->skipped ? " | SKIPPED" : "");
    if (!r->lead) return ST_OK;
    char disk[256] = "";
    if (r->store && !o->skipped) { /* the disk state's share of the step */
        st_store_stats ss;
        st_store_get_stats(r->store, &ss);
        snprintf(disk, sizeof disk,
                 ",\"state_ms\":%.3f,\"state_read_bytes\":%llu,\"state_write_bytes\":%llu,"
                 "\"state_hit_rate\":%.3f,\"state_wait_ms\":%.3f",
                 ss.step_s * 1e3, (unsigned long long)ss.read_bytes, (unsigned long long)ss.write_bytes,
                 ss.n_subgroups ? (double)ss.hits / ss.n_subgroups : 0.0, (ss.read_wait_s + ss.write_wait_s) * 1e3);
    }
    char jloss[32], jnorm[32], jdist[160] = "", path[2200], jmix[48 + 16 * ST_DATA_MAX_SOURCES], jpoetx[80] = "";
    if (st_model_is_poetx(r->m)) /* the rates and threshold the update used (float, as the optimizer got them) */
        snprintf(jpoetx, sizeof jpoetx, ",\"poetx_lr\":%.6e,\"grad_clip\":%.6e", o->lr2, o->clip);
    run_mix_weights_json(&r->mix, jmix, sizeof jmix);
    if (r->dist.world > 1) /* this step's communication, rank 0's view */
        snprintf(jdist, sizeof jdist, ",\"ranks\":%d,\"comm_wait_ms\":%.3f,\"comm_sent_bytes\":%llu,"
                 "\"comm_received_bytes\":%llu", r->dist.world, o->sr.comm_wait_s * 1e3,
                 (unsigned long long)o->sr.sent_bytes, (unsigned long long)o->sr.received_bytes);
    st_run_path(path, sizeof path, c->run_dir, ST_RUN_METRICS);
    int mfault = st_iofault("file.write", path);
    if (mfault) errno = mfault > 0 ? mfault : ENOSPC;
    int mn = mfault ? -1
                    : fprintf(r->metrics,
                              "{\"step\":%ld,\"loss\":%s,\"lr\":%.6e,\"grad_norm\":%s,\"step_ms\":%.3f,\"tokens_per_s\":%.1f,"
                              "\"achieved_gflops\":%.3f,\"tokens\":%llu,\"skipped\":%s%s%s%s%s%s%s}\n",
                              step, json_num(jloss, o->loss, "%.6f"), o->lr, json_num(jnorm, o->norm, "%.6f"),
                              o->dt * 1e3, o->tok_s, o->gflops,
                              (unsigned long long)step * (unsigned long long)r->step_tokens,
                              o->skipped ? "true" : "false", vjson, disk, jdist, jmix, jpoetx, st_prof_step_json(r->pr));
    if (mn < 0 || fflush(r->metrics) != 0) {
        int e = errno ? errno : EIO;
        return st_errf(err, e == ENOSPC ? ST_ERR_NOSPACE : ST_ERR_IO, "%s: cannot write step %ld's metrics: %s; %s",
                       path, step, strerror(e),
                       r->store ? "the state store holds the last committed step: free space, then --resume"
                                : "the last checkpoint is intact: free space, then --resume");
    }
    const st_prof_step_stats *ps = st_prof_step_last(r->pr);
    const char *tags[] = {"train/loss", "train/lr", "train/grad_norm", "perf/step_ms", "perf/tokens_per_s",
                          "perf/achieved_gflops", "memory/host_rss_bytes", "memory/host_peak_bytes",
                          "memory/host_plan_bytes"};
    double vals[] = {o->loss, o->lr, o->norm, o->dt * 1e3, o->tok_s, o->gflops, ps ? ps->host_rss_bytes : 0,
                     ps ? ps->host_peak_bytes : 0, r->mem.tier_need[ST_MEM_TIER_HOST]};
    return st_prof_tb_scalars(r->tb, step, tags, vals, (int)(sizeof vals / sizeof vals[0]), err);
}

/* What the model writes now, after the first tokens of this step's batch: the host weights
 * (also under streaming), untouched activations, its own RNG. */
static st_status run_sample(train_run *r, long step, st_err *err) {
    const st_train_config *c = &r->c;
    if (c->sample_every <= 0 || r->quiet || (step % c->sample_every != 0 && step != r->end)) return ST_OK;
    char label[64];
    snprintf(label, sizeof label, "sample at step %ld: ", step);
    st_status s = st_step_sync(r->stp, err);
    if (s) return s;
    st_err serr = {0};
    if (st_generate_print_sample(r->m, r->inputs, r->T < 16 ? r->T : 16, 96, c->seed + (uint64_t)step, label, stdout,
                                 &serr))
        st_log(1, "step %ld: no sample: %s\n", step, serr.msg);
    return ST_OK;
}

/* max_skipped_steps consecutive skipped steps stop the run with an error. */
static st_status run_check_skipped(train_run *r, const train_step *o, st_err *err) {
    r->skipped_run = o->skipped ? r->skipped_run + 1 : 0;
    if (r->skipped_run < r->c.max_skipped_steps) return ST_OK;
    return st_errf(err, ST_ERR_NONFINITE,
                   "steps %ld to %ld all had a non-finite gradient norm (key 'max_skipped_steps' is %ld): the "
                   "model or the data produces NaN or Inf; lower 'lr', check the data, or resume from the last "
                   "checkpoint in %s",
                   o->step - r->skipped_run + 1, o->step, r->c.max_skipped_steps, r->c.run_dir);
}

/* Whether the caller asked the run to stop (Ctrl-C): a signal reaches the ranks at different
 * steps, so they agree and stop at the same one. */
static st_status run_stop_requested(train_run *r, int *stop, st_err *err) {
    *stop = r->stop_flag && *r->stop_flag;
    if (r->dist.world == 1) return ST_OK;
    double st1[1] = {*stop};
    st_status s = st_comm_allreduce_f64(r->dist.comm, st1, 1, "stop flag", err);
    *stop = st1[0] > 0;
    return s;
}

/* Every ckpt_every steps, at the last and on a stop (the disk state commits every step: it
 * is its own checkpoint); the oldest complete ones pruned. */
/* What a checkpoint holds beyond the weights, state and configuration: the online mixture's
 * state, written inside it before it is committed. */
static st_status write_mix(void *ctx, const char *dir, st_err *err) { return run_mix_save(ctx, dir, err); }
static const run_ckpt_extra *ckpt_extra(train_run *r) {
    static run_ckpt_extra none = {0};
    r->extra = r->mix.on ? (run_ckpt_extra){write_mix, &r->mix} : none;
    return &r->extra;
}

static st_status run_checkpoint(train_run *r, long step, int stop, st_err *err) {
    const st_train_config *c = &r->c;
    if (r->store || !((c->ckpt_every > 0 && step % c->ckpt_every == 0) || step == r->end || stop)) return ST_OK;
    st_prof_span pw = st_prof_begin(ST_PROF_CAT_IO, "checkpoint write", -1);
    st_status s = st_step_sync(r->stp, err);
    if (s || (s = run_save_checkpoint(c, &r->dist, r->m, r->opt, r->hs, ckpt_extra(r), err))) return s;
    char path[2200];
    st_run_checkpoint_path(path, sizeof path, c->run_dir, (unsigned long long)step);
    st_prof_end_bytes(&pw, st_prof_dir_bytes(path));
    if (r->lead) run_prune_checkpoints(c);
    r->saved_at_end = step == r->end || stop;
    return ST_OK;
}

static st_status run_loop(train_run *r, st_err *err) {
    st_status s = ST_OK;
    while (!s && (long)r->hs->step < r->end) {
        train_step o;
        int stop = 0;
        long step = (long)r->hs->step + 1;
        if ((s = run_step(r, step, &o, err)) || (s = run_evaluate(r, &o, err)) || (s = run_log_step(r, &o, err)) ||
            (s = run_stop_rule(r, step, err)) || (s = run_sample(r, step, err)))
            break;
        st_prof_progress(r->pr, step, o.loss);
        if ((s = run_check_skipped(r, &o, err)) || (s = run_stop_requested(r, &stop, err)) ||
            (s = run_checkpoint(r, step, stop, err)))
            break;
        if (stop) {
            if (r->lead) st_log(1, "stopped at step %ld; resume with: strata train --resume %s\n", step, r->c.run_dir);
            break;
        }
    }
    return s;
}

/* ------------------------------------------------------------------ the end */

/* The last update's weights on every rank; the last checkpoint where the loop wrote none;
 * with the disk state the weights beside it for users; --save_hf. */
static st_status run_finish(train_run *r, st_train_result *res, st_err *err) {
    const st_train_config *c = &r->c;
    st_train_state_header *hs = r->hs;
    char path[2200];
    st_status s = st_step_sync(r->stp, err);
    if (!s && !r->store && !r->saved_at_end && hs->step > 0 && c->resume[0] == 0 && (long)hs->step == r->end) {
        s = run_save_checkpoint(c, &r->dist, r->m, r->opt, hs, ckpt_extra(r), err);
    }
    if (r->store && !s && r->lead) { /* the store is the checkpoint; the weights go beside it for users */
        st_run_path(path, sizeof path, c->run_dir, ST_RUN_MODEL);
        s = r->m->ops->save(r->m, path, err);
    }
    if (!s && c->save_hf[0] && r->lead) { /* the whole model is on every rank after the gather */
        if ((s = r->m->ops->save_hf(r->m, c->save_hf, st_train_config_save_hf_dtype(c), err))) return s;
        if (!r->quiet) printf("wrote a Hugging Face model directory: %s\n", c->save_hf);
    }
    if (!s && r->lead) s = run_lora_finish(c, r->m, r->quiet, err); /* save_adapter */
    if (!s && res) {
        res->steps_done = (long)hs->step;
        res->steps_run = r->steps_run;
        res->final_loss = r->last_loss;
        res->tokens_per_s = r->timed ? r->tok_s_sum / r->timed : 0;
        res->n_params = r->m->n_params;
    }
    return s;
}

/* Everything the run opened, in reverse; a trace or an event file that cannot be finished
 * fails the run only if nothing else did. */
static st_status run_close(train_run *r, st_status s, st_err *err) {
    st_run_stop_close(&r->stop);
    if (r->pr) {
        st_err perr = {0};
        st_status ps = st_prof_run_close(r->pr, &perr);
        if (ps && !s) s = st_errf(err, ps, "%s", perr.msg);
    }
    st_store_close(r->store);
    free(r->hs);
    if (r->metrics) fclose(r->metrics);
    if (r->tb) {
        st_err terr = {0};
        st_status ts = st_prof_tb_close(r->tb, &terr);
        if (ts && !s) s = st_errf(err, ts, "%s", terr.msg);
    }
    free(r->inputs);
    free(r->targets);
    free(r->positions);
    free(r->doc_start);
    if (s) { /* nothing may still be landing in the weights when they are freed */
        st_err ignored = {0};
        st_step_sync(r->stp, &ignored);
    }
    st_step_destroy(r->stp);
    r->stp = NULL;
    run_data_close(&r->td);
    run_mix_close(&r->mix);
    run_docs_close(&r->docs);
    run_data_close(&r->ev.vd);
    if (r->sx && r->opt == st_stream_optim(r->sx)) r->opt = NULL; /* the executor's own (one process) */
    st_optim_free(r->opt); /* in memory, or a rank's shard under streaming */
    if (r->sx) st_stream_exec_free(r->sx); /* the host vectors are the model's */
    st_model_free(r->m);
    st_arch_free(r->arch);
    st_backend_free(r->dev); /* also when the executor could not be created on it */
    st_backend_free(r->be);
    free(r->dist.bounds);
    if (r->opt_segs != r->segs) free(r->opt_segs);
    free(r->segs);
    st_lock_release(&r->lock);
    return s;
}

st_status st_train_run(const st_train_config *c, st_train_result *res, st_err *err) {
    return st_train_run_with(c, NULL, res, err);
}

st_status st_train_run_with(const st_train_config *c, const st_train_hooks *hooks, st_train_result *res, st_err *err) {
    train_run *r = calloc(1, sizeof *r);
    if (!r) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_status s = run_check(r, c, hooks, err);
    if (!s) s = run_open_dir(r, err);
    if (s) { /* nothing was opened; a lock taken before another rank failed is let go */
        st_lock_release(&r->lock);
        free(r);
        return s;
    }
    s = run_open(r, err);
    if (!s) s = run_loop(r, err);
    if (!s) s = run_finish(r, res, err);
    s = run_close(r, s, err);
    free(r);
    return s;
}

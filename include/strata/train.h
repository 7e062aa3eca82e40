/* train.h - the training run: configuration, checkpoints, the loop.
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_train_config cfg;
 *     st_train_result res;
 *     st_train_config_defaults(&cfg);
 *     const char *keys[][2] = {{"model", "gpt2-tiny"}, {"vocab_size", "256"}, {"seq", "16"},
 *                              {"steps", "100"}, {"run_dir", "runs/tiny"}}; // any key, as text
 *     st_status s = ST_OK;
 *     for (size_t i = 0; i < sizeof keys / sizeof keys[0] && s == ST_OK; i++)
 *         s = st_train_config_set(&cfg, keys[i][0], keys[i][1], &err);
 *     if (s == ST_OK) s = st_train_run(&cfg, &res, &err); // the embedded corpus; writes runs/tiny
 *     if (s != ST_OK) {
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     printf("step %ld, loss %.3f\n", res.steps_done, res.final_loss);
 *
 * End of example.
 *
 * A run directory holds config.json (the resolved configuration), metrics.jsonl (one
 * JSON object per step) and checkpoints/step_NNNNNNNN/{model.safetensors,
 * train_state.bin}, with checkpoints/latest naming the newest complete one.
 */
#ifndef STRATA_TRAIN_H
#define STRATA_TRAIN_H

#include <stdio.h>

#include "strata/core.h"
#include "strata/model.h"
#include "strata/optim.h"
#include "strata/plan.h"

typedef struct st_train_config {
    char model[64];       /* preset name; the shape keys below override it when > 0 */
    int vocab_size, max_seq, n_layer, n_head, n_embd;
    int batch, seq, grad_accum;
    long steps, warmup_steps, stop_at, ckpt_every, log_every;
    double lr, min_lr_frac, weight_decay, beta1, beta2, eps, grad_clip;
    char schedule[16];    /* cosine, wsd or constant (strata/schedule.h) */
    double decay_frac;    /* wsd: the decay's length as a fraction of steps */
    char decay_shape[16]; /* wsd: linear, 1-sqrt or cosine */
    char stop_rule[64];   /* "" / none, marginal:EPS, target:LOSS or budget:FLOPS (strata/forecast.h) */
    uint64_t seed;
    char data[1024];      /* "embedded" or sources "path[:weight],..." (see --help) */
    char val_data[1024];  /* validation sources, same syntax; "" : the embedded corpus's held-out
                             tail when data is "embedded", else none; "none": off */
    long eval_every;      /* validation every N steps and at the last step (0: never) */
    long eval_tokens;     /* tokens per validation (rounded up to whole batches; 0: 8 batches) */
    long keep_checkpoints; /* keep the newest N complete checkpoints (0: all) */
    long sample_every;    /* print a short generated sample every N steps and at the last (0: never) */
    long max_skipped_steps; /* this many consecutive skipped (non-finite) steps end the run with an error */
    char run_dir[1024];
    char resume[1024];    /* run directory or checkpoint directory to resume from */
    char optim_state[16]; /* "f32" or "8bit" */
    int threads;
    int quiet;            /* no per-step lines on stdout */
    int trace;            /* 1: write run_dir/trace.json (Chrome trace JSON, Perfetto); 2: odd steps only */
    double host_budget;   /* bytes of host memory the run must fit (0: MemAvailable) */
    char init_from[1024]; /* a Hugging Face model directory to fine-tune (its config.json sets the shape) */
    char save_hf[1024];   /* at the end, write the model as a Hugging Face directory here */
    char save_hf_dtype[8]; /* f32 or bf16 */
    double device_budget; /* > 0: layer streaming with this many device bytes (GPT-2) */
    char device[16];      /* the device the layers stream to (st_backend_device_create): "cpu"
                             (default), "cuda" or "cuda:N" (needs device_budget > 0) */
    char state_paths[2048]; /* comma-separated directories: keep the master weights and optimizer
                               moments there (the disk tier, strata/store.h), committed every step */
    double state_budget;  /* host bytes for the state store's buffers (0: ST_STORE_HOST_BUDGET_DEFAULT) */
    char state_profile[1024]; /* strata probe -o profile: split the state by the paths' bandwidth */
    char matmul[8];       /* "fp32", "tf32" or "bf16": the device's matmuls (st_backend_set_matmul) */
    char act_dtype[8];    /* "f32" or "bf16": the activations the step keeps for the backward
                             (st_stream_plan.act_dtype; st_train_config_act_dtype) */
    int force_resume;     /* 1: resume even with another matmul mode or act_dtype than the run's
                             (warned); this resume only: recorded as 0 */
    char plan_head[12];   /* "resident" (the head on the device whenever it fits) or "fastest"
                             (st_train_config_plan_head) */
    char plan_state[8];   /* "fixed" (optim_state and state_paths as given) or "auto": of f32 in host
                             memory, 8-bit in host memory, f32 on state_paths, 8-bit on state_paths,
                             the fitting one with the fastest predicted step (st_train_state_choose) */
    char plan[1024];      /* the stream plan (device_budget > 0): "auto" (the planner, now) or a plan
                             file (plan.h: strata plan -o, or a streamed run's RUN_DIR/plan.json) */
    char act[1024];       /* activation choices the plan must make (st_plan_act_parse): "auto" (none),
                             keep / offload / recompute for every block, or BLOCKS:CHOICE items */
    int zero;             /* under mpirun: ZeRO stage 0, 1 or 2 (strata/dist.h) */
    double dist_timeout;  /* under mpirun: seconds a rank waits for another */
    int doc_mask;         /* 1: positions restart at each document of a packed row and attention stays
                             inside it; 0: rows attended whole; -1 (default): 1, in memory and
                             under device_budget */
    char method[8];       /* "full" (every parameter trains, the default), "lora" (adapters over
                             the frozen base, strata/lora.h; st_train_config_method) or "poetx"
                             (W = R W0 P over the frozen matmul weights, strata/poetx.h) */
    int lora_rank;        /* method lora: the adapters' rank r */
    double lora_alpha;    /* method lora: lora_alpha (the term is scaled by alpha / r) */
    char lora_targets[256]; /* method lora: the projections adapted, comma-separated ("": the
                               family's default, as PEFT's: c_attn for GPT-2, q_proj,v_proj) */
    char save_adapter[1024]; /* method lora: at the end, write a PEFT adapter directory here */
    char init_adapter[1024]; /* method lora: the adapters start from this PEFT adapter directory (strata's
                                save_adapter or PEFT's save_pretrained) instead of A random, B zero; an
                                init_from that is an adapter directory becomes its base and this */
    int poetx_block;      /* method poetx: the block size b of R and P (strata/poetx.h) */
    int poetx_terms;      /* method poetx: the Neumann terms k of the Cayley polynomial */
    int poetx_merge_every; /* method poetx: steps between merges of R and P into W0 */
    int poetx_recompute;  /* method poetx: 1 recomputes the rotated inputs in the backward (st_poetx_config.recompute);
                             -1 auto (st_train_poetx_recompute_choose) */
    char frozen_dtype[8]; /* methods poetx and lora: W0's precision, "fp32" (default), "bf16" or
                             "int8" (st_poetx_config.frozen_dtype, st_lora_config.frozen_dtype;
                             st_train_config_frozen_dtype) */
    double poetx_lr;      /* method poetx: the packed Q's peak learning rate (the schedule's shape as lr's);
                             -1 (default): lr */
    int poetx_clip_ramp;  /* method poetx: steps after each merge over which the clip threshold ramps
                             from poetx_clip_start * grad_clip back to grad_clip (0: off) */
    double poetx_clip_start; /* method poetx: the ramp's first threshold as a fraction of grad_clip */
    int poetx_adam_restart; /* method poetx: 1 (default) zeroes Q's Adam moments at each merge */
    char poetx_init[16];  /* method poetx: "auto" (default: orthogonal from scratch, model with init_from;
                             resolved by the run), "model" (W0 as the model initialises or loads it) or
                             "orthogonal" (st_poetx_orthogonal_base: one singular value, poetx_init_gain x
                             the initialisation's RMS one) */
    double poetx_init_gain; /* poetx_init orthogonal: the singular value over the initialisation's RMS one */
    char mix[8];          /* "weights" (the data list's weights; default) or "online" (the sources' weights
                             adapted from their training loss, st_train_config_mix_online) */
    double mix_smoothing; /* online: the rewards' moving average (default 0.9) */
    int mix_delay;        /* online: steps from an update of the weights to their use (default 2) */
    int doc_signals;      /* MiB of per-document records in RUN_DIR/doc_signals.bin at most; 0 (default): off */
} st_train_config;

/* What a run is given besides its configuration: the process's handles, not keys (they are
 * neither saved in config.json nor compared between ranks). */
typedef struct st_train_hooks {
    volatile int *stop_flag; /* set to nonzero (e.g. by SIGINT) to checkpoint and stop; NULL: none */
    struct st_comm *comm;    /* the ranks of this run (st_comm_open); NULL: one process */
} st_train_hooks;

void st_train_config_defaults(st_train_config *c);
/* Set one key from text, with the key's type and range checked. */
st_status st_train_config_set(st_train_config *c, const char *key, const char *value, st_err *err);
/* Read a JSON object of keys; every key must be known. */
st_status st_train_config_load_json(st_train_config *c, const char *path, st_err *err);
st_status st_train_config_save_json(const st_train_config *c, const char *path, st_err *err);
/* One CRC-32C per key of c (its name and value), in the keys' order: ranks compare theirs
 * at start. How many (at most cap); st_train_config_key_name(i) names the i-th. */
int st_train_config_key_crcs(const st_train_config *c, uint32_t *out, int cap);
const char *st_train_config_key_name(int i);
/* The known keys, comma-separated, for help text. */
const char *st_train_config_keys(void);
/* One line per key with its meaning, for --help. */
void st_train_config_print_help(FILE *f);
/* Resolve the model's shape (a preset with overrides, or init_from; any family, through
 * st_model_resolve) and check the configuration against it: seq, optim_state, save_hf_dtype,
 * the embedded corpus's vocabulary, a size no machine holds. shape (NULL: not wanted)
 * receives the shape, its act_bytes at batch x seq. */
st_status st_train_config_resolve(const st_train_config *c, st_model_shape *shape, st_err *err);
/* st_train_config_resolve and the layer-streaming keys (plan, act): the whole configuration. */
st_status st_train_config_check(const st_train_config *c, st_err *err);
/* plan_head as the planner's st_plan_options.prefer_resident_head: ST_PLAN_HEAD_RESIDENT_IF_FITS
 * (resident) or ST_PLAN_HEAD_RESIDENT_ON_TIE (fastest). */
int st_train_config_plan_head(const st_train_config *c);
/* 1 when key 'mix' is online (strata/data.h, st_data_mix_online), 0 for weights. */
int st_train_config_mix_online(const st_train_config *c);
/* The keys optim_state and save_hf_dtype as what they name (a checked configuration's). */
st_optim_state_format st_train_config_state_format(const st_train_config *c);
st_dtype st_train_config_save_hf_dtype(const st_train_config *c);
/* The key act against a model of n_blocks blocks: fixed[n_blocks] each block's choice
 * (ST_PLAN_ACT_FREE: the planner's), *n_fixed how many are fixed. Refused naming the key: act for
 * a bad spec; act or, where act is auto, device_budget for more blocks than layer streaming takes. */
st_status st_train_config_act(const st_train_config *c, int n_blocks, unsigned char *fixed, int *n_fixed, st_err *err);
/* plan_state auto: the planner places the optimizer state (st_train_state_choose). */
int st_train_config_places_state(const st_train_config *c);
/* The key plan as a plan file to run (NULL: auto, the planner's plan). */
const char *st_train_config_plan_file(const st_train_config *c);
/* The key method as what it names: *lora 1 for "lora", 0 for "full" and "poetx"; refused naming
 * the key. Refused too, naming key frozen_dtype: a value not fp32, bf16 or int8, and bf16 or int8
 * with method full. */
st_status st_train_config_method(const st_train_config *c, int *lora, st_err *err);
/* The key act_dtype's one parse: "f32" ST_F32, "bf16" ST_BF16; else ST_ERR_INVALID naming the key. */
st_status st_train_config_act_dtype(const st_train_config *c, st_dtype *out, st_err *err);
/* The data key's (or a copy of it) reading "embedded": the built-in corpus, no data list. */
int st_train_config_data_embedded(const char *data);
/* A validation set this configuration has: val_data given and not "none", or the embedded
 * corpus's held-out tail (evaluations every eval_every steps aside). */
int st_train_config_has_val(const st_train_config *c);
/* The key method as its enum (ST_TRAIN_METHOD_FULL for a value st_train_config_method refuses). */
typedef enum st_train_method { ST_TRAIN_METHOD_FULL = 0, ST_TRAIN_METHOD_LORA = 1, ST_TRAIN_METHOD_POETX = 2 } st_train_method;
st_train_method st_train_config_method_of(const st_train_config *c);
/* The key frozen_dtype as strata/poetx.h's st_frozen_dtype (0 fp32, 1 bf16, 2 int8), -1 for a
 * value st_train_config_method refuses. */
int st_train_config_frozen_dtype(const st_train_config *c);
/* The shape overrides c sets (0: the preset's value). */
st_model_overrides st_train_config_overrides(const st_train_config *c);

/* The state_paths key cut into directories (kept in buf, at most ST_STORE_MAX_PATHS), and
 * their relative bandwidths from state_profile when it is set (*weighted = 1). */
st_status st_train_state_paths(const st_train_config *c, char *buf, size_t cap, const char **paths, int *n,
                            double *weights, int *weighted, st_err *err);

struct st_mem_plan;
struct st_stream_plan;
/* The memory account of the run c configures (plan.h's st_plan_memory, from the executor's
 * tables): in memory, or streamed under plan (NULL: the smallest plan, every block
 * recomputed, before the planner has chosen); with state_paths the moments on disk and the
 * store's buffers in host memory; method lora or poetx through the model's own forward. */
st_status st_train_mem_plan(const st_train_config *c, const struct st_stream_plan *plan, struct st_mem_plan *out,
                            st_err *err);
/* Method poetx with poetx_recompute -1 (auto): 0 (each weight's rotated input kept for the
 * backward) where the run's memory account with it fits host_budget (or MemAvailable), else 1
 * (formed again in the backward: the same numbers, less memory, a slower step); c's key set
 * to the choice and why written to why (empty where there was nothing to choose). strata
 * train and strata plan choose alike. */
st_status st_train_poetx_recompute_choose(st_train_config *c, char *why, size_t cap, st_err *err);

/* ------------------------------------------------------------------ the plan a run gets
 * (src/run/plan_state.c): the run's configuration put to the planner (strata/plan.h). */

/* The prediction of plan p for configuration c (its batch, seq, optim_state, weight_decay,
 * state_paths, state_profile, state_budget) on the machine hw. pred: in, the solver's
 * (st_plan_stream_ex) for p; out, unchanged with the state in RAM (c->state_paths empty),
 * else st_plan_predict_disk's (solve_s, program_s, optimal and device_budget kept): each
 * path's mixed bandwidth from c->state_profile (a strata probe -o file), else from a probe
 * of probe_bytes written in the path now (cd->probed; 0: never probe, and fail saying to
 * give state_profile); the CRC-32C rate measured now (about 0.1 s); the update beside the
 * backward per st_plan_store_beside; the update of c->optim_state's format per
 * st_plan_optim_ns_per_param; cpu_slowdown 1 (the CPU backend); the store's host budget
 * c->state_budget, or where that is 0 and c->plan "auto" chosen by st_plan_state_budget
 * (cd->budget_chosen; the caller runs cd->dc.state_budget). cd: what was used and the
 * store's figures (st_plan_config_disk_to_json: the plan file's key "disk"). */
st_status st_train_plan_predict(const st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                                 const st_stream_plan *p, unsigned long long probe_bytes, st_plan_prediction *pred,
                                 st_plan_config_disk *cd, st_err *err);
/* st_train_plan_predict, but where the paths' bandwidths would be probed now (no
 * state_profile) and reuse_plan names a plan file (a resumed run's RUN_DIR/plan.json) whose
 * "disk" figures are for the same state_paths, those are taken instead (cd->reused): a resume
 * probes no path. A reuse_plan that is missing or holds other paths is no error (the paths
 * are probed). */
st_status st_train_plan_predict_ex(const st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                                    const st_stream_plan *p, unsigned long long probe_bytes, const char *reuse_plan,
                                    st_plan_prediction *pred, st_plan_config_disk *cd, st_err *err);
/* Which placements fit configuration c (plan_state auto). Refused with ST_ERR_NOMEM, naming
 * each placement's bytes, where none fits. */
st_status st_train_state_fit(const st_train_config *c, st_plan_state_choice *ch, st_err *err);
/* Predict and choose (above) for c and model a on the machine hw (NULL: the first that fits),
 * and set c's optim_state, state_paths (emptied for host memory) and plan_state "fixed", so
 * config.json records what runs and a resume runs the same. why: one line saying what was
 * chosen and why. */
st_status st_train_state_choose(st_train_config *c, const st_arch *a, const st_plan_profile *hw,
                               st_plan_state_choice *ch, char *why, size_t why_cap, st_err *err);

/* Candidate i as one line ("8bit in host memory: predicted step 0.0123 s"). */
void st_train_state_describe(const st_plan_state_choice *ch, int i, char *buf, size_t cap);

/* ------------------------------------------------------------------ a run's model, to sample */

/* A model and its weights from `from`: a run directory (its newest checkpoint, or the
 * final model.safetensors of a disk-state run), a checkpoint directory
 * (checkpoints/step_N), or a Hugging Face model directory (GPT2LMHeadModel or a Llama
 * family architecture). desc (may be NULL) gets one line saying which weights. The model is for
 * forwards (sampling, scoring): it has no gradient vector. */
st_status st_train_open_model(st_model **out, const char *from, st_backend *be, char *desc, size_t desc_cap,
                            st_err *err);

/* ------------------------------------------------------------------ the run directory
 * Every name strata gives under RUN_DIR, in one place (src/run/rundir.c), for train, sample,
 * report and inspect alike:
 *     config.json          the run's configuration (what a resume reads)
 *     metrics.jsonl        one line per step
 *     plan.json            layer streaming's plan as run; plan_profile.json the machine's figures
 *     strata.lock          held by the one process that runs it
 *     model.safetensors    the final weights of a run whose state is on disk
 *     report.html          strata report's page
 *     checkpoints/step_NNNNNNNN/  a checkpoint (ckpt.h names its files); checkpoints/latest
 *                          the newest complete one's name
 *     rank_R/              rank R's trace under mpirun
 * (trace.json and TensorBoard's events.out.tfevents.* are prof's, written where it is told.) */
typedef enum st_run_file {
    ST_RUN_CONFIG, ST_RUN_METRICS, ST_RUN_PLAN, ST_RUN_PLAN_PROFILE, ST_RUN_LOCK, ST_RUN_MODEL,
    ST_RUN_REPORT, ST_RUN_CHECKPOINTS, ST_RUN_LATEST
} st_run_file;
/* RUN_DIR/NAME into buf[cap]; snprintf's count (>= cap: cut short). */
int st_run_path(char *buf, size_t cap, const char *run_dir, st_run_file f);
/* RUN_DIR/checkpoints/step_NNNNNNNN (8 digits, zero-padded) into buf[cap]; snprintf's count. */
int st_run_checkpoint_path(char *buf, size_t cap, const char *run_dir, unsigned long long step);
/* RUN_DIR/rank_R into buf[cap]; snprintf's count. */
int st_run_rank_path(char *buf, size_t cap, const char *run_dir, int rank);

typedef struct st_train_result {
    long steps_done;  /* the run's step at the end */
    long steps_run;   /* steps this call trained (0: the run was already at its end) */
    float final_loss;
    double tokens_per_s;
    size_t n_params;  /* the model's parameters */
} st_train_result;

st_status st_train_run(const st_train_config *c, st_train_result *res, st_err *err);
/* st_train_run with the process's handles (NULL: none, as st_train_run). */
st_status st_train_run_with(const st_train_config *c, const st_train_hooks *hooks, st_train_result *res, st_err *err);

struct st_schedule;
/* The schedule the keys schedule, decay_shape, decay_frac, lr, min_lr_frac, steps and
 * warmup_steps give (strata/schedule.h), checked; a refusal names the key. */
st_status st_train_config_schedule(const st_train_config *c, struct st_schedule *sc, st_err *err);
/* Learning rate at step (1-based) of that schedule (cosine: linear warmup, then cosine to
 * min_lr_frac * lr); NaN for keys st_train_config_resolve refuses. */
double st_train_lr_at(const st_train_config *c, long step);


#endif

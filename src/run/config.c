/* config.c - the training configuration: one table of keys drives defaults,
 * parsing from text (--key value), JSON files, validation and saving. */
#include <errno.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileutil.h"
#include "strata/backend.h"
#include "strata/model.h"
#include "strata/plan.h"
#include "strata/poetx.h"
#include "strata/prof.h"
#include "strata/forecast.h"
#include "strata/schedule.h"
#include "strata/store.h"
#include "strata/train.h"

typedef enum { K_INT, K_LONG, K_U64, K_DOUBLE, K_STR } key_type;

typedef struct key_def {
    const char *name;
    key_type type;
    size_t offset, size; /* size: string capacity */
    double lo, hi;       /* numeric range, inclusive */
    const char *help;
} key_def;

#define OFF(f) offsetof(st_train_config, f)
#define STR(f) OFF(f), sizeof(((st_train_config *)0)->f)
static const key_def keys[] = {
    {"model", K_STR, STR(model), 0, 0, "model preset: GPT-2 (gpt2-mini, gpt2-124m, gpt2-350m) or Llama family (llama3.2-1b, qwen2.5-0.5b)"},
    {"init_from", K_STR, STR(init_from), 0, 0, "fine-tune a Hugging Face model directory (GPT-2, Llama, Qwen2, Qwen3, Mistral); its config.json sets the shape"},
    {"save_hf", K_STR, STR(save_hf), 0, 0, "write the final model as a Hugging Face directory here"},
    {"save_hf_dtype", K_STR, STR(save_hf_dtype), 0, 0, "dtype of --save_hf weights: f32 or bf16"},
    {"device_budget", K_DOUBLE, OFF(device_budget), 0, 0, 1e18, "bytes of device memory: > 0 streams the layers (any model)"},
    {"device", K_STR, STR(device), 0, 0, "where the layers stream to under device_budget: cpu (the host's cores; default), cuda or cuda:N (the CUDA backend on GPU N, built with cmake -DSTRATA_CUDA=ON; needs device_budget > 0); the state stays on the host, so a resume may change it"},
    {"plan", K_STR, STR(plan), 0, 0, "the stream plan under device_budget: auto (the planner chooses it now; saved to RUN_DIR/plan.json) or a plan file (strata plan --device_budget B -o FILE, or a run's plan.json) run exactly; without device_budget the file's budget is used"},
    {"matmul", K_STR, STR(matmul), 0, 0, "the precision of the matmuls: fp32 (default), bf16 (device cpu through oneDNN: AMX or AVX512-BF16, emulated elsewhere; device cuda's tensor cores), tf32 (device cuda only) or auto (bf16 where the device has bf16 matrix units, else fp32; the choice logged and recorded): fp32 in and out, products of tf32- or bf16-rounded inputs, fp32 accumulation"},
    {"act_dtype", K_STR, STR(act_dtype), 0, 0, "the activations each block keeps for its backward: f32 (default) or bf16 (kept, offloaded and recomputed sets rounded to bf16 after the forward and widened where the backward reads them: half their memory and their copies, one conversion each way; kept, offloaded and recomputed give the same bits; method full only)"},
    {"plan_head", K_STR, STR(plan_head), 0, 0, "where the planner puts the classifier (the vocabulary's head) under device_budget: resident (default: on the device whenever it fits, so the streamed step equals the in-memory one bit for bit; the predicted step may rise once as the budget grows, where the head first fits) or fastest (the fastest predicted plan, the head resident on a tie: the predicted step never rises with the budget; a chunked head equals the resident one to float rounding)"},
    {"act", K_STR, STR(act), 0, 0, "activation choices under device_budget, which the planner keeps while it chooses the rest: auto (none), keep, offload or recompute (every block), or BLOCKS:CHOICE items (0-3:recompute,11:keep); a budget they cannot fit is refused naming the bytes missing"},
    {"state_paths", K_STR, STR(state_paths), 0, 0, "dir[,dir...]: optimizer state and fp32 master weights on disk, committed every step (it is the checkpoint: no checkpoints/ are written; the final weights go to RUN_DIR/model.safetensors); resume with --resume RUN_DIR"},
    {"state_budget", K_DOUBLE, OFF(state_budget), 0, 0, 1e18, "host bytes for the disk state's buffers and cache (0: 256 MiB)"},
    {"plan_state", K_STR, STR(plan_state), 0, 0, "the optimizer state's format and tier: fixed (optim_state and state_paths as given) or auto (of f32 in host memory, 8-bit in host memory, f32 on state_paths, 8-bit on state_paths, those that fit host_budget, the one with the fastest predicted step (a disk one only with state_profile, or where none in host memory fits); recorded as fixed in config.json)"},
    {"state_profile", K_STR, STR(state_profile), 0, 0, "a strata probe -o profile: split the disk state across state_paths by their measured bandwidth (default: equal)"},
    {"vocab_size", K_INT, OFF(vocab_size), 0, 0, 0, "override the preset's vocabulary size (0: keep)"},
    {"max_seq", K_INT, OFF(max_seq), 0, 0, 0, "override the preset's maximum sequence length (0: keep)"},
    {"n_layer", K_INT, OFF(n_layer), 0, 0, 4096, "override the preset's layer count (0: keep)"},
    {"n_head", K_INT, OFF(n_head), 0, 0, 65536, "override the preset's head count (0: keep)"},
    {"n_embd", K_INT, OFF(n_embd), 0, 0, 65536, "override the preset's width (0: keep)"},
    {"batch", K_INT, OFF(batch), 0, 1, 1 << 20, "sequences per micro-batch"},
    {"seq", K_INT, OFF(seq), 0, 1, 1 << 20, "tokens per sequence"},
    {"grad_accum", K_INT, OFF(grad_accum), 0, 1, 1 << 20, "micro-batches per optimizer step"},
    {"steps", K_LONG, OFF(steps), 0, 0, 1e15, "optimizer steps in the whole run"},
    {"warmup_steps", K_LONG, OFF(warmup_steps), 0, 0, 1e15, "linear learning-rate warmup steps"},
    {"stop_at", K_LONG, OFF(stop_at), 0, 0, 1e15, "stop (with a checkpoint) after this step (0: run to steps)"},
    {"ckpt_every", K_LONG, OFF(ckpt_every), 0, 0, 1e15, "checkpoint every N steps (0: only at the end)"},
    {"log_every", K_LONG, OFF(log_every), 0, 1, 1e15, "print a line every N steps"},
    {"lr", K_DOUBLE, OFF(lr), 0, 0, 10, "peak learning rate"},
    {"min_lr_frac", K_DOUBLE, OFF(min_lr_frac), 0, 0, 1, "final learning rate as a fraction of lr (cosine, wsd)"},
    {"schedule", K_STR, STR(schedule), 0, 0, "the learning-rate schedule after the warmup: cosine (default), wsd (warmup, stable, then a decay over decay_frac of the run; a stop_rule may start it early) or constant"},
    {"decay_frac", K_DOUBLE, OFF(decay_frac), 0, 0, 1, "wsd: the decay's length as a fraction of steps"},
    {"decay_shape", K_STR, STR(decay_shape), 0, 0, "wsd: the decay's shape: linear, 1-sqrt (default) or cosine"},
    {"weight_decay", K_DOUBLE, OFF(weight_decay), 0, 0, 10, "decoupled weight decay (matmul weights, embeddings)"},
    {"beta1", K_DOUBLE, OFF(beta1), 0, 0, 0.999999, "AdamW beta1"},
    {"beta2", K_DOUBLE, OFF(beta2), 0, 0, 0.99999999, "AdamW beta2"},
    {"eps", K_DOUBLE, OFF(eps), 0, 1e-30, 1, "AdamW epsilon"},
    {"grad_clip", K_DOUBLE, OFF(grad_clip), 0, 0, 1e30, "clip the global gradient norm to this (0: off)"},
    {"seed", K_U64, OFF(seed), 0, 0, 0, "seed for initialisation and data order"},
    {"data", K_STR, STR(data), 0, 0, "\"embedded\" or token sources [FORMAT@]PATH[:WEIGHT],... (FORMAT megatron, llmc, raw16 or raw32, needed where no header says it; see Data below)"},
    {"val_data", K_STR, STR(val_data), 0, 0, "validation sources, the same syntax as data (default: the embedded corpus's held-out tail when data is \"embedded\", else none; \"none\": off)"},
    {"eval_every", K_LONG, OFF(eval_every), 0, 0, 1e15, "validation loss every N steps and at the last step (0: never)"},
    {"stop_rule", K_STR, STR(stop_rule), 0, 0, "stop early on the loss forecast (strata forecast): marginal:EPS (one more step buys less than EPS loss per PFLOP), target:LOSS (the forecast reaches LOSS, or cannot within the run), budget:FLOPS (the run, decay included, within FLOPS); a wsd run starts its decay then ends, the others end; none (default)"},
    {"eval_tokens", K_LONG, OFF(eval_tokens), 0, 0, 1e12, "tokens per validation, rounded up to whole batches; the same tokens every time (0: 8 batches)"},
    {"keep_checkpoints", K_LONG, OFF(keep_checkpoints), 0, 0, 1e15, "keep the newest N complete checkpoints, remove older ones (0: keep all)"},
    {"sample_every", K_LONG, OFF(sample_every), 0, 0, 1e15, "print a short text sample (KV-cached, temperature 1) every N steps and at the last step (0: never; strata sample for more)"},
    {"max_skipped_steps", K_LONG, OFF(max_skipped_steps), 0, 1, 1e15, "stop with an error after this many consecutive steps skipped for a non-finite gradient (the last checkpoint is kept)"},
    {"run_dir", K_STR, STR(run_dir), 0, 0, "where metrics.jsonl and checkpoints go"},
    {"resume", K_STR, STR(resume), 0, 0, "run or checkpoint directory to resume from"},
    {"force_resume", K_INT, OFF(force_resume), 0, 0, 1, "1: resume even where this resume's matmul or act_dtype differs from the run's (its numerics change from the resumed step on; warned); for this resume only (recorded as 0). 0 (default): such a resume is refused before anything is written"},
    {"optim_state", K_STR, STR(optim_state), 0, 0, "optimizer state format: f32, 8bit (blocks of 256, the dynamic map) or 8bit-fp (the same blocks, each byte a small float coded by bit arithmetic: about 1.3x the update rate of 8bit, docs/BENCHMARKS.md)"},
    {"threads", K_INT, OFF(threads), 0, 0, 4096, "compute threads (0: all cores; under mpirun: the cores divided by the ranks on this machine)"},
    {"zero", K_INT, OFF(zero), 0, 0, 2, "under mpirun: 0 replicates the optimizer state (gradients all-reduced); 1 shards it over the ranks (ZeRO-1); 2 also shards the summed gradient (ZeRO-2); results are the same bits"},
    {"dist_timeout", K_DOUBLE, OFF(dist_timeout), 0, 1, 1e7, "under mpirun: seconds any rank waits for another before the job stops with an error naming it"},
    {"doc_mask", K_INT, OFF(doc_mask), 0, -1, 1, "1: packed documents stay apart (positions restart at each document, attention never crosses one; the data's document starts); 0: each row attended whole, positions 0..seq-1; default: 1, in memory and under device_budget (layer streaming)"},
    {"mix", K_STR, STR(mix), 0, 0, "how the sources of key 'data' are mixed: weights (the list's weights; default) or online (an EXP3 bandit on each source's training loss, Albalak et al. 2023: weights adapted every step, the same on every rank, resumed exactly, logged as mix_weights in metrics.jsonl; 2 or more sources)"},
    {"mix_smoothing", K_DOUBLE, OFF(mix_smoothing), 0, 0, 0.999999, "mix online: the moving average of each source's reward (its loss over its weight), in [0, 1)"},
    {"doc_signals", K_INT, OFF(doc_signals), 0, 0, 1 << 20, "MiB: record every document each step trains on (loss summed and counted over its targets, step, visit) in run_dir/doc_signals.bin, at most this many MiB (40 bytes a record); 0 (default): off. strata data score --dynamics reads it"},
    {"mix_delay", K_INT, OFF(mix_delay), 0, 1, 8, "mix online: the weights updated after step s are used from step s + mix_delay (the loader builds batches up to mix_delay - 1 steps ahead)"},
    {"quiet", K_INT, OFF(quiet), 0, 0, 1, "1: no per-step lines"},
    {"trace", K_INT, OFF(trace), 0, 0, 2, "1: trace every phase to run_dir/trace.json (Perfetto); 2: odd steps only"},
    {"host_budget", K_DOUBLE, OFF(host_budget), 0, 0, 1e18, "host memory in bytes the run must fit (0: MemAvailable)"},
    {"method", K_STR, STR(method), 0, 0, "what trains: full (every parameter, AdamW; default), lora (low-rank adapters over the frozen base weights, as Hugging Face PEFT: lora_rank, lora_alpha, lora_targets; the base's block matmul weights held in frozen_dtype (QLoRA-style with bf16 or int8); in memory or with the disk state, under mpirun too; with layer streaming (device_budget) on device cpu, under mpirun too, the held matmul weights streamed as held, the adapters' state in RAM or on state_paths) or poetx (every matmul weight of the blocks as R W0 P, W0 frozen, R and P block-orthogonal: poetx_block, poetx_terms, poetx_merge_every, poetx_lr, poetx_clip_ramp, poetx_adam_restart, poetx_init; in memory or with the disk state, under mpirun too, W0 of each merge in a file beside the store; with layer streaming (device_budget) on device cpu, under mpirun too, W0 streamed as held, the head resident or in vocabulary chunks, the trained vector's state in RAM or on state_paths with W0 of each merge in a file beside the store)"},
    {"lora_rank", K_INT, OFF(lora_rank), 0, 1, 65536, "method lora: the adapters' rank r (at most each adapted projection's smaller dimension)"},
    {"lora_alpha", K_DOUBLE, OFF(lora_alpha), 0, 1e-30, 1e30, "method lora: lora_alpha; the adapters' term is scaled by lora_alpha / lora_rank"},
    {"lora_targets", K_STR, STR(lora_targets), 0, 0, "method lora: the projections adapted, comma-separated, as PEFT's target_modules (GPT-2: c_attn, c_proj, c_fc; the Llama family: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or q, k, v, o, gate, up, down); empty: c_attn for GPT-2, q_proj,v_proj for the Llama family (PEFT's defaults)"},
    {"save_adapter", K_STR, STR(save_adapter), 0, 0, "method lora: at the end, write the adapters as a PEFT directory here (adapter_config.json, adapter_model.safetensors: PeftModel.from_pretrained loads it)"},
    {"init_adapter", K_STR, STR(init_adapter), 0, 0, "method lora: start the adapters from this PEFT adapter directory (save_adapter's, or PEFT's save_pretrained) instead of A random, B zero; its r, lora_alpha and target_modules must be the run's (the base: init_from or model). An init_from that is an adapter directory sets this and takes the adapter's base_model_name_or_path as init_from"},
    {"poetx_block", K_INT, OFF(poetx_block), 0, 2, 65536, "method poetx: the block size b of the orthogonal factors R and P (it must divide both dimensions of every matmul weight of the blocks)"},
    {"poetx_terms", K_INT, OFF(poetx_terms), 0, 0, 64, "method poetx: the Neumann terms k of each block's Cayley polynomial (I + Q)(I + Q + ... + Q^k)"},
    {"poetx_merge_every", K_INT, OFF(poetx_merge_every), 0, 1, 1000000000, "method poetx: steps between merges (R and P folded into W0, Q reset and its Adam moments with poetx_adam_restart, the permutations redrawn)"},
    {"poetx_recompute", K_INT, OFF(poetx_recompute), 0, -1, 1, "method poetx: 1 forms each weight's rotated input again in the backward instead of keeping it from the forward (less memory, a slower step; the same numbers); 0 keeps it; -1 (default, auto) keeps it where the run's memory with it fits host_budget (else MemAvailable), else recomputes: the choice logged and recorded in config.json as if given"},
    {"frozen_dtype", K_STR, STR(frozen_dtype), 0, 0, "methods poetx and lora: the precision the frozen matmul weights of the blocks (W0) are held in: fp32 (default), bf16 (2 bytes a value) or int8 (1 byte a value and an fp32 scale and zero per group of 256; asymmetric, round to nearest); bf16 and int8 are dequantised a panel at a time inside the matmuls and the base's fp32 copy of them given back; on the cpu backend (device cpu). poetx: a merge is done in fp32 and rounded back, checkpoints keep W0 as held. lora: every block matmul weight is held so (adapted or not; embeddings, head, norms and biases stay fp32), checkpoints hold the adapters only and a resume rounds the base again from init_from or the seed (so it must keep frozen_dtype), save_hf writes the held weights dequantised plus the adapters merged. Method full takes fp32 only"},
    {"poetx_lr", K_DOUBLE, OFF(poetx_lr), 0, -1, 10, "method poetx: the peak learning rate of the packed Q's (R and P), on lr's schedule (warmup, decay); the embeddings, norms and biases keep lr. -1 (default): lr"},
    {"poetx_clip_ramp", K_INT, OFF(poetx_clip_ramp), 0, 0, 1000000000, "method poetx: after each merge the gradient clip threshold starts at poetx_clip_start x grad_clip and rises linearly back to grad_clip over this many steps (step j after a merge, 1 <= j <= N: start + (1 - start) (j - 1) / N of grad_clip); at most poetx_merge_every; needs grad_clip > 0. 0 (default): off"},
    {"poetx_clip_start", K_DOUBLE, OFF(poetx_clip_start), 0, 1e-6, 1, "method poetx: the clip ramp's first threshold after a merge, as a fraction of grad_clip"},
    {"poetx_init", K_STR, STR(poetx_init), 0, 0, "method poetx: the W0 it starts from, whose singular values POET-X never changes: orthogonal (every block matmul weight a random orthogonal matrix times one singular value, poetx_init_gain x the RMS singular value of the model's initialisation of it: a flat spectrum at the scale training wants), model (W0 as the model gives it: its Gaussian initialisation, a spread spectrum at std 0.02's scale, or init_from's weights) or auto (default: orthogonal from scratch, model with init_from; recorded in config.json as chosen); docs/BENCHMARKS.md measures both against AdamW; orthogonal is refused with init_from, whose weights are the W0"},
    {"poetx_init_gain", K_DOUBLE, OFF(poetx_init_gain), 0, 1e-3, 1e3, "method poetx with poetx_init orthogonal: W0's one singular value over the RMS singular value of the model's initialisation of that weight (1: the same Frobenius norm)"},
    {"poetx_adam_restart", K_INT, OFF(poetx_adam_restart), 0, 0, 1, "method poetx: 1 (default) zeroes the Adam moments of the Q's at each merge (Q restarts at 0 under new permutations); 0 keeps them"},
};
#define N_KEYS (sizeof keys / sizeof keys[0])

void st_train_config_defaults(st_train_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model, sizeof c->model, "gpt2-mini");
    c->batch = 16;
    c->seq = 128;
    c->grad_accum = 1;
    c->steps = 400;
    c->warmup_steps = 20;
    c->log_every = 1;
    c->lr = 3e-3;
    c->min_lr_frac = 0.1;
    snprintf(c->schedule, sizeof c->schedule, "cosine");
    c->decay_frac = 0.2;
    snprintf(c->decay_shape, sizeof c->decay_shape, "1-sqrt");
    c->weight_decay = 0.1;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->grad_clip = 1.0;
    c->seed = 1337;
    snprintf(c->data, sizeof c->data, "embedded");
    c->eval_every = 50;
    c->keep_checkpoints = 3;
    c->max_skipped_steps = 10;
    c->zero = 1;
    c->dist_timeout = 300;
    c->sample_every = 200; /* the default 400-step run: a sample halfway and one at the end */
    snprintf(c->optim_state, sizeof c->optim_state, "f32");
    snprintf(c->save_hf_dtype, sizeof c->save_hf_dtype, "f32");
    c->doc_mask = -1; /* unset: 1 */
    snprintf(c->mix, sizeof c->mix, "weights");
    c->mix_smoothing = 0.9;
    c->mix_delay = 2;
    snprintf(c->plan, sizeof c->plan, "auto");
    snprintf(c->device, sizeof c->device, "cpu");
    snprintf(c->act, sizeof c->act, "auto");
    snprintf(c->plan_state, sizeof c->plan_state, "fixed");
    snprintf(c->plan_head, sizeof c->plan_head, "resident");
    snprintf(c->matmul, sizeof c->matmul, "fp32");
    snprintf(c->act_dtype, sizeof c->act_dtype, "f32");
    snprintf(c->method, sizeof c->method, "full");
    c->lora_rank = 8;
    c->lora_alpha = 16;
    c->poetx_block = 64;
    c->poetx_terms = 4;
    c->poetx_merge_every = 200;
    snprintf(c->frozen_dtype, sizeof c->frozen_dtype, "fp32");
    c->poetx_recompute = -1; /* auto: kept where it fits (st_train_poetx_recompute_choose) */
    c->poetx_lr = -1; /* lr */
    c->poetx_clip_start = 0.1;
    c->poetx_adam_restart = 1;
    snprintf(c->poetx_init, sizeof c->poetx_init, "auto");
    c->poetx_init_gain = 4.0;
}

/* The key method's one parse: -1 for a value it is not. */
static int parse_method(const char *v) {
    return !strcmp(v, "full") ? ST_TRAIN_METHOD_FULL : !strcmp(v, "lora") ? ST_TRAIN_METHOD_LORA
           : !strcmp(v, "poetx") ? ST_TRAIN_METHOD_POETX : -1;
}

st_status st_train_config_method(const st_train_config *c, int *lora, st_err *err) {
    int m = parse_method(c->method);
    *lora = m == ST_TRAIN_METHOD_LORA;
    if (m < 0) return st_errf(err, ST_ERR_INVALID, "key 'method': '%s' is not full, lora or poetx", c->method);
    int fd = st_train_config_frozen_dtype(c);
    if (fd < 0) return st_errf(err, ST_ERR_INVALID, "key 'frozen_dtype': '%s' is not fp32, bf16 or int8", c->frozen_dtype);
    if (fd != ST_FROZEN_F32 && m == ST_TRAIN_METHOD_FULL)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'frozen_dtype': %s W0 is for methods poetx and lora (frozen base "
                       "weights); method full trains every weight in fp32: give frozen_dtype fp32 or leave it out",
                       c->frozen_dtype);
    return ST_OK;
}

int st_train_config_frozen_dtype(const st_train_config *c) {
    st_frozen_dtype d;
    return st_frozen_dtype_parse(c->frozen_dtype, &d) ? -1 : (int)d;
}

st_status st_train_config_act_dtype(const st_train_config *c, st_dtype *out, st_err *err) {
    *out = ST_F32;
    if (!strcmp(c->act_dtype, "f32")) return ST_OK;
    if (!strcmp(c->act_dtype, "bf16")) {
        *out = ST_BF16;
        return ST_OK;
    }
    return st_errf(err, ST_ERR_INVALID, "key 'act_dtype': '%s' is not f32 or bf16", c->act_dtype);
}

int st_train_config_data_embedded(const char *data) { return !strcmp(data, "embedded"); }

int st_train_config_has_val(const st_train_config *c) {
    return strcmp(c->val_data, "none") && (c->val_data[0] || st_train_config_data_embedded(c->data));
}

st_train_method st_train_config_method_of(const st_train_config *c) {
    int m = parse_method(c->method);
    return m < 0 ? ST_TRAIN_METHOD_FULL : (st_train_method)m;
}

const char *st_train_config_keys(void) {
    static char buf[2048];
    if (!buf[0])
        for (size_t i = 0; i < N_KEYS; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", keys[i].name);
    return buf;
}

void st_train_config_print_help(FILE *f) {
    for (size_t i = 0; i < N_KEYS; i++) fprintf(f, "  --%-14s %s\n", keys[i].name, keys[i].help);
}

/* The one place each of these keys' text is read; -1: not one of its names (refused by
 * st_train_config_resolve naming the key). */
static int parse_optim_state(const char *v) {
    return !strcmp(v, "f32") ? (int)ST_OPTIM_STATE_F32 : !strcmp(v, "8bit") ? (int)ST_OPTIM_STATE_8BIT
         : !strcmp(v, "8bit-fp") ? (int)ST_OPTIM_STATE_8BIT_FP : -1;
}

static int parse_save_hf_dtype(const char *v) {
    return !strcmp(v, "f32") ? (int)ST_F32 : !strcmp(v, "bf16") ? (int)ST_BF16 : -1;
}

/* plan_state: 0 fixed, 1 auto, -1 neither. */
static int parse_plan_state(const char *v) { return !strcmp(v, "fixed") ? 0 : !strcmp(v, "auto") ? 1 : -1; }

int st_train_config_places_state(const st_train_config *c) { return parse_plan_state(c->plan_state) == 1; }

const char *st_train_config_plan_file(const st_train_config *c) {
    return strcmp(c->plan, "auto") ? c->plan : NULL;
}

st_optim_state_format st_train_config_state_format(const st_train_config *c) {
    int f = parse_optim_state(c->optim_state);
    return f < 0 ? ST_OPTIM_STATE_F32 : (st_optim_state_format)f;
}

st_dtype st_train_config_save_hf_dtype(const st_train_config *c) {
    return parse_save_hf_dtype(c->save_hf_dtype) == (int)ST_BF16 ? ST_BF16 : ST_F32;
}

static const key_def *find_key(const char *name) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].name, name)) return &keys[i];
    return NULL;
}

st_status st_train_config_set(st_train_config *c, const char *key, const char *value, st_err *err) {
    const key_def *k = find_key(key);
    if (!k) return st_errf(err, ST_ERR_INVALID, "unknown configuration key '%s'; known keys: %s", key, st_train_config_keys());
    char *p = (char *)c + k->offset;
    if (k->type == K_STR) {
        int cuda_index; /* the device's form now; whether this build and machine have it, when the run starts */
        if (k->offset == OFF(device) && st_backend_device_parse(value, &cuda_index, err))
            return st_err_prefix(err, "key 'device'");
        if (strlen(value) >= k->size)
            return st_errf(err, ST_ERR_INVALID, "key '%s': value is longer than %zu characters", key, k->size - 1);
        snprintf(p, k->size, "%s", value);
        return ST_OK;
    }
    char *end;
    errno = 0;
    if (k->type == K_DOUBLE) {
        double v = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(v))
            return st_errf(err, ST_ERR_INVALID, "key '%s': '%s' is not a number", key, value);
        if (v < k->lo || v > k->hi)
            return st_errf(err, ST_ERR_INVALID, "key '%s': %g is outside [%g, %g]", key, v, k->lo, k->hi);
        *(double *)p = v;
        return ST_OK;
    }
    /* Integers: digits only (an optional leading '-'), compared as integers against the
     * key's range, which is never wider than its C type: nothing is truncated. */
    const char *d = value + (value[0] == '-');
    int digits = *d >= '0' && *d <= '9';
    for (const char *q = d; *q && digits; q++) digits = *q >= '0' && *q <= '9';
    if (k->type == K_U64) {
        if (!digits || value[0] == '-')
            return st_errf(err, ST_ERR_INVALID, "key '%s': '%s' is not a non-negative integer in [0, %llu]", key, value,
                           (unsigned long long)UINT64_MAX);
        unsigned long long v = strtoull(value, &end, 10);
        if (errno == ERANGE)
            return st_errf(err, ST_ERR_INVALID, "key '%s': %s is above 2^64-1 (%llu); use a value in [0, %llu]", key,
                           value, (unsigned long long)UINT64_MAX, (unsigned long long)UINT64_MAX);
        *(uint64_t *)p = v;
        return ST_OK;
    }
    long long lo = (long long)k->lo;
    long long hi = k->hi > 0 ? (long long)k->hi : k->type == K_INT ? INT_MAX : LONG_MAX;
    if (k->type == K_INT && hi > INT_MAX) hi = INT_MAX;
    if (!digits) return st_errf(err, ST_ERR_INVALID, "key '%s': '%s' is not an integer in [%lld, %lld]", key, value, lo, hi);
    long long v = strtoll(value, &end, 10);
    if (errno == ERANGE || v < lo || v > hi)
        return st_errf(err, ST_ERR_INVALID, "key '%s': %s is outside [%lld, %lld]", key, value, lo, hi);
    if (k->type == K_INT) *(int *)p = (int)v;
    else *(long *)p = (long)v;
    return ST_OK;
}

/* A run configuration is a few hundred bytes; the cap keeps a wrong file (or a 100 MB
 * value) from being read into memory whole before it is refused. */
#define CONFIG_MAX_BYTES (1u << 20)

static st_status read_config_text(const char *path, char **out, size_t *len, st_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > CONFIG_MAX_BYTES) {
        fclose(f);
        return st_errf(err, ST_ERR_FORMAT, "%s: %llu bytes; a run configuration is at most %u bytes (1 MiB): is it the "
                       "right file?", path, (unsigned long long)sb.st_size, CONFIG_MAX_BYTES);
    }
    size_t cap = S_ISREG(sb.st_mode) && sb.st_size > 0 ? (size_t)sb.st_size + 1 : 4096, n = 0;
    char *buf = NULL;
    for (;;) {
        if (n + 1 >= cap || !buf) {
            if (buf) cap *= 2;
            if (cap > CONFIG_MAX_BYTES + 2) cap = CONFIG_MAX_BYTES + 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return st_errf(err, ST_ERR_NOMEM, "%s: out of memory reading the configuration", path);
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (n > CONFIG_MAX_BYTES) {
            free(buf);
            fclose(f);
            return st_errf(err, ST_ERR_FORMAT, "%s: more than %u bytes; a run configuration is at most 1 MiB: is it "
                           "the right file?", path, CONFIG_MAX_BYTES);
        }
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return st_errf(err, ST_ERR_IO, "%s: read error after %zu bytes", path, n);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return ST_OK;
}

static int is_json_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n'; }

/* Skip one JSON value starting at text[*at] (already checked by json-c; bounds are
 * checked again all the same). Returns 0, or -1 if the text ends inside it. */
static int skip_json_value(const char *t, size_t n, size_t *at) {
    int depth = 0;
    do {
        if (*at >= n) return -1;
        char ch = t[*at];
        if (ch == '"') {
            for (++*at; *at < n && t[*at] != '"'; *at += t[*at] == '\\' ? 2 : 1) {}
            if (*at >= n) return -1;
            ++*at;
        } else if (ch == '{' || ch == '[') {
            depth++, ++*at;
        } else if (ch == '}' || ch == ']') {
            depth--, ++*at;
        } else if (depth == 0) {
            while (*at < n && t[*at] && !is_json_ws(t[*at]) && !strchr(",}]", t[*at])) ++*at;
        } else {
            ++*at;
        }
    } while (depth > 0);
    return 0;
}

/* The JSON type of a value from its first character and text (numbers: int unless
 * they have a fraction or an exponent), named as json-c names it. */
static json_type json_type_of_text(const char *v, size_t len) {
    switch (v[0]) {
    case '"': return json_type_string;
    case '{': return json_type_object;
    case '[': return json_type_array;
    case 't': case 'f': return json_type_boolean;
    case 'n': return json_type_null;
    default:
        for (size_t i = 0; i < len; i++)
            if (!(v[i] >= '0' && v[i] <= '9') && v[i] != '-') return json_type_double; /* 1.5, 1e3, NaN */
        return json_type_int;
    }
}

/* One member of the configuration: key and value as written. json-c's objects keep only
 * the last of duplicate keys and clamp integers that do not fit in 64 bits, so the
 * members are taken from the text, which json-c has validated, and strings are decoded
 * by json-c one at a time. */
static st_status config_member(st_train_config *c, const char *path, json_tokener *tok, const char *t, size_t kpos,
                               size_t klen, size_t vpos, size_t vlen, unsigned char *seen, st_err *err) {
    json_tokener_reset(tok);
    json_object *ko = json_tokener_parse_ex(tok, t + kpos, (int)klen);
    if (!ko || !json_object_is_type(ko, json_type_string)) {
        if (ko) json_object_put(ko);
        return st_errf(err, ST_ERR_FORMAT, "%s: offset %zu: a key must be a string", path, kpos);
    }
    char key[64];
    const char *kstr = json_object_get_string(ko);
    int klen_ok = (size_t)json_object_get_string_len(ko) == strlen(kstr) && strlen(kstr) < sizeof key;
    snprintf(key, sizeof key, "%s", kstr);
    const key_def *k = klen_ok ? find_key(key) : NULL;
    if (!k) {
        st_status s = st_errf(err, ST_ERR_INVALID, "%s: offset %zu: unknown key '%.80s'; known keys: %s", path, kpos,
                              kstr, st_train_config_keys());
        json_object_put(ko);
        return s;
    }
    json_object_put(ko);
    size_t ki = (size_t)(k - keys);
    if (seen[ki])
        return st_errf(err, ST_ERR_INVALID, "%s: offset %zu: key '%s' is given twice; keep one", path, kpos, key);
    seen[ki] = 1;
    const char *v = t + vpos;
    json_type jt = json_type_of_text(v, vlen);
    int ok = k->type == K_STR ? jt == json_type_string
             : k->type == K_DOUBLE ? (jt == json_type_double || jt == json_type_int)
                                   : jt == json_type_int;
    if (!ok)
        return st_errf(err, ST_ERR_INVALID, "%s: key '%s' must be %s, got %s", path, key,
                       k->type == K_STR ? "a string" : k->type == K_DOUBLE ? "a number" : "an integer",
                       json_type_to_name(jt));
    st_status s;
    if (jt == json_type_string) {
        json_tokener_reset(tok);
        json_object *vo = json_tokener_parse_ex(tok, v, (int)vlen);
        const char *str = vo ? json_object_get_string(vo) : NULL;
        if (!str || (size_t)json_object_get_string_len(vo) != strlen(str))
            s = st_errf(err, ST_ERR_INVALID, "key '%s': the string at offset %zu holds a NUL character", key, vpos);
        else
            s = st_train_config_set(c, key, str, err);
        if (vo) json_object_put(vo);
    } else {
        char num[128];
        if (vlen >= sizeof num)
            return st_errf(err, ST_ERR_INVALID, "%s: key '%s': the number at offset %zu has %zu digits", path, key, vpos,
                           vlen);
        memcpy(num, v, vlen);
        num[vlen] = 0;
        s = st_train_config_set(c, key, num, err);
    }
    return s ? st_err_prefix(err, "%s", path) : ST_OK;
}

st_status st_train_config_load_json(st_train_config *c, const char *path, st_err *err) {
    char *t = NULL;
    size_t n = 0;
    st_status s = read_config_text(path, &t, &n, err);
    if (s) return s;
    size_t at = 0;
    while (at < n && is_json_ws(t[at])) at++;
    if (at == n) {
        free(t);
        return st_errf(err, ST_ERR_FORMAT, "%s: the file is empty; a run configuration is a JSON object of keys, "
                       "such as {\"steps\": 100}", path);
    }
    json_tokener *tok = json_tokener_new();
    if (!tok) {
        free(t);
        return st_errf(err, ST_ERR_NOMEM, "%s: out of memory", path);
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS);
    json_object *root = json_tokener_parse_ex(tok, t, (int)n);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    if (!root || jerr != json_tokener_success) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: not valid JSON: %s at offset %zu", path,
                    jerr == json_tokener_continue ? "the text ends early" : json_tokener_error_desc(jerr), end);
        goto out;
    }
    if (!json_object_is_type(root, json_type_object)) {
        s = st_errf(err, ST_ERR_FORMAT, "%s: the configuration must be a JSON object of keys, not %s", path,
                    json_type_to_name(json_object_get_type(root)));
        goto out;
    }
    for (size_t i = end; i < n; i++)
        if (!is_json_ws(t[i])) {
            s = st_errf(err, ST_ERR_FORMAT, "%s: offset %zu: trailing bytes after the configuration's closing '}'",
                        path, i);
            goto out;
        }
    unsigned char seen[N_KEYS] = {0};
    at++; /* past '{' */
    for (;;) {
        while (at < end && is_json_ws(t[at])) at++;
        if (at >= end || t[at] == '}') break;
        size_t kpos = at;
        if (skip_json_value(t, end, &at)) break;
        size_t klen = at - kpos;
        while (at < end && (is_json_ws(t[at]) || t[at] == ':')) at++;
        size_t vpos = at;
        if (skip_json_value(t, end, &at)) break;
        if ((s = config_member(c, path, tok, t, kpos, klen, vpos, at - vpos, seen, err))) break;
        while (at < end && is_json_ws(t[at])) at++;
        if (at < end && t[at] == ',') at++;
    }
out:
    if (root) json_object_put(root);
    json_tokener_free(tok);
    free(t);
    return s;
}

int st_train_config_key_crcs(const st_train_config *c, uint32_t *out, int cap) {
    int n = 0;
    for (size_t i = 0; i < N_KEYS && n < cap; i++) {
        const key_def *k = &keys[i];
        const char *p = (const char *)c + k->offset;
        size_t len = k->type == K_STR ? strnlen(p, k->size) : k->type == K_INT ? sizeof(int)
                     : k->type == K_DOUBLE ? sizeof(double) : k->type == K_U64 ? sizeof(uint64_t) : sizeof(long);
        out[n++] = st_crc32c(st_crc32c(0, k->name, strlen(k->name)), p, len);
    }
    return n;
}

const char *st_train_config_key_name(int i) { return i >= 0 && (size_t)i < N_KEYS ? keys[i].name : "?"; }

st_status st_train_config_save_json(const st_train_config *c, const char *path, st_err *err) {
    json_object *root = json_object_new_object();
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        const char *p = (const char *)c + k->offset;
        json_object *v = NULL;
        switch (k->type) {
        case K_INT: v = json_object_new_int(*(const int *)p); break;
        case K_LONG: v = json_object_new_int64(*(const long *)p); break;
        case K_U64: v = json_object_new_uint64(*(const uint64_t *)p); break; /* 2^63 and above stay positive */
        case K_DOUBLE: v = json_object_new_double(*(const double *)p); break;
        case K_STR: v = json_object_new_string(p); break;
        }
        json_object_object_add(root, k->name, v);
    }
    const char *text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY);
    st_status s = st_write_text(path, text, err);
    json_object_put(root);
    return s;
}

st_status st_train_config_resolve(const st_train_config *c, st_model_shape *shape, st_err *err) {
    st_model_shape local;
    if (!shape) shape = &local;
    st_model_overrides ov = st_train_config_overrides(c);
    st_status s = st_model_resolve(c->model, c->init_from, &ov, c->batch, c->seq, shape, NULL, err);
    if (s) return s;
    if (c->seq > shape->max_seq)
        return st_errf(err, ST_ERR_INVALID, "key 'seq': %d exceeds the model's max_seq %d; lower seq%s", c->seq,
                       shape->max_seq, shape->from_dir ? " (the init_from directory fixes max_seq)" : " or raise max_seq");
    if (parse_optim_state(c->optim_state) < 0)
        return st_errf(err, ST_ERR_INVALID, "key 'optim_state': '%s' is not f32, 8bit or 8bit-fp", c->optim_state);
    if (parse_save_hf_dtype(c->save_hf_dtype) < 0)
        return st_errf(err, ST_ERR_INVALID, "key 'save_hf_dtype': '%s' is not f32 or bf16", c->save_hf_dtype);
    st_matmul_mode matmul;
    if ((s = st_backend_matmul_parse(c->matmul, &matmul, err))) return s; /* names the key */
    st_dtype act_dtype;
    if ((s = st_train_config_act_dtype(c, &act_dtype, err))) return s; /* names the key */
    if (act_dtype == ST_BF16 && parse_method(c->method) > ST_TRAIN_METHOD_FULL)
        return st_errf(err, ST_ERR_UNSUPPORTED, "key 'act_dtype': bf16 activations are the block executor's (method "
                       "full); method %s trains through its own forward, whose activations stay fp32: use act_dtype "
                       "f32", c->method);
    if (strcmp(c->plan_head, "resident") && strcmp(c->plan_head, "fastest"))
        return st_errf(err, ST_ERR_INVALID, "key 'plan_head': '%s' is not resident or fastest", c->plan_head);
    if (strcmp(c->mix, "weights") && strcmp(c->mix, "online"))
        return st_errf(err, ST_ERR_INVALID, "key 'mix': '%s' is not weights or online", c->mix);
    if (parse_plan_state(c->plan_state) < 0)
        return st_errf(err, ST_ERR_INVALID, "key 'plan_state': '%s' is not fixed or auto", c->plan_state);
    st_schedule sc;
    if ((s = st_train_config_schedule(c, &sc, err))) return s; /* names the key */
    st_stop_rule rule;
    int has_val = st_train_config_has_val(c);
    if ((s = st_stop_rule_parse(c->stop_rule, &rule, err)) || (s = st_stop_rule_check(&rule, c->eval_every, has_val, err)))
        return s; /* names the key */
    if (st_train_config_data_embedded(c->data) && shape->vocab_size < 256)
        return st_errf(err, ST_ERR_INVALID, "the embedded corpus has byte tokens (0..255); vocab_size %d is too small",
                       shape->vocab_size);
    /* An absurd configuration is refused before anything is allocated: weights, gradients
     * and two f32 moments, and the activations. */
    double bytes = 16.0 * shape->n_params + shape->act_bytes;
    if (bytes > 1e15)
        return st_errf(err, ST_ERR_INVALID, "this configuration needs about %.3g bytes; check batch, seq and the model "
                       "shape", bytes);
    return ST_OK;
}

st_status st_train_config_check(const st_train_config *c, st_err *err) {
    st_model_shape shape;
    st_status s = st_train_config_resolve(c, &shape, err);
    if (!s && !c->plan[0]) s = st_errf(err, ST_ERR_INVALID, "key 'plan' is empty: give auto or a plan file");
    if (!s && st_train_config_plan_file(c) && !(c->device_budget > 0)) /* strata train fills it from the file */
        s = st_errf(err, ST_ERR_INVALID, "key 'plan': the plan file %s is a layer-streaming plan: give device_budget "
                    "(strata train takes the plan's own when none is given), or plan auto", c->plan);
    int cuda_index = -1; /* a GPU runs only the layer-streaming executor, whose device memory the budget is */
    if (!s && st_backend_device_parse(c->device, &cuda_index, err)) s = st_err_prefix(err, "key 'device'");
    if (!s && cuda_index >= 0 && !(c->device_budget > 0))
        s = st_errf(err, ST_ERR_INVALID, "key 'device_budget': device %s streams the layers through the GPU's memory: "
                    "give device_budget, the bytes of it the run may use (for example --device_budget 16e9)",
                    c->device);
    if (!s) s = st_backend_matmul_check(c->device, c->matmul, err); /* tf32 on cpu; bf16 on cpu without oneDNN */
    if (!s && strcmp(c->act, "auto")) { /* the spec against the model's blocks */
        unsigned char fixed[ST_STREAM_MAX_LAYERS];
        int n_fixed;
        s = st_train_config_act(c, shape.n_layer, fixed, &n_fixed, err);
        if (!s && !(c->device_budget > 0) && !st_train_config_plan_file(c))
            s = st_errf(err, ST_ERR_INVALID, "key 'act' fixes activation choices of the layer-streaming plan: give "
                        "device_budget too (in memory every block keeps its activations), or act auto");
    }
    return s;
}

st_status st_train_config_act(const st_train_config *c, int n_blocks, unsigned char *fixed, int *n_fixed, st_err *err) {
    *n_fixed = 0;
    if (n_blocks > ST_STREAM_MAX_LAYERS) /* the key the user gave: act where it is set, else the streaming itself */
        return st_errf(err, ST_ERR_INVALID, "key '%s': %d blocks, layer streaming takes at most %d",
                       strcmp(c->act, "auto") ? "act" : "device_budget", n_blocks, ST_STREAM_MAX_LAYERS);
    st_status s = st_plan_act_parse(c->act, n_blocks, fixed, n_fixed, err);
    return s ? st_err_prefix(err, "key 'act'") : ST_OK;
}

st_model_overrides st_train_config_overrides(const st_train_config *c) {
    st_model_overrides ov = {.vocab_size = c->vocab_size, .max_seq = c->max_seq, .n_layer = c->n_layer,
                             .n_head = c->n_head, .n_embd = c->n_embd};
    return ov;
}

st_status st_train_config_schedule(const st_train_config *c, st_schedule *sc, st_err *err) {
    return st_schedule_init(sc, c->schedule, c->decay_shape, c->lr, c->min_lr_frac, c->decay_frac, c->steps,
                            c->warmup_steps, err);
}

double st_train_lr_at(const st_train_config *c, long step) {
    st_schedule sc; /* the keys were checked by st_train_config_resolve */
    if (st_train_config_schedule(c, &sc, NULL)) return NAN;
    return st_schedule_lr_at(&sc, step);
}

st_status st_train_state_paths(const st_train_config *c, char *buf, size_t cap, const char **paths, int *n,
                            double *weights, int *weighted, st_err *err) {
    snprintf(buf, cap, "%s", c->state_paths);
    *n = 0;
    *weighted = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == ST_STORE_MAX_PATHS)
            return st_errf(err, ST_ERR_INVALID, "key 'state_paths': more than %d paths", ST_STORE_MAX_PATHS);
        paths[(*n)++] = tok;
    }
    if (!*n) return st_errf(err, ST_ERR_INVALID, "key 'state_paths' is empty");
    if (!c->state_profile[0]) return ST_OK;
    if (st_store_weights_from_profile(c->state_profile, paths, *n, weights, err))
        return st_err_prefix(err, "key 'state_profile'");
    *weighted = 1;
    return ST_OK;
}

int st_train_config_mix_online(const st_train_config *c) { return !strcmp(c->mix, "online"); }

int st_train_config_plan_head(const st_train_config *c) {
    return strcmp(c->plan_head, "fastest") ? ST_PLAN_HEAD_RESIDENT_IF_FITS : ST_PLAN_HEAD_RESIDENT_ON_TIE;
}

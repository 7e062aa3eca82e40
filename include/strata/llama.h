/* llama.h - Llama-family decoders (Llama 2/3, Mistral, Qwen2, Qwen3) as a list of blocks
 * on a backend, and their Hugging Face checkpoints.
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_llama_config cfg;
 *     st_llama_model m = {0};
 *     enum { B = 1, T = 8 };
 *     int32_t inputs[B * T] = {0}, targets[B * T] = {0};  // token ids; a target < 0 is ignored
 *     if (st_backend_cpu_create(&be, 0, &err) || st_hf_config_read("Qwen2.5-0.5B", &cfg, &err) ||
 *         st_llama_create(&m, &cfg, be, &err) || st_llama_load_hf(&m, "Qwen2.5-0.5B", &err) ||
 *         st_llama_alloc_acts(&m, B, T, &err)) {   // the directory of config.json, *.safetensors
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     st_llama_zero_grad(&m);
 *     float loss = st_llama_forward(&m, inputs, targets, 1.0f / (B * T));
 *     st_llama_backward(&m);                           // m.grads += d loss / d m.params
 *     printf("loss %.3f, %zu parameters\n", loss, m.n_params);
 *     st_llama_free(&m);
 *     st_backend_free(be);
 *
 * End of example.
 *
 * A block is x += o_proj(attn(rope(q, k), v)) with q, k, v = proj(rmsnorm(x)), then
 * x += down(silu(gate(h)) * up(h)) with h = rmsnorm(x): pre-norm, RMSNorm, rotary
 * embeddings (rotate_half), grouped-query attention (n_kv_head divides n_head; 1 is
 * multi-query), SwiGLU, optional q/k/v (and o) biases, optional per-head q/k RMSNorm.
 *
 * Parameters live in one allocation, Hugging Face names, nn.Linear weights (out, in):
 *     model.embed_tokens.weight (V, C) | block 0 | ... | block L-1 | model.norm.weight (C)
 *     [| lm_head.weight (V, C) when not tied]
 * and each block is one contiguous slab (hs = head_dim, NH, NKV heads, F intermediate):
 *     input_layernorm.weight (C) |
 *     self_attn.q_proj.weight (NH*hs, C) | k_proj.weight (NKV*hs, C) | v_proj.weight (NKV*hs, C) |
 *     [q_proj.bias (NH*hs) | k_proj.bias (NKV*hs) | v_proj.bias (NKV*hs)] |
 *     [self_attn.q_norm.weight (hs) | self_attn.k_norm.weight (hs)] |
 *     self_attn.o_proj.weight (C, NH*hs) | [o_proj.bias (C)] |
 *     post_attention_layernorm.weight (C) |
 *     mlp.gate_proj.weight (F, C) | mlp.up_proj.weight (F, C) | mlp.down_proj.weight (C, F)
 * q/k/v weights (and biases) are adjacent, so they are one (W, C) matrix with W = (NH +
 * 2 NKV) hs and one matmul gives the packed [q | k | v] rows; gate and up likewise give
 * [gate | up]. Gradients share the layout; roles come from the names (st_role_from_name).
 */
#ifndef STRATA_LLAMA_H
#define STRATA_LLAMA_H

#include <stdio.h>

#include "strata/backend.h"
#include "strata/block.h"
#include "strata/core.h"
#include "strata/model.h"
#include "strata/tensor.h"

typedef struct st_llama_config {
    char model_type[16];   /* Hugging Face model_type: "llama", "mistral", "qwen2", "qwen3" */
    int vocab_size;        /* V */
    int hidden_size;       /* C */
    int intermediate_size; /* F */
    int n_layer;           /* L */
    int n_head;            /* NH */
    int n_kv_head;         /* NKV, divides NH */
    int head_dim;          /* hs (not necessarily C / NH: Qwen3) */
    int max_seq;           /* max_position_embeddings */
    double rope_theta;
    int rope_llama3;       /* rope_scaling {"rope_type": "llama3", ...} */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    double rms_norm_eps;   /* as config.json has it; the ops get it rounded to float */
    int qkv_bias;          /* q/k/v projections have biases (Qwen2; attention_bias) */
    int o_bias;            /* o_proj has a bias (attention_bias on Llama, Mistral, Qwen3) */
    int qk_norm;           /* per-head RMSNorm of q and k before rope (Qwen3) */
    int tie_word_embeddings;
    int sliding_window;    /* > 0: the checkpoint attends over only this many positions;
                            * strata attends over the whole causal context, so a sequence
                            * longer than the window is refused (st_llama_alloc_acts) */
} st_llama_config;

/* Named shapes: "llama-tiny" (GQA 4/2, untied, Llama-3 rope scaling, attention_bias; tests), "qwen2-tiny"
 * (multi-query, q/k/v biases, tied; tests), "qwen3-tiny" (q/k norm), "qwen2.5-0.5b",
 * "llama3.2-1b". Weights are whatever the caller loads or initialises. */
st_status st_llama_config_preset(const char *name, st_llama_config *cfg, st_err *err);
const char *st_llama_preset_names(void);
st_status st_llama_config_validate(const st_llama_config *cfg, st_err *err);
/* Apply st_model_overrides (model.h; 0 keeps a value): vocab_size, max_seq (max positions),
 * n_layer, n_head, n_embd (hidden size). head_dim follows hidden / heads when the preset
 * had it so; kv heads stay as they are (multi-head presets stay multi-head) and must
 * divide the new head count. Validates the result. */
st_status st_llama_config_apply_overrides(st_llama_config *cfg, const st_model_overrides *ov, st_err *err);
/* Parameters of the configuration (elements). */
size_t st_llama_param_count(const st_llama_config *cfg);

/* The architecture as executors see it (strata/block.h; llama_arch.c): the layout above,
 * one tensor table for it (model.embed_tokens.weight | blocks | model.norm.weight
 * [| lm_head.weight]), and the embedding, a block and the final RMSNorm over slabs
 * wherever they live. Validates cfg; the arch owns a copy of it (impl). */
st_status st_arch_llama(st_arch **out, const st_llama_config *cfg, st_err *err);
/* Its sizes without an st_arch: one block's activation set for (B, T) in floats (ln1,
 * rstd1, qkv, [qkvn, rstdq, rstdk], atty, lse, res2, ln2, rstd2, gate|up, SwiGLU out; not
 * the block's output); the bytes st_blocks_bind allocates (token ids, block scratch,
 * rotary tables, each rounded to ST_ARENA_ALIGN); training FLOPs per token of one block
 * at sequence length T (st_llama_flops_per_token = L * this + 6 V C). */
size_t st_llama_block_act_floats(const st_llama_config *cfg, int B, int T);
size_t st_llama_bind_bytes(const st_llama_config *cfg, int B, int T);
double st_llama_block_flops_per_token(const st_llama_config *cfg, int T);

typedef struct st_llama_acts st_llama_acts;

typedef struct st_llama_model {
    st_llama_config cfg;
    st_backend *be;
    size_t n_params;
    float *params; /* backend memory, n_params */
    float *grads;  /* backend memory, n_params, same layout */
    int params_untouched; /* 1: params from st_alloc_untouched (a frozen base's, host memory) */
    int n_tensors;
    const st_param_info *tensors; /* the arch's table */
    size_t block_offset0; /* element offset of block 0 */
    size_t block_numel;   /* elements per block slab */
    st_arch *arch;        /* the pieces st_llama_forward / st_llama_backward run (llama_arch.c) */
    st_llama_acts *acts;
    int B, T;
    float mean_loss;
    st_linear_hook *hook; /* NULL: none (LoRA sets it, strata/lora.h); given to the blocks */
} st_llama_model;

st_status st_llama_create(st_llama_model *m, const st_llama_config *cfg, st_backend *be, st_err *err);
void st_llama_free(st_llama_model *m);
/* Weights N(0, 0.02) (Hugging Face's initializer_range), norms 1, biases 0. */
void st_llama_init_random(st_llama_model *m, uint64_t seed);
const st_param_info *st_llama_find_tensor(const st_llama_model *m, const char *name);

/* Activations for B sequences of T tokens (T <= max_seq), the arch bound to (B, T)
 * (st_blocks_bind: scratch and rotary tables) included; st_llama_act_bytes counts both. */
st_status st_llama_alloc_acts(st_llama_model *m, int B, int T, st_err *err);
/* The last forward's per-row losses (host, B x T; rows with a target < 0 carry no loss):
 * valid from st_llama_alloc_acts to the next one; NULL before. */
const float *st_llama_row_losses(const st_llama_model *m);
size_t st_llama_act_bytes(const st_llama_config *cfg, int B, int T);

/* As st_gpt2_forward / st_gpt2_backward: mean loss over targets >= 0; dloss != 0 turns the
 * logits into their gradient for st_llama_backward, which accumulates (+=) into grads. */
float st_llama_forward(st_llama_model *m, const int32_t *inputs, const int32_t *targets, float dloss);
/* The same, calling hook (when not NULL) before the weights of each part are read
 * (st_model.weight_hook). */
float st_llama_forward_hooked(st_llama_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                           void (*hook)(void *ctx, size_t offset, size_t n), void *ctx);
void st_llama_backward(st_llama_model *m);
/* Packed documents (model.h, st_model_set_docs) for the following forwards and backwards,
 * until the next call or st_llama_alloc_acts: rotary angles at the positions, attention
 * restricted by doc_start. */
st_status st_llama_set_docs(st_llama_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err);
/* The same, calling hook (when not NULL) after each block (st_grad_hook, model.h). */
void st_llama_backward_hooked(st_llama_model *m, void (*hook)(void *ctx, size_t offset, size_t n), void *ctx);
void st_llama_zero_grad(st_llama_model *m);
const float *st_llama_logits(const st_llama_model *m);
/* Rotary tables cos, sin (T, head_dim/2) exactly as the forward uses them (theta,
 * Llama-3 scaling); implemented in src/model/llama_arch.c. */
void st_llama_rope_tables(const st_llama_config *c, int T, float *cos_t, float *sin_t);

/* Training FLOPs per token at sequence length T: 6 * (matmul weights incl. the head)
 * + 6 * L * T * NH * hs (causal attention, as st_gpt2_flops_per_token counts it). */
double st_llama_flops_per_token(const st_llama_config *cfg, int T);

/* The matrix products of one training step as row-major sgemm calls C(M,N) = op(A) op(B)
 * with inner size K, ta/tb = transposed, count per step: forward, dinp and dw of the
 * q|k|v, o, gate|up, down projections (each x L) and the head. For benchmarks that
 * compare a step with sgemm at the model's own shapes. Writes ST_LLAMA_STEP_GEMMS entries. */
#define ST_LLAMA_STEP_GEMMS 15
typedef struct st_llama_gemm { int M, N, K, ta, tb, count; } st_llama_gemm;
void st_llama_step_gemms(const st_llama_config *cfg, int B, int T, st_llama_gemm out[ST_LLAMA_STEP_GEMMS]);

/* ---- Hugging Face directories (hf_config.c, hf_io.c) ---- */

/* Parse config.json text (origin names it in messages). Architectures LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM; an unsupported architecture or
 * option is an error naming the field and what to do. */
st_status st_hf_config_parse(const char *json_text, const char *origin, st_llama_config *cfg, st_err *err);
/* DIR/config.json */
st_status st_hf_config_read(const char *dir, st_llama_config *cfg, st_err *err);
/* config.json text for cfg (malloc'd, caller frees), as transformers writes it;
 * torch_dtype "float32", "bfloat16" or "float16" (NULL: float32). */
char *st_hf_config_to_json(const st_llama_config *cfg, const char *torch_dtype);

/* Weights from DIR/model.safetensors or the shards listed in DIR/model.safetensors.index.json,
 * F32/BF16/F16; every tensor must be present with the configuration's shape. */
st_status st_llama_load_hf(st_llama_model *m, const char *dir, st_err *err);
/* Write DIR/config.json and the weights in dtype (ST_F32, ST_BF16 or ST_F16): one
 * model.safetensors, or, when max_shard_bytes > 0 and the weights exceed it, shards
 * model-0000k-of-0000n.safetensors and model.safetensors.index.json. Creates DIR. */
st_status st_llama_save_hf(const st_llama_model *m, const char *dir, st_dtype dtype, size_t max_shard_bytes, st_err *err);

/* One safetensors file with every tensor under its HF name, F32, and the config.json
 * text in the metadata key "config" (training checkpoints). Load checks names and shapes
 * as st_llama_load_hf does (F32/BF16/F16). */
st_status st_llama_save_safetensors(const st_llama_model *m, const char *path, st_err *err);
st_status st_llama_load_safetensors(st_llama_model *m, const char *path, st_err *err);

/* ---- behind the architecture-independent st_model (model.h; llama_model.c) ----
 * save/load take a path: a name ending in ".safetensors" is one file
 * (st_llama_save_safetensors), anything else a Hugging Face directory (st_llama_save_hf, F32). */
/* A new model of configuration cfg, owned by the st_model (st_model_free frees both). */
st_status st_model_create_llama(st_model **out, const st_llama_config *cfg, st_backend *be, st_err *err);
/* A model from a Hugging Face directory: config.json, then the weights. */
st_status st_model_create_hf(st_model **out, const char *dir, st_backend *be, st_err *err);
/* The st_llama_model inside an st_model made by the two above (NULL for other architectures). */
st_llama_model *st_model_llama(const st_model *m);

/* Describe a Hugging Face directory to out (hf_inspect.c): architecture and configuration,
 * parameter count (checked against the weight files, whose tensors, dtypes and bytes are
 * summed without loading them), and the memory a training run at batch B x seq T needs
 * per class of state: fp32 weights, fp32 gradients, optimizer moments at
 * state_bytes_per_param (8 for fp32 AdamW; st_optim_state_bytes_per_param for 8-bit), and
 * activations (st_llama_act_bytes). */
st_status st_hf_inspect(const char *dir, int B, int T, double state_bytes_per_param, FILE *out, st_err *err);

#endif

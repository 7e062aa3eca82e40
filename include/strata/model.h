/* model.h - GPT-2 as a list of blocks on a backend.
 *
 * Parameters live in one allocation, laid out as
 *     wte (V, C) | wpe (maxT, C) | block 0 | block 1 | ... | ln_f.weight (C) | ln_f.bias (C)
 * and each block is one contiguous slab (so a block moves with one copy):
 *     ln_1.w, ln_1.b (C) | c_attn.w (C, 3C), c_attn.b (3C) | attn.c_proj.w (C, C), .b (C) |
 *     ln_2.w, ln_2.b (C) | c_fc.w (C, 4C), c_fc.b (4C) | mlp.c_proj.w (4C, C), .b (C)
 * Matmul weights are (in, out), as Hugging Face's GPT-2 Conv1D stores them. The
 * gradients share this layout exactly, so zeroing them is one memset and the optimizer
 * is one flat pass. Every tensor has its Hugging Face name and a role derived from it.
 * Callers that train any architecture use st_model (below); a training step on one:
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_model *m = NULL;
 *     enum { B = 2, T = 16 };
 *     int32_t in[B * T] = {0}, tgt[B * T] = {0};  // token ids (B, T); a target < 0 is ignored
 *     if (st_backend_cpu_create(&be, 0, &err) || st_model_create(&m, "gpt2-tiny", NULL, be, &err) ||
 *         m->ops->alloc_acts(m, B, T, &err)) {
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     m->ops->init_random(m, 1337);
 *     st_model_zero_grad(m);
 *     float loss = m->ops->forward(m, in, tgt, 1.0f / (B * T)); // dloss: d mean / d each loss
 *     m->ops->backward(m);                                      // m->grads += d loss / d params
 *     printf("loss %.3f, %zu parameters\n", loss, m->n_params);
 *     st_model_free(m);
 *     st_backend_free(be);
 *
 * End of example.
 */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include "strata/backend.h"
#include "strata/core.h"
#include "strata/optim.h"
#include "strata/tensor.h"

typedef struct st_gpt2_config {
    int vocab_size; /* V */
    int max_seq;    /* maxT, rows of wpe */
    int n_layer;    /* L */
    int n_head;     /* NH */
    int n_embd;     /* C */
} st_gpt2_config;

/* Named shapes: "gpt2-124m" (the original), "gpt2-mini" (the default for strata
 * train: trains visibly in two minutes on two cores), "gpt2-tiny" (tests). */
st_status st_gpt2_config_preset(const char *name, st_gpt2_config *cfg, st_err *err);
const char *st_gpt2_preset_names(void);
st_status st_gpt2_config_validate(const st_gpt2_config *cfg, st_err *err);

typedef enum st_role {
    ST_ROLE_EMBEDDING = 0,
    ST_ROLE_MATMUL_WEIGHT = 1,
    ST_ROLE_BIAS = 2,
    ST_ROLE_NORM_WEIGHT = 3,
    ST_ROLE_NORM_BIAS = 4
} st_role;

/* The role of a tensor, from its (Hugging Face) name alone. */
st_role st_role_from_name(const char *name);
const char *st_role_name(st_role r);

typedef struct st_param_info {
    char name[96];
    size_t offset; /* elements from the start of the parameter vector */
    size_t numel;
    int ndim;
    int shape[2];
    st_role role;
} st_param_info;

/* The tensor called name in a table of n, or NULL. */
const st_param_info *st_params_find(const st_param_info *t, int n, const char *name);
/* The bytes a loader of safetensors (a Hugging Face directory, a checkpoint) holds beside the
 * model's vector while it reads: the largest tensor at 4 bytes a value (its file's pages, given
 * back after each tensor), twice where the backend's memory is a device's (its staging buffer).
 * The start account of a run with init_from: 4 bytes a parameter plus this. */
size_t st_params_load_extra_bytes(const st_param_info *t, int n, int host_memory);
/* The optimizer's segments of a tensor table, weight decay by role (which comes from each
 * tensor's name): matmul weights and embeddings decay, norms and biases do not. out[n]. */
void st_params_decay_segments(const st_param_info *t, int n, float weight_decay, st_optim_segment *out);
/* Initialise a flat host vector by role (deterministic in seed, tensors in table order):
 * norm weights 1, biases and norm biases 0, everything else N(0, 0.02), scaled by
 * resid_scale for tensors whose name ends with resid_suffix (the projections into the
 * residual stream; NULL: none). */
void st_params_init_by_role(const st_param_info *t, int n, float *host, uint64_t seed, const char *resid_suffix,
                            float resid_scale);

typedef struct st_gpt2_acts st_gpt2_acts;

/* A hook on a block's four matmuls (LoRA's adapters, strata/lora.h), called by the block
 * functions of every architecture right after the base matmul. The matmuls, by id: ST_MM_QKV
 * (GPT-2's c_attn; the Llama family's packed q|k|v), ST_MM_O (attention's c_proj; o_proj),
 * ST_MM_UP (c_fc; the packed gate|up), ST_MM_DOWN (the MLP's c_proj; down_proj). */
enum { ST_MM_QKV = 0, ST_MM_O = 1, ST_MM_UP = 2, ST_MM_DOWN = 3, ST_MM_COUNT = 4 };
typedef struct st_linear_hook st_linear_hook;
struct st_linear_hook {
    /* out (N, the matmul's output width) += the hook's term of x (N, its input width) */
    void (*forward)(st_linear_hook *h, int mm, float *out, const float *x, int N);
    /* dx (N, input width) += the term's gradient to x from dout (N, output width); the
     * hook's own parameters' gradients += */
    void (*backward)(st_linear_hook *h, int mm, float *dx, const float *dout, const float *x, int N);
    int layer;  /* the block being run: whoever runs the blocks sets it before each */
    int frozen; /* 1: the base weights are frozen: no gradient of them is formed (the block,
                 * head and embedding backwards take NULL gradient vectors and skip them) */
    float *norm_scratch; /* frozen: backend memory for the norms' weight gradients, dropped
                          * (the norm ops always form them): 2 * n_embd floats */
    /* Optional (NULL: the block's own matmul): the matmul itself, in place of the block's
     * (POET-X, strata/poetx.h). out (N, output width) = the hook's linear map of x with the
     * block's weight w (as the block stores it) and bias (NULL: none) added; backward: dx +=
     * its gradient to x, dbias += (dbias NULL: none), the hook's own parameters' gradients +=;
     * no gradient of w is formed. forward and backward above may be NULL beside these. */
    void (*linear_forward)(st_linear_hook *h, int mm, float *out, const float *x, const float *w, const float *bias,
                           int N);
    void (*linear_backward)(st_linear_hook *h, int mm, float *dx, float *dbias, const float *dout, const float *x,
                            const float *w, int N);
    /* Optional (NULL: the base's gradient vector): where the gradient of the base's tensor
     * element at `offset` goes, NULL for a tensor that forms none (POET-X keeps the gradients
     * of what trains in its own vector and the base has none, strata/poetx.h). layer >= 0:
     * offset inside that block's slab; layer < 0: offset in the base's vector. Read by the
     * backwards when the base's gradient vector is NULL and frozen is 0. */
    float *(*grad_at)(st_linear_hook *h, int layer, size_t offset);
    /* Optional (held_block_bytes 0: none): the base's block matmul weights held in another
     * precision (frozen_dtype bf16 or int8), read by linear_forward and linear_backward, never
     * through w. Block l's are one run of held_block_bytes on the host at held_host(h, l). A
     * layer-streaming executor carries that run in place of the weights' fp32: it sets held to its
     * copy of the layer's run with layer, and the block's slab it passes is then a held slab
     * (block.h: the 1-D tensors only, packed). NULL: the hook reads its own, the slab is whole. */
    size_t held_block_bytes;
    const void *(*held_host)(st_linear_hook *h, int layer);
    const void *held;
};


typedef struct st_gpt2_model {
    st_gpt2_config cfg;
    st_backend *be;
    size_t n_params;
    float *params; /* backend memory, n_params */
    float *grads;  /* backend memory, n_params, same layout */
    int params_untouched; /* 1: params from st_alloc_untouched (a frozen base's, host memory) */
    int n_tensors;
    st_param_info *tensors;
    size_t block_offset0; /* element offset of block 0 */
    size_t block_numel;   /* elements per block slab */
    st_gpt2_acts *acts;      /* sized for (B, T) by st_gpt2_alloc_acts */
    int B, T;
    float mean_loss;
    /* Where the embedding and the head find their parameters: emb_w is wte (V, C)
     * followed by wpe (maxT, C), lnf_w is ln_f weight then bias (2C); *_g the same for
     * gradients. st_gpt2_create points them into params/grads; a layer-streaming executor
     * points them at its device copies (see st_gpt2_create_shell). */
    float *emb_w, *lnf_w, *emb_g, *lnf_g;
    /* Packed documents (st_gpt2_set_docs): backend copies of the positions and doc_start of
     * the batch, NULL when off (positions 0..T-1, causal attention over the whole row). */
    int32_t *docs;                  /* the allocation: 2 (B,T) int32 */
    const int32_t *pos_dev, *ds_dev;
    st_linear_hook *hook;           /* NULL: none (LoRA sets it, strata/lora.h) */
} st_gpt2_model;

st_status st_gpt2_create(st_gpt2_model *m, const st_gpt2_config *cfg, st_backend *be, st_err *err);
/* The tensor table and layout of st_gpt2_create without the parameter and gradient
 * vectors: params, grads and the emb/lnf pointers are NULL until the caller sets the
 * emb/lnf pointers (a streaming executor keeps the full vectors on the host and runs
 * the block functions on device slabs). st_gpt2_free releases it. */
st_status st_gpt2_create_shell(st_gpt2_model *m, const st_gpt2_config *cfg, st_backend *be, st_err *err);
void st_gpt2_free(st_gpt2_model *m);

/* GPT-2's initialisation: weights N(0, 0.02), residual projections scaled by
 * 1/sqrt(2L), biases 0, LayerNorm weight 1 and bias 0. Deterministic in seed. */
void st_gpt2_init_random(st_gpt2_model *m, uint64_t seed);

const st_param_info *st_gpt2_find_tensor(const st_gpt2_model *m, const char *name);

/* Activations for batches of B sequences of T tokens (T <= max_seq). */
st_status st_gpt2_alloc_acts(st_gpt2_model *m, int B, int T, st_err *err);
size_t st_gpt2_act_bytes(const st_gpt2_config *cfg, int B, int T);
/* The last forward's per-row losses (host, B x T; rows with a target < 0 carry no loss):
 * valid from st_gpt2_alloc_acts* to the next one; NULL before. */
const float *st_gpt2_row_losses(const st_gpt2_model *m);
/* The same with per-layer activations for only the first n_layers layers (0..n_layer):
 * the shared buffers (tokens, embedding output, head, backward scratch) and n_layers
 * st_gpt2_layer_acts sets. An executor that places block activations itself passes 0. */
st_status st_gpt2_alloc_acts_layers(st_gpt2_model *m, int B, int T, int n_layers, st_err *err);
size_t st_gpt2_act_bytes_layers(const st_gpt2_config *cfg, int B, int T, int n_layers);
/* Only what the block functions need besides their activation sets: token ids and the
 * forward and backward scratch (the block interface's bound state). */
st_status st_gpt2_alloc_scratch(st_gpt2_model *m, int B, int T, st_err *err);
size_t st_gpt2_scratch_bytes(const st_gpt2_config *cfg, int B, int T);

/* Forward over inputs (B,T); with targets, returns the mean loss over positions whose
 * target is >= 0. If dloss != 0 the logits are replaced by their gradient scaled by
 * dloss (call st_gpt2_backward next). Host pointers to int32 token ids. */
float st_gpt2_forward(st_gpt2_model *m, const int32_t *inputs, const int32_t *targets, float dloss);
/* The same, calling hook (when not NULL) before the weights of each part are read
 * (st_model.weight_hook). */
float st_gpt2_forward_hooked(st_gpt2_model *m, const int32_t *inputs, const int32_t *targets, float dloss,
                          void (*hook)(void *ctx, size_t offset, size_t n), void *ctx);
/* Packed documents for the following forwards and backwards, until the next call or
 * st_gpt2_alloc_acts*: positions (B,T) index wpe, doc_start (B,T) restricts attention
 * (attention_doc_forward); host arrays checked by st_docs_check, copied now; either NULL:
 * that part as today (wpe[t], causal). */
st_status st_gpt2_set_docs(st_gpt2_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err);
/* Accumulate parameter gradients (+=) for the last forward. */
void st_gpt2_backward(st_gpt2_model *m);
/* The same, calling hook (when not NULL) after each block (st_grad_hook). */
void st_gpt2_backward_hooked(st_gpt2_model *m, void (*hook)(void *ctx, size_t offset, size_t n), void *ctx);
void st_gpt2_zero_grad(st_gpt2_model *m);
/* Logits (B,T,V) of the last forward made with dloss == 0 (backend memory). */
const float *st_gpt2_logits(const st_gpt2_model *m);

/* Model FLOPs for one training step (forward + backward) per token at sequence length T:
 *   6 * (L*12*C^2 + V*C)   matmul weights, including the tied classifier
 * + 6 * L * T * C          causal attention (QK^T and PV, forward 2*2*T*C/2, x3 for backward)
 * Norms, biases, GELU, softmax and the attention recompute are not counted. */
double st_gpt2_flops_per_token(const st_gpt2_config *cfg, int T);


/* The step in pieces, for executors that place blocks themselves (layer streaming,
 * activation checkpointing). A block reads its weights from a slab of block_numel
 * floats (laid out as above) wherever it lives, its input from `in`, and writes its
 * activations into a st_gpt2_block_acts; gpt2_forward/backward are these pieces run
 * over the model's own parameters and per-layer activations.
 *   forward:  embed_forward -> block_forward x L -> head_forward
 *   backward: head_backward -> block_backward x L (reverse) -> embed_backward
 * dres (N, C) carries the gradient of the residual stream between them. */
typedef struct st_gpt2_block_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fchg;
    float *out; /* the block's output (N, C): the next block's input */
} st_gpt2_block_acts;

st_gpt2_block_acts st_gpt2_layer_acts(const st_gpt2_model *m, int l);
/* One block's activations carved from buf (st_gpt2_block_act_floats(m) floats, for the
 * model's current B and T) with the output at out (N, C), which lies outside buf. */
size_t st_gpt2_block_act_floats(const st_gpt2_model *m);
st_gpt2_block_acts st_gpt2_block_acts_at(const st_gpt2_model *m, float *buf, float *out);
/* Block l's input (l == n_layer: the final LayerNorm's input). */
const float *st_gpt2_layer_input(const st_gpt2_model *m, int l);
void st_gpt2_embed_forward(st_gpt2_model *m, const int32_t *inputs, const int32_t *targets);
void st_gpt2_block_forward(st_gpt2_model *m, const float *wslab, const float *in, const st_gpt2_block_acts *a);
float st_gpt2_head_forward(st_gpt2_model *m, const float *x, const int32_t *targets, float dloss);
void st_gpt2_head_backward(st_gpt2_model *m, const float *x, float *dres);
/* gslab += gradients; dres: in, d(block output); out, d(block input) */
void st_gpt2_block_backward(st_gpt2_model *m, const float *wslab, float *gslab, const float *in, const st_gpt2_block_acts *a,
                         float *dres);
void st_gpt2_embed_backward(st_gpt2_model *m, const float *dres);
float *st_gpt2_dresidual(st_gpt2_model *m);
/* The backend copy of the last embed_forward's token ids (N int32). */
int32_t *st_gpt2_token_ids(st_gpt2_model *m);
/* The (N,C) scratch the block functions write between calls (free between them: the
 * embedding of packed documents gathers wpe's rows there). */
float *st_gpt2_scratch(st_gpt2_model *m);

/* Hugging Face-compatible weights: every tensor under its GPT-2 name, F32, tied head
 * omitted (as save_pretrained writes it). Load accepts names with or without the
 * "transformer." prefix, and F32/BF16/F16 data; shapes must match the configuration. */
st_status st_gpt2_save_safetensors(const st_gpt2_model *m, const char *path, st_err *err);
st_status st_gpt2_load_safetensors(st_gpt2_model *m, const char *path, st_err *err);
/* A Hugging Face directory: config.json (GPT2LMHeadModel) + model.safetensors (F32). */
st_status st_gpt2_save_hf(const st_gpt2_model *m, const char *dir, st_err *err);
/* Reading one back (the hub's gpt2 too): 1 when DIR/config.json names GPT-2
 * (GPT2LMHeadModel, GPT2Model or model_type "gpt2"); its shape, with every field that would
 * change the equations refused by name (dropout is accepted: strata trains without it). */
int st_gpt2_hf_is_dir(const char *dir);
st_status st_gpt2_hf_config_read(const char *dir, st_gpt2_config *cfg, st_err *err);
struct st_model;
/* The model of DIR with its weights (DIR/model.safetensors). */
st_status st_gpt2_model_create_hf(struct st_model **out, const char *dir, st_backend *be, st_err *err);

/* ------------------------------------------------------------------ any architecture
 * The training loop, benchmarks and checkpoints see a model through this interface:
 * a flat parameter vector (with its tensor table and a gradient of the same layout)
 * and a few operations. GPT-2 implements it today; other decoders plug in the same way.
 *
 *     st_model *m;
 *     st_model_create(&m, "gpt2-mini", NULL, be, &err);
 *     m->ops->alloc_acts(m, B, T, &err);
 *     float loss = m->ops->forward(m, inputs, targets, 1.0f / (B * T));
 *     m->ops->backward(m);
 */
typedef struct st_model st_model;

/* C(M,N) = op(A) op(B), inner size K, `count` times per step; ta/tb: transposed. */
typedef struct st_gemm_shape { int M, N, K, ta, tb, count; } st_gemm_shape;

struct st_arch; /* block.h */
struct st_decode_info;

typedef struct st_model_ops {
    const char *arch; /* "gpt2" */
    st_status (*alloc_acts)(st_model *m, int B, int T, st_err *err);
    float (*forward)(st_model *m, const int32_t *inputs, const int32_t *targets, float dloss);
    void (*backward)(st_model *m);
    void (*init_random)(st_model *m, uint64_t seed);
    st_status (*save)(const st_model *m, const char *path, st_err *err);
    st_status (*load)(st_model *m, const char *path, st_err *err);
    double (*flops_per_token)(const st_model *m, int T);
    /* one line: "L=12 C=768 NH=12 V=50257" */
    void (*describe)(const st_model *m, char *buf, size_t cap);
    void (*destroy)(st_model *m);
    /* The sgemm shapes one training step makes (for the step benchmark's ceiling):
     * writes at most max, returns how many. */
    int (*step_gemms)(const st_model *m, int B, int T, st_gemm_shape *out, int max);
    /* The model's architecture as executors see it (block.h): a new st_arch the caller
     * frees with st_arch_free. */
    st_status (*get_arch)(const st_model *m, struct st_arch **out, st_err *err);
    /* A Hugging Face model directory DIR (config.json and safetensors weights) in dtype
     * ST_BF16 or ST_F32; an architecture that writes only F32 (GPT-2) ignores dtype. */
    st_status (*save_hf)(const st_model *m, const char *dir, st_dtype dtype, st_err *err);
    /* Logits (B, T, V) of the last forward made with dloss == 0 (backend memory). */
    const float *(*logits)(const st_model *m);
    /* What a KV-cached decoder (generate.h) needs besides the tensor table: the block's
     * kind and widths, and the rotary tables of max_T positions where the kind has them. */
    void (*decode_info)(const st_model *m, struct st_decode_info *out);
    /* cos, sin (max_T, head_size / 2) on the host; NULL for a model without rotary positions. */
    void (*rope_tables)(const st_model *m, int max_T, float *cos, float *sin);
    /* Packed documents (st_model_set_docs); NULL: the model has no document attention. */
    st_status (*set_docs)(st_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err);
} st_model_ops;

/* A decoder block's kind, as a one-token decode step runs it. */
typedef enum st_decode_kind {
    ST_DECODE_LN_GELU = 0,    /* LayerNorm, learned positions, GELU MLP, (in, out) weights: GPT-2 */
    ST_DECODE_RMS_SWIGLU = 1  /* RMSNorm, rotary positions, SwiGLU MLP, (out, in) weights: Llama family */
} st_decode_kind;

typedef struct st_decode_info {
    st_decode_kind kind;
    int n_layer, n_embd, n_head, n_kv_head, head_size;
    int mlp_width;      /* the first MLP matmul's output (GPT-2 4C; Llama 2F, gate|up) */
    int mlp_act_width;  /* its activation's width (4C; F) */
    float eps;          /* RMSNorm epsilon (unused by LayerNorm, whose op has GPT-2's) */
    int sliding_window; /* > 0: the checkpoint attends over only this many positions */
} st_decode_info;

/* Called by backward as soon as a block's gradient is complete: the range [offset, offset +
 * n) of the flat gradient, from the last block to the first (data parallel reduces it then,
 * while the blocks below run). The rest (head, final norm, embeddings) is complete when
 * backward returns. */
typedef void (*st_grad_hook)(void *ctx, size_t offset, size_t n);
/* Called after a forward with its per-row losses (host, n rows; a row whose target is < 0
 * carries no loss): k counts the forwards of one step (its micro-batches). */
typedef void (*st_row_loss_hook)(void *ctx, int k, const float *losses, const int32_t *targets, size_t n);

struct st_model {
    const st_model_ops *ops;
    st_backend *be;
    size_t n_params;
    float *params, *grads; /* backend memory, same layout */
    int n_tensors;
    const st_param_info *tensors;
    int max_seq, vocab_size;
    void *impl;
    st_grad_hook grad_hook; /* NULL: none */
    void *grad_hook_ctx;
    /* Called by forward before it first reads the weights [offset, offset + n): the
     * embeddings, each block, then what follows the blocks, in increasing order (data
     * parallel waits there for the weights the ranks gather after their update). */
    st_grad_hook weight_hook; /* NULL: none */
    void *weight_hook_ctx;
    /* The last forward's per-row losses (host, the B x T of alloc_acts; a row whose target
     * is < 0 carries no loss), set by alloc_acts. */
    const float *row_losses;
};

/* Packed documents: rows of B x T inputs that hold several documents each.
 * positions (B,T): each input's position in its document (GPT-2's wpe row, the Llama
 * family's rotary angle); doc_start (B,T): the first position, in its row, of each input's
 * document, so that attention at t sees only keys in [doc_start[t], t] (backend.h). Checks
 * (ST_ERR_INVALID naming the row and position): 0 <= doc_start[t] <= t, doc_start changes
 * only to start a document (doc_start[t] == t there), 0 <= positions[t] < max_seq. Either
 * may be NULL. *plain_pos: positions NULL or t everywhere; *plain_ds: doc_start NULL or 0
 * everywhere (the model then runs exactly as without them, the same bits). */
st_status st_docs_check(const int32_t *positions, const int32_t *doc_start, int B, int T, int max_seq,
                        int *plain_pos, int *plain_ds, st_err *err);
/* The documents of the following forwards and backwards (the model's B x T, host arrays
 * copied now), until the next call or alloc_acts; NULL, NULL: one sequence a row (today).
 * ST_ERR_UNSUPPORTED from a model or backend without document attention. */
st_status st_model_set_docs(st_model *m, const int32_t *positions, const int32_t *doc_start, st_err *err);

/* Shape overrides for a preset; 0 keeps the preset's value. */
typedef struct st_model_overrides {
    int vocab_size, max_seq, n_layer, n_head, n_embd;
    /* not a shape: 1 makes the base of a method over frozen weights (LoRA, POET-X), which
     * st_model_create_from builds without a gradient vector (grads NULL), preset or directory */
    int no_grads;
} st_model_overrides;

/* A GPT-2 model of shape cfg on be (weights uninitialised: init_random or load). */
st_status st_model_create_gpt2(st_model **out, const st_gpt2_config *cfg, st_backend *be, st_err *err);
/* A model by preset name (see st_model_preset_names) with optional overrides. */
st_status st_model_create(st_model **out, const char *preset, const st_model_overrides *ov, st_backend *be,
                          st_err *err);
const char *st_model_preset_names(void);
void st_model_free(st_model *m);
void st_model_zero_grad(st_model *m);
/* Every parameter finite? A NaN or Inf loaded from FROM (a file or directory, for the
 * message) is refused with ST_ERR_NONFINITE naming the tensor and element: training on it
 * would skip every step. */
st_status st_model_check_finite(const st_model *m, const char *from, st_err *err);
/* A model from a Hugging Face directory when hf_dir is non-empty (GPT-2 or the Llama
 * family, told apart by its config.json, never guessed; its weights loaded when
 * with_weights, else uninitialised; ov's shape ignored: the directory fixes it), else from
 * a preset name with overrides (as st_model_create). */
st_status st_model_create_from(st_model **out, const char *preset, const char *hf_dir, const st_model_overrides *ov,
                               int with_weights, st_backend *be, st_err *err);
/* A model's shape whatever its family: what a configuration check or a planner needs
 * without building the model. */
typedef struct st_model_shape {
    const char *arch;   /* "gpt2" or "llama" (the Llama family), as st_model_ops.arch */
    int from_dir;       /* 1: read from a Hugging Face directory (which fixes the shape) */
    int n_layer, n_embd, n_head, n_kv_head, vocab_size, max_seq;
    double n_params;    /* parameters (elements) */
    double act_bytes;   /* about the bytes of one training micro-batch's activations at the
                         * resolve's B x T (0 when not given) */
    char desc[96];      /* "L=12 C=768 NH=12 V=50257 maxT=1024" (the Llama family adds NKV=) */
} st_model_shape;

/* The shape st_model_create_from would build, checked, allocating nothing: from the Hugging
 * Face directory hf_dir when it is non-empty (GPT-2 or the Llama family, told apart by its
 * config.json; an override may only repeat the directory's value), else from the preset
 * with overrides ov (may be NULL). act_bytes is counted for batch B x T (0, 0: not counted).
 * arch (NULL: not wanted) receives the architecture (block.h; free it with st_arch_free).
 * Errors name the input as the training configuration's keys do: 'init_from', 'model', an
 * override's key, or "model shape" for a shape the family refuses. */
st_status st_model_resolve(const char *preset, const char *hf_dir, const st_model_overrides *ov, int B, int T,
                           st_model_shape *out, struct st_arch **arch, st_err *err);
/* Wrap an existing GPT-2 (the st_model does not own it). */
void st_model_wrap_gpt2(st_model *out, st_gpt2_model *g);

#endif

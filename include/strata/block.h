/* block.h - a decoder as an executor sees it: an embedding, n identical blocks, a head.
 *
 * Every architecture strata trains (GPT-2, the Llama family) implements st_arch_ops, and
 * the executors (src/exec/) see a model only through it: they place the blocks' weight
 * slabs, activations and gradients wherever they like (device slots, host RAM, a disk
 * store) and call these functions on whatever memory the slabs are in. The model's own
 * forward and backward (model.h) are these same pieces run over one parameter vector,
 * so an executor that calls them in the same order gets the same bits.
 *
 * The flat parameter vector (n_params floats; the gradient has the same layout):
 *     [0, emb_numel)                         what embed_forward reads: the token embedding
 *                                            (V, C) at 0, then any position table (GPT-2's wpe)
 *     block l: [block_offset0 + l * block_numel, + block_numel)   (block_offset0 == emb_numel)
 *     [norm_offset, + norm_numel)            the final norm (GPT-2: weight then bias)
 *     [head_offset, + V * C)                 the classifier, rows (V, C), logits = x W^T:
 *                                            == 0 (the token embedding) when tied, else lm_head
 * The head is the same for every architecture: norm_forward, then logits = xn W^T over
 * all V rows or over chunks of them (online softmax), cross-entropy, and back:
 *     head forward:  norm_forward(xn, stats, x) ; matmul_forward(logits, xn, W, V rows, ST_W_OUT_IN)
 *     head backward: dxn = 0 ; matmul_backward(dxn, dW, logits=dlogits, xn, W) ; dres = 0 ;
 *                    norm_backward(dres, dnorm, dxn, x, stats)
 * which is exactly what the model's own forward and backward do.
 *
 * Gradients ACCUMULATE (+=) into g and dres, as the backend's ops do; the caller zeroes.
 *
 * A forward and backward over host vectors, block by block (what st_model's forward and
 * backward do; an executor moves the slabs in between):
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_arch *a = NULL;
 *     st_blocks *b = NULL;
 *     st_gpt2_config cfg;
 *     enum { B = 2, T = 16 };
 *     int32_t inputs[B * T] = {0};
 *     if (st_backend_cpu_create(&be, 0, &err) || st_gpt2_config_preset("gpt2-tiny", &cfg, &err) ||
 *         st_arch_gpt2(&a, &cfg, &err) || st_blocks_bind(&b, a, be, B, T, &err)) return 1;
 *     const st_arch_layout *ly = &a->lay;
 *     int L = ly->n_blocks;
 *     size_t N = (size_t)B * T, C = ly->n_embd, set = st_block_act_floats(a, B, T);
 *     float *p = be->ops->alloc(be, sizeof(float) * ly->n_params);  // on be, zeroed
 *     float *g = be->ops->alloc(be, sizeof(float) * ly->n_params);
 *     float *outs = be->ops->alloc(be, sizeof(float) * (L + 1) * N * C);  // block inputs, output
 *     float *acts = be->ops->alloc(be, sizeof(float) * L * set);
 *     float *dres = be->ops->alloc(be, sizeof(float) * N * C);
 *     if (!p || !g || !outs || !acts || !dres) return 1;
 *     a->ops->init(a, p, 1337);                // (CPU backend: p is host memory)
 *     a->ops->embed_forward(b, p, inputs, outs);
 *     for (int l = 0; l < L; l++)
 *         a->ops->block_forward(b, p + ly->block_offset0 + l * ly->block_numel, outs + l * N * C,
 *                               acts + l * set, outs + (l + 1) * N * C);
 *     // ... head forward and backward into dres (above) ...
 *     for (int l = L - 1; l >= 0; l--) {
 *         size_t w = ly->block_offset0 + l * ly->block_numel;
 *         a->ops->block_backward(b, p + w, g + w, outs + l * N * C, acts + l * set, dres);
 *     }
 *     a->ops->embed_backward(b, g, dres);
 *     float *bufs[] = {p, g, outs, acts, dres};
 *     for (int i = 0; i < 5; i++) be->ops->dealloc(be, bufs[i]);
 *     st_blocks_free(b);
 *     st_arch_free(a);
 *     st_backend_free(be);
 *
 * End of example.
 */
#ifndef STRATA_BLOCK_H
#define STRATA_BLOCK_H

#include "strata/backend.h"
#include "strata/core.h"
#include "strata/model.h"

typedef struct st_arch st_arch;
typedef struct st_blocks st_blocks;

typedef struct st_arch_layout {
    int n_blocks;
    size_t n_params;
    size_t emb_numel;     /* [0, emb_numel): the embedding's parameters */
    size_t block_offset0; /* == emb_numel */
    size_t block_numel;
    size_t norm_offset, norm_numel; /* the final norm */
    size_t head_offset;   /* the classifier's (V, C) rows: 0 when tied */
    int tied;
    int vocab_size, n_embd, max_seq;
    /* the tensor table (Hugging Face names, roles), in vector order: n_pre_tensors for the
     * embedding, tensors_per_block per block, n_post_tensors for the norm (and head) */
    int n_tensors, n_pre_tensors, tensors_per_block, n_post_tensors;
    const st_param_info *tensors;
    int norm_stat_floats; /* floats per row the final norm keeps for its backward */
} st_arch_layout;

typedef struct st_arch_ops {
    const char *name; /* "gpt2", "llama" */
    /* One block's activation set for (B, T), in floats (its output is not in it). */
    size_t (*block_act_floats)(const st_arch *a, int B, int T);
    /* Bytes st_blocks_bind allocates on the backend for (B, T): token ids, backward
     * scratch, tables (rotary), each allocation rounded as the arena rounds it. */
    size_t (*bind_bytes)(const st_arch *a, int B, int T);
    st_status (*bind)(st_blocks *b, st_err *err); /* fills b->state */
    void (*unbind)(st_blocks *b);

    /* out (N, C) from host token ids (copied to the backend and kept for embed_backward)
     * and the embedding's parameters emb_w ([0, emb_numel) of the vector, backend memory).
     * host_inputs NULL: the ids the caller copied into token_ids(b) already (an executor
     * that sends every token of a micro-batch in one traced copy). */
    void (*embed_forward)(st_blocks *b, const float *emb_w, const int32_t *host_inputs, float *out);
    /* Where embed_forward keeps the token ids: B x T int32 in the backend's memory. */
    int32_t *(*token_ids)(st_blocks *b);
    /* emb_g ([0, emb_numel) of the gradient) += d(embedding) for the last embed_forward. */
    void (*embed_backward)(st_blocks *b, float *emb_g, const float *dres);
    /* One block over its weight slab w (block_numel floats): out = block(in), keeping its
     * activations in acts (block_act_floats). out and in are (N, C) and do not overlap. */
    void (*block_forward)(st_blocks *b, const float *w, const float *in, float *acts, float *out);
    /* A held slab (the hook's held set, model.h's st_linear_hook: a streamed base whose matmul
     * weights the hook holds in another precision): w holds only the block's 1-D tensors (norms,
     * biases), in the table's order, packed; the 2-D tensors (the matmul weights) take no room and
     * are the hook's. Gradient offsets handed to grad_at stay the whole slab's. */
    /* g += d/dw; dres: in, d(block output); out, d(block input). acts as its forward left them. */
    void (*block_backward)(st_blocks *b, const float *w, float *g, const float *in, const float *acts, float *dres);
    /* The final norm: xn (N, C) and stats (N * norm_stat_floats) from x; nw its parameters. */
    void (*norm_forward)(st_blocks *b, const float *nw, const float *x, float *xn, float *stats);
    /* dx += d/dx, ng += d/dnw, from dxn. */
    void (*norm_backward)(st_blocks *b, float *dx, float *ng, const float *dxn, const float *x, const float *nw,
                          const float *stats);

    /* The architecture's initialisation into a host vector of n_params floats, the values
     * the model's init_random gives for the same seed. */
    void (*init)(const st_arch *a, float *host_params, uint64_t seed);
    /* Training FLOPs (forward + backward) per token at sequence length T: one block, and
     * the classifier (the model's flops_per_token is n_blocks * block + head). */
    double (*block_flops_per_token)(const st_arch *a, int T);
    double (*head_flops_per_token)(const st_arch *a);
    void (*destroy)(st_arch *a);
    /* Packed documents for the following embed/block calls (st_blocks_set_docs); NULL: the
     * architecture's blocks have none. */
    st_status (*set_docs)(st_blocks *b, const int32_t *host_positions, const int32_t *host_doc_start, st_err *err);
} st_arch_ops;

struct st_arch {
    const st_arch_ops *ops;
    st_arch_layout lay;
    void *impl; /* the architecture's configuration (st_gpt2_config, st_llama_config), owned */
};

/* An arch bound to a backend and a batch shape. */
struct st_blocks {
    const st_arch *arch;
    st_backend *be;
    int B, T;
    void *state; /* the architecture's (token ids, scratch, tables), on be */
    st_linear_hook *hook; /* NULL: none; else called at each block matmul (model.h), its
                           * layer set by whoever runs the blocks */
};

st_status st_arch_gpt2(st_arch **out, const st_gpt2_config *cfg, st_err *err);
/* st_llama_config is in llama.h: st_arch_llama(st_arch **, const st_llama_config *, st_err *). */
/* The architecture of a model made by st_model_create / st_model_create_hf (a copy the
 * caller frees). */
st_status st_arch_of_model(st_arch **out, const st_model *m, st_err *err);
void st_arch_free(st_arch *a);

static inline size_t st_block_act_floats(const st_arch *a, int B, int T) { return a->ops->block_act_floats(a, B, T); }
st_status st_blocks_bind(st_blocks **out, const st_arch *a, st_backend *be, int B, int T, st_err *err);
void st_blocks_free(st_blocks *b);
/* The documents of the bound batch (model.h, st_model_set_docs: the same arrays and
 * checks), copied now, until the next call; NULL, NULL: one sequence a row. GPT-2's and
 * the Llama family's blocks take them (the embedding reads the positions, attention the
 * doc_start); ST_ERR_UNSUPPORTED from an architecture without set_docs, unless both are
 * NULL. */
st_status st_blocks_set_docs(st_blocks *b, const int32_t *positions, const int32_t *doc_start, st_err *err);

#endif

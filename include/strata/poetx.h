/* poetx.h - POET-X: every matmul weight of a block trained as W = R W0 P with W0 frozen and R,
 * P orthogonal (Qiu et al., POET 2025; POET-X 2026), the rest of the model (embeddings, norms,
 * biases, an untied head) trained as usual.
 *
 * R (d_out, d_out) and P (d_in, d_in) are block-diagonal under random permutations,
 *     P = Pi_in^T blockdiag(G_1 .. G_m) Pi_in,   (Pi x)[i] = x[perm[i]],
 * each block G the Cayley-Neumann polynomial (I + Q)(I + Q + ... + Q^k) of a skew-symmetric Q
 * (b, b) stored as its b(b-1)/2 strict upper entries (backend.h's poet_* ops). The map is applied
 * to the activations, y = R (W0 (P x)) + bias, never formed; no gradient of W0 is formed. Each
 * weight of the Hugging Face model has its own R and P (the Llama family's q, k, v, gate, up each;
 * GPT-2's c_attn one of width 3C).
 *
 * A POET-X model is an st_model over a base model (its weights set): its parameter vector holds
 * the base's trainable tensors (every tensor but the blocks' matmul weights, under the base's
 * names) and then the packed Q of every weight ("<weight less .weight>.poet_q_in" (d_in/b,
 * b(b-1)/2), ".poet_q_out" (d_out/b, ...)), all Q at the end, [st_poetx_q_offset, n_params).
 * Q starts at 0 (the model starts as the base). A merge (st_poetx_merge) folds R and P into W0
 * (fp32), sets Q to 0 and redraws the permutations from the seed and the step; the optimizer's
 * moments of the Q range are the caller's to reset.
 *
 * W0 is held pre-permuted, W0' = Pi_out W0 Pi_in^T (W0'[r][c] = W0[perm_out[r]][perm_in[c]], in
 * the base's storage order: GPT-2's Conv1D transposed alike), so that the block rotations run on
 * contiguous blocks: y = Pi_out^T R' W0' P' (Pi_in x) + bias, R' and P' the block-diagonal
 * rotations, x gathered once on the way in and y scattered once on the way out. The base's
 * vector (fp32) or the store (bf16, int8: their groups over the held layout) holds W0'; save_hf
 * and st_poetx_w0 give W0 in the base's layout; checkpoints and st_poetx_save_w0 write W0' with
 * metadata poetx_w0_layout "permuted" (a file without it holds W0 in the base's layout, as
 * before: permuted at load).
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *be = NULL;
 *     st_model *base = NULL, *m = NULL;
 *     st_poetx_config pc = {.block = 8, .terms = 4};
 *     enum { B = 2, T = 8 };
 *     int32_t in[B * T] = {0}, tgt[B * T] = {0};
 *     if (st_backend_cpu_create(&be, 0, &err) || st_model_create(&base, "gpt2-tiny", NULL, be, &err)) {
 *         fprintf(stderr, "strata: %s\n", err.msg);
 *         return 1;
 *     }
 *     base->ops->init_random(base, 1);
 *     if (st_poetx_model_create(&m, base, &pc, 1, &err) || m->ops->alloc_acts(m, B, T, &err)) {
 *         fprintf(stderr, "strata: %s\n", err.msg); // base is freed with m, or here on failure
 *         return 1;
 *     }
 *     st_model_zero_grad(m);
 *     float loss = m->ops->forward(m, in, tgt, 1.0f / (B * T));
 *     m->ops->backward(m);                          // m->grads: the Q's and the base's trainables
 *     st_poetx_merge(m, 1, 200, &err);              // W0 <- R W0 P, Q <- 0, new permutations
 *     printf("loss %.3f, %zu trainable parameters\n", loss, m->n_params);
 *     st_model_free(m);                             // and the base
 *     st_backend_free(be);
 *
 * End of example.
 */
#ifndef STRATA_POETX_H
#define STRATA_POETX_H

#include "strata/model.h"

/* The precision the frozen W0 is held in (src/model/frozen_store.c): fp32 (the base's own
 * vector), bf16 (round to nearest even) or int8 (asymmetric, per group of ST_FROZEN_GROUP
 * consecutive values of the weight as stored: an fp32 scale and zero each, codes rounded to the
 * nearest). bf16 and int8 are dequantised a panel at a time inside the matmuls (a buffer of
 * ST_FROZEN_PANEL_BYTES), never as a whole fp32 copy; the fp32 pages of W0 are given back once
 * rounded. A merge is done in fp32 for the weight merged, then rounded back. */
typedef enum st_frozen_dtype { ST_FROZEN_F32 = 0, ST_FROZEN_BF16 = 1, ST_FROZEN_INT8 = 2 } st_frozen_dtype;
#define ST_FROZEN_GROUP 256
#define ST_FROZEN_PANEL_BYTES ((size_t)2 << 20)
/* "fp32", "bf16", "int8" */
const char *st_frozen_dtype_name(st_frozen_dtype d);
/* The dtype named s (st_frozen_dtype_name's spelling): 0, or -1 for no such name. */
int st_frozen_dtype_parse(const char *s, st_frozen_dtype *out);
/* The groups (int8) and bytes a weight of numel values holds in d. */
size_t st_frozen_groups(size_t numel);
size_t st_frozen_bytes(st_frozen_dtype d, size_t numel);
/* The panel buffer of the dequantising matmuls for weights of at most max_numel values:
 * ST_FROZEN_PANEL_BYTES, or the largest weight's fp32 bytes where smaller. */
size_t st_frozen_panel_bytes(size_t max_numel);
/* The bytes one block's matmul weights take held in d, as LoRA and POET-X hold them for layer
 * streaming (each in one run: codes, then int8's scales and zeros, each part 64-byte aligned; the
 * largest block's), over a GPT-2 ("gpt2") or Llama ("llama") tensor table; 0 for fp32. */
size_t st_frozen_held_block_bytes(const st_param_info *tensors, int n_tensors, const char *arch, st_frozen_dtype d);

typedef struct st_poetx_config {
    int block; /* b >= 2: divides both dimensions of every matmul weight of the blocks */
    int terms; /* k >= 0: the Neumann terms of the Cayley polynomial */
    int recompute; /* 0: each weight's h = u W0^T (N x d_out floats per weight) is kept from the
                    * forward for the backward; 1: the backward forms u = P x and h again from
                    * the layer's input (one more W0 product and apply per weight, nothing kept) */
    st_frozen_dtype frozen_dtype; /* W0's precision (0: fp32); bf16 and int8 on the cpu backend */
} st_poetx_config;

/* What the POET-X model holds besides its vectors and the base's: the scratch for one weight's
 * G (G is formed where it is used, never kept across a step) and the kept h of every weight
 * (recompute 0; for the activations allocated, 0 before alloc_acts), in bytes. */
void st_poetx_extra_bytes(const st_model *m, size_t *g_scratch, size_t *kept_h);
/* W0 as held: the bytes of every matmul weight in frozen_dtype (fp32: the base's vector's share)
 * and the panel buffer of the dequantising matmuls (0 with fp32). */
void st_poetx_frozen_bytes(const st_model *m, size_t *w0, size_t *panel);

/* The POET-X model over base (GPT-2 or the Llama family, its weights set): Q = 0, the
 * permutations drawn from (seed, step 0). Takes base (freed with the POET-X model; on failure
 * freed here too). Refused, naming the key and the tensor: a block size that does not divide
 * both dimensions of some weight ('poetx_block'), terms < 0 ('poetx_terms'), a backend without
 * the poet_* ops, a frozen_dtype other than fp32 on a backend whose memory is not the host's
 * ('frozen_dtype'). W0 is rounded into frozen_dtype from the base's weights as they are (and again
 * by init_random, which takes the base's weights anew), the base's fp32 pages of it given back. */
st_status st_poetx_model_create(st_model **out, st_model *base, const st_poetx_config *cfg, uint64_t seed,
                                st_err *err);
/* st_poetx_model_create over the weights of the Hugging Face directory hf_dir, read into base (a
 * model of hf_dir's shape built without its weights: st_model_create_from with with_weights 0
 * and no_grads) after the model and its W0 store are made: each tensor checked finite as it is
 * read (st_model_check_finite's rule, FROM hf_dir) and each W0 put into the frame of the
 * permutations and the store before the next tensor is read (with bf16 or int8 rounded and its
 * fp32 pages given back: the base's W0 is never whole in fp32). The same model, bit for bit, as
 * st_model_create_from with weights, then st_poetx_model_create. Takes base (freed on failure). */
st_status st_poetx_model_create_from(st_model **out, st_model *base, const char *hf_dir, const st_poetx_config *cfg,
                                     uint64_t seed, st_err *err);
/* What st_poetx_model_create_drawn calls to make W0 orthogonal (poetx_init orthogonal) as it is
 * drawn: fn(ctx, base, ks, n, err) replaces weights ks[0..n) of poetx_init's walk
 * (st_poetx_init_weights' order), drawn in base's vector, by st_poetx_orthogonal_w0's of each
 * weight's stream (the bits st_poetx_orthogonal_base gives them: st_poetx_orthogonal_some, or
 * under ranks each weight drawn by one rank and broadcast); batch (>= 1): how many weights it
 * takes at once (its threads' QRs), so that many are held in fp32 together. */
typedef struct st_poetx_orth {
    st_status (*fn)(void *ctx, st_model *base, const int *ks, int n, st_err *err);
    void *ctx;
    int batch;
} st_poetx_orth;
/* st_poetx_model_create over a preset's base drawn from seed (its init_random's values, bit for
 * bit), made orthogonal by orth where not NULL, after the model and its W0 store are made: base
 * built without its weights and without gradients (st_model_create_from with no_grads), and each
 * W0 put into the frame of the permutations and the store before the next tensor is drawn (with
 * orth, each batch of them once drawn), with bf16 or int8 rounded and its fp32 pages given back:
 * the base's W0 is never whole in fp32. The same model, bit for bit, as init_random, then
 * st_poetx_orthogonal_base where orthogonal, then st_poetx_model_create. Takes base (freed on
 * failure). */
st_status st_poetx_model_create_drawn(st_model **out, st_model *base, const st_poetx_config *cfg, uint64_t seed,
                                      const st_poetx_orth *orth, st_err *err);
/* Layer streaming (strata/stream.h): the hook an executor's blocks call over m's base in place
 * of each block matmul (its st_stream_config.hook, frozen 0: the executor forms the gradients of
 * the base's embeddings, norms, biases and untied head and hands them to the hook's grad_at, in
 * m->grads), with its scratch and kept h for B x T rows and none of the base's own activations.
 * W0 is the block's weight as the executor passes it (its device copy of the base's fp32 vector,
 * which holds W0 pre-permuted), or with frozen_dtype bf16 or int8 the executor's copy of the
 * layer's held run (held_block_bytes, held_host: model.h); Q, the permutations and the gradients
 * are m's, host memory (the CPU backend's). Until the next alloc_acts or bind. */
st_status st_poetx_hook_bind(st_model *m, int B, int T, st_linear_hook **hook, st_err *err);
/* The trainable tensors of m (embeddings, norms, biases, an untied head) copied into the base's
 * vector, bit for bit as m's own forward reads them: what an executor streaming the base reads
 * after m's optimizer has updated them (then st_stream_params_changed). Host memory only. */
void st_poetx_to_base(st_model *m);
/* The configuration checked against a tensor table, allocating nothing: the parameters it
 * would train (*n_params, may be NULL) and of them the packed Q's (*n_q, may be NULL). */
st_status st_poetx_check(const st_param_info *tensors, int n_tensors, const char *arch, const st_poetx_config *cfg,
                         size_t *n_params, size_t *n_q, st_err *err);
int st_model_is_poetx(const st_model *m);
st_model *st_poetx_base(const st_model *m);
const st_poetx_config *st_poetx_config_of(const st_model *m);
/* Where the Q's start in the parameter vector (they run to n_params). */
size_t st_poetx_q_offset(const st_model *m);
/* The permutations of weight `weight` (its Hugging Face name, with or without ".weight"), host
 * int32 arrays of d_in and d_out entries, each a permutation of 0..d-1 (checked); its W0 moved
 * into their frame (as st_poetx_draw_perms). */
st_status st_poetx_set_perms(st_model *m, const char *weight, const int32_t *perm_in, const int32_t *perm_out,
                             st_err *err);
/* The permutations of every weight drawn afresh from (seed, step) (what a merge at step does), W0
 * moved into their frame (exact for fp32 and bf16; int8's groups rounded again). */
st_status st_poetx_draw_perms(st_model *m, uint64_t seed, int64_t step, st_err *err);
/* What the model's init_random does, with its failure returned (out of memory for the
 * permutations or W0's move into their frame: the model is then not to be trained): the base's
 * trainables into the vector, Q = 0, the permutations of (seed, step 0), W0 from the base's vector
 * into their frame and its precision. */
st_status st_poetx_init_state(st_model *m, uint64_t seed, st_err *err);
/* Weight `weight`'s W0 (its Hugging Face name, with or without ".weight") in the base's layout
 * and fp32, as the held W0' unpermuted (R and P not folded in), into dst (host, numel floats). */
st_status st_poetx_w0(const st_model *m, const char *weight, float *dst, st_err *err);
/* The merged dense model, as save_hf writes it (the trainables as they are, every W = R W0 P
 * folded in fp32, in the base's layout), made in the base's own vector: *out the base, a plain
 * model again with no gradient vector (for forwards: sampling, scoring). m is freed either way
 * (on failure with its base, *out NULL). */
st_status st_poetx_merged_base(st_model *m, st_model **out, st_err *err);
/* A merge: W0 <- R W0 P in fp32 for every weight (one weight's fp32 copy at a time; stored back
 * in frozen_dtype), Q <- 0, the permutations redrawn from (seed, step). The model's function is
 * unchanged up to fp32 rounding (and frozen_dtype's). */
st_status st_poetx_merge(st_model *m, uint64_t seed, int64_t step, st_err *err);
/* W0 alone, as held (frozen_dtype's bytes), and the permutations, to path atomically (temporary,
 * fsync, rename), tagged with the step of the merge that made it (metadata poetx_merge_step)
 * and, where run is not NULL, with the run's fingerprint (metadata poetx_run: a line the caller
 * makes, the same for every file of one run): what a run with its trained vector on disk keeps
 * besides it. The trained vector is not written. */
st_status st_poetx_save_w0(const st_model *m, const char *path, int64_t merge_step, const char *run, st_err *err);
/* W0 and the permutations from a file st_poetx_save_w0 wrote for the merge at merge_step, byte
 * for byte; the trained vector untouched. Another poetx_block, frozen_dtype or merge step is
 * refused naming it, and so is (run not NULL) another run's poetx_run; nothing is changed. A
 * file without poetx_run (written before the key) loads, logged as unchecked. */
st_status st_poetx_load_w0(st_model *m, const char *path, int64_t merge_step, const char *run, st_err *err);
/* The W0 file at path against run (st_poetx_load_w0's check alone, nothing loaded): ST_OK where
 * its poetx_run is run or it has none (logged); ST_ERR_INVALID naming the file, the key and both
 * values; the file unreadable: its error. */
st_status st_poetx_w0_check_run(const char *path, const char *run, st_err *err);

/* For a run from scratch (key poetx_init orthogonal): w (rows x cols, row-major, as initialised)
 * replaced by s times a random matrix with orthonormal rows or columns (Haar: the Q of a QR of a
 * Gaussian matrix drawn from seed), every singular value s = gain x w's RMS singular value
 * (|w|_F / sqrt(min(rows, cols))): POET-X keeps W0's spectrum, so it starts flat and at the scale
 * training wants rather than spread and small. name: for messages. Refused: gain not positive
 * ('poetx_init_gain'); out of memory (8 bytes a value for the QR). */
st_status st_poetx_orthogonal_w0(float *w, int rows, int cols, float gain, uint64_t seed, const char *name,
                                 st_err *err);
/* st_poetx_orthogonal_w0 over every matmul weight of the blocks of base (GPT-2 or the Llama
 * family, its weights initialised), each from its own stream of seed; the rest unchanged. Before
 * st_poetx_model_create, or before the POET-X model's init_random (which takes the base's weights
 * anew). */
st_status st_poetx_orthogonal_base(st_model *base, float gain, uint64_t seed, st_err *err);
/* The same for part `part` of `parts` (0 <= part < parts) only: the k-th weight of the walk
 * (from 0) where k % parts == part, with the bits st_poetx_orthogonal_base gives it (its stream
 * is k's whatever the parts), the rest unchanged. Ranks each draw a part and broadcast it (each
 * weight from the rank that drew it), so every rank holds the same W0 whatever its CPU's LAPACK
 * kernels, each rank drawing 1 / parts of them. */
st_status st_poetx_orthogonal_base_part(st_model *base, float gain, uint64_t seed, int part, int parts, st_err *err);
/* The same for the weights ks[0..n) of the walk (from 0) with ks[j] % parts == part, the rest
 * unchanged: st_poetx_model_create_drawn's batches (parts 1), or a rank's share of them. */
st_status st_poetx_orthogonal_some(st_model *base, float gain, uint64_t seed, const int *ks, int n, int part,
                                   int parts, st_err *err);
/* The matmul weights poetx_init walks, in its order: their count, and (out not NULL, room for
 * the count) their entries of base's tensor table. */
int st_poetx_init_weights(const st_model *base, const st_param_info **out);

#endif

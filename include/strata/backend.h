/* backend.h - the compute interface every backend implements (CPU today, CUDA later).
 *
 * A backend is a small vtable plus a context, as in ggml. Pointers passed to the ops
 * live in the backend's memory (host RAM for cpu, device memory for cuda). All float
 * tensors are row-major and contiguous. Names: B batch, T time, C channels,
 * OC output channels, V vocabulary, NH heads, hs = C/NH head size. N = B*T rows.
 *
 * Backward functions ACCUMULATE (+=) into parameter gradients (dw, db, dwte, ...),
 * and into input gradients unless the comment says "writes". The caller zeroes.
 *
 * Memory contract for the two big ops:
 *   - attention keeps only out and lse (B, NH, T) between forward and backward; the
 *     backward recomputes the scores (FlashAttention-style). Scratch inside an op is
 *     transient.
 *   - the classifier's logits buffer (N, V) is overwritten in place by dlogits.
 *
 * Example:
 *
 *     st_err err = {0};
 *     st_backend *be;
 *     if (st_backend_cpu_create(&be, 0, &err) != ST_OK) return 1;
 *     enum { N = 4, C = 8, OC = 16 };          // out (N, OC) = inp (N, C) x w (C, OC)
 *     float *inp = be->ops->alloc(be, sizeof(float) * N * C); // backend memory, zeroed
 *     float *w = be->ops->alloc(be, sizeof(float) * C * OC);
 *     float *out = be->ops->alloc(be, sizeof(float) * N * OC), host[N * OC];
 *     if (!inp || !w || !out) return 1;
 *     be->ops->matmul_forward(be, out, inp, w, NULL, N, C, OC, ST_W_IN_OUT);
 *     be->ops->synchronize(be);
 *     be->ops->copy_to_host(be, host, out, sizeof host);
 *     be->ops->dealloc(be, inp);
 *     be->ops->dealloc(be, w);
 *     be->ops->dealloc(be, out);
 *     st_backend_free(be);
 *
 * End of example.
 */
#ifndef STRATA_BACKEND_H
#define STRATA_BACKEND_H

#include "strata/core.h"

/* Layout of a matmul weight. HF GPT-2 Conv1D stores (C, OC): out = inp @ w.
 * nn.Linear and the tied lm head store (OC, C): out = inp @ w^T. */
typedef enum st_wlayout { ST_W_IN_OUT = 0, ST_W_OUT_IN = 1 } st_wlayout;

typedef struct st_backend st_backend;

typedef struct st_backend_ops {
    const char *name;
    void (*free)(st_backend *be);

    /* memory (in the backend's address space) */
    void *(*alloc)(st_backend *be, size_t bytes);   /* zeroed; NULL on failure */
    void (*dealloc)(st_backend *be, void *p);
    void (*memset0)(st_backend *be, void *p, size_t bytes);
    void (*copy_to_device)(st_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*copy_to_host)(st_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*synchronize)(st_backend *be);

    /* out (B,T,C) = wte[inp] + wpe[t];  inp (B,T) token ids */
    void (*encoder_forward)(st_backend *be, float *out, const int32_t *inp, const float *wte,
                            const float *wpe, int B, int T, int C);
    /* dwte, dwpe += */
    void (*encoder_backward)(st_backend *be, float *dwte, float *dwpe, const float *dout,
                             const int32_t *inp, int B, int T, int C);

    /* out (N,C), mean and rstd (N) saved for backward */
    void (*layernorm_forward)(st_backend *be, float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int N, int C);
    /* dinp, dw, db += (dinp aliases neither dout nor inp: the CPU backend's rows write dinp while
     * the parameter gradients' columns still read dout and inp, with no barrier between) */
    void (*layernorm_backward)(st_backend *be, float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean, const float *rstd,
                               int N, int C);

    /* out (N,OC) = inp (N,C) x w (+ bias (OC), may be NULL). writes out. */
    void (*matmul_forward)(st_backend *be, float *out, const float *inp, const float *w,
                           const float *bias, int N, int C, int OC, st_wlayout layout);
    /* dinp (N,C) +=, dw +=, dbias (OC) += ; any of dinp, dw, dbias may be NULL */
    void (*matmul_backward)(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int N, int C, int OC, st_wlayout layout);

    /* Causal self-attention. qkv (B,T,3C) packed [q | k | v], each head hs wide.
     * writes out (B,T,C) and lse (B,NH,T) = log-sum-exp of each row of scaled scores. */
    void (*attention_forward)(st_backend *be, float *out, float *lse, const float *qkv, int B, int T,
                              int C, int NH);
    /* dqkv (B,T,3C) +=, recomputing the scores from qkv and lse. */
    void (*attention_backward)(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int C, int NH);

    /* GELU, tanh approximation. out writes; dinp += */
    void (*gelu_forward)(st_backend *be, float *out, const float *inp, int n);
    void (*gelu_backward)(st_backend *be, float *dinp, const float *inp, const float *dout, int n);

    /* out = a + b (writes); backward: da += dout, db += dout */
    void (*residual_forward)(st_backend *be, float *out, const float *a, const float *b, int n);
    void (*residual_backward)(st_backend *be, float *da, float *db, const float *dout, int n);

    /* Fused softmax + cross-entropy over logits (N,V). Writes losses (N) (per-row loss,
     * 0 where target < 0, i.e. masked). If dloss != 0, overwrites logits IN PLACE with
     * dlogits = (softmax - onehot(target)) * dloss for unmasked rows, 0 for masked rows. */
    void (*crossentropy_forward_backward)(st_backend *be, float *logits, float *losses,
                                          const int32_t *targets, int N, int V, float dloss);

    /* ---- Llama family (appended; the entries above are unchanged). Names: NKV key/value
     * heads (NH % NKV == 0; NKV == 1 is multi-query), hs head size, F MLP (feed-forward) width.
     * Several ops read rows of a wider packed buffer: ld is the row stride in floats. */

    /* out (B,T,C) = wte[inp], no position table; inp (B,T). writes out. */
    void (*embedding_forward)(st_backend *be, float *out, const int32_t *inp, const float *wte, int B, int T,
                              int C);
    /* dwte (V,C) += */
    void (*embedding_backward)(st_backend *be, float *dwte, const float *dout, const int32_t *inp, int B, int T,
                               int C);

    /* RMSNorm over groups of hs: for row n < N and group h < H, x = inp + n*ld + h*hs (hs
     * floats), out at the same offset = x / sqrt(mean(x^2) + eps) * w (hs, shared by the
     * groups). H = 1, hs = ld = C is the per-token norm; H = NH, hs = head size is Qwen3's
     * per-head q/k norm. writes out (only the normed elements) and rstd (N,H). */
    void (*rmsnorm_forward)(st_backend *be, float *out, float *rstd, const float *inp, const float *w, int N,
                            int H, int hs, int ld, float eps);
    /* dinp (same layout as inp) +=, dw (hs) += */
    void (*rmsnorm_backward)(st_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int H, int hs, int ld);

    /* Rotary embedding, IN PLACE, Hugging Face's rotate_half convention: for head h of
     * token (b,t) at x + (b*T+t)*ld + h*hs and i < hs/2, with c = cos[t*hs/2+i], s = sin[..]:
     *   x[i] <- x[i] c - x[i+hs/2] s,   x[i+hs/2] <- x[i+hs/2] c + x[i] s.
     * cos, sin (>=T, hs/2) are computed once on the host (theta, Llama-3 scaling). */
    void (*rope_forward)(st_backend *be, float *x, const float *cos, const float *sin, int B, int T, int H,
                         int hs, int ld);
    /* IN PLACE on dx: the gradient w.r.t. the rotated values becomes the gradient w.r.t.
     * the inputs (the inverse rotation). Neither writes nor accumulates elsewhere. */
    void (*rope_backward)(st_backend *be, float *dx, const float *cos, const float *sin, int B, int T, int H,
                          int hs, int ld);

    /* SwiGLU: inp (N,2F) packed [gate | up] per row; out (N,F) = silu(gate) * up. writes out. */
    void (*swiglu_forward)(st_backend *be, float *out, const float *inp, int N, int F);
    /* dinp (N,2F) += */
    void (*swiglu_backward)(st_backend *be, float *dinp, const float *inp, const float *dout, int N, int F);

    /* Causal grouped-query attention. q rows (B,T) of NH heads, k and v rows of NKV heads,
     * each row ld floats apart (q, k, v usually point into one packed [q | k | v] buffer);
     * query head h reads key/value head h / (NH/NKV). Scale 1/sqrt(hs).
     * writes out (B,T,NH*hs) and lse (B,NH,T). Same memory contract as attention_forward. */
    void (*attention_gqa_forward)(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                  const float *v, int ld, int B, int T, int NH, int NKV, int hs);
    /* dq, dk, dv (same layout and ld as q, k, v) +=, recomputing scores from q, k and lse.
     * When query heads share a kv head, the CPU backend sums their dk, dv in a fixed head
     * order, through transient scratch of 2 x (B,NH,T,hs) floats when B*NKV work units are
     * too few to spread over the threads. */
    void (*attention_gqa_backward)(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out,
                                   const float *lse, int ld, int B, int T, int NH, int NKV, int hs);

    /* ---- the chunked classifier of the streaming executor (appended): an online softmax
     * over vocabulary chunks, logits (N, nr) for vocabulary rows [r0, r0 + nr), and the
     * bf16 gradient drain. Rows whose target < 0 are masked. */
    /* rmax (N) = -inf, rsum (N) = 0, tlogit (N) = 0. writes. */
    void (*softmax_chunk_init)(st_backend *be, float *rmax, double *rsum, float *tlogit, int N);
    /* Pass 1, per unmasked row: rmax = max(rmax, the chunk's max) with rsum rescaled by
     * exp(old - new) when it rises, rsum += sum exp(logit - rmax) (in double), tlogit =
     * the target's logit when the target is in the chunk. */
    void (*softmax_chunk_stats)(st_backend *be, const float *logits, const int32_t *targets, int N, int nr, int r0,
                                float *rmax, double *rsum, float *tlogit);
    /* Pass 2, IN PLACE: logits become (softmax - onehot(target)) * dloss from the final
     * rmax and rsum, 0 for masked rows (what crossentropy_forward_backward writes). */
    void (*softmax_chunk_grad)(st_backend *be, float *logits, const int32_t *targets, int N, int nr, int r0,
                               const float *rmax, const double *rsum, float dloss);
    /* dst (n bf16, rounded to nearest even, st_convert's rounding) = src (n f32). writes. */
    void (*to_bf16)(st_backend *be, uint16_t *dst, const float *src, size_t n);

    /* ---- attention restricted to documents (appended; NULL in a backend without them):
     * packed rows hold several documents and no query sees another document's keys.
     * doc_start (B,T) int32 in backend memory: query t of row b sees keys j with
     * doc_start[b*T+t] <= j <= t, i.e. the first position (in its row) of the token's
     * document; 0 <= doc_start[b*T+t] <= t, constant within a document (the blocks follow
     * it). Otherwise exactly attention_forward/_backward and attention_gqa_forward/_backward
     * (shapes, write vs +=, out and lse kept); doc_start all 0 gives their bits. The CPU
     * backend computes only the unmasked keys. */
    void (*attention_doc_forward)(st_backend *be, float *out, float *lse, const float *qkv,
                                  const int32_t *doc_start, int B, int T, int C, int NH);
    void (*attention_doc_backward)(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                   const float *out, const float *lse, const int32_t *doc_start, int B, int T,
                                   int C, int NH);
    void (*attention_gqa_doc_forward)(st_backend *be, float *out, float *lse, const float *q, const float *k,
                                      const float *v, const int32_t *doc_start, int ld, int B, int T, int NH,
                                      int NKV, int hs);
    void (*attention_gqa_doc_backward)(st_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                       const float *q, const float *k, const float *v, const float *out,
                                       const float *lse, const int32_t *doc_start, int ld, int B, int T, int NH,
                                       int NKV, int hs);

    /* ---- asynchronous copies (appended; NULL in a backend whose copies are host work, as
     * the CPU backend's: the copy engine then runs copy_to_device/_host on its own thread).
     * d2h 0: host -> device, 1: device -> host; each direction is its own ordered queue. */
    /* Page-locked host memory for copies, zeroed; NULL on failure. Free with host_free. */
    void *(*host_alloc)(st_backend *be, size_t bytes);
    void (*host_free)(st_backend *be, void *p);
    /* Queue a copy of `bytes` bytes, ordered AFTER every op queued so far on the backend, and
     * return at once with its ticket: > 0, increasing per direction (0 on failure: the error
     * is kept as the backend's own errors are). An op queued later is NOT ordered after the
     * copy: the host waits (copy_sync) before it queues an op that reads the copied bytes or
     * writes the source, and before it reads or reuses the host side. */
    uint64_t (*copy_async)(st_backend *be, int d2h, void *dst, const void *src, size_t bytes);
    /* Block the calling thread until that direction's copies up to `ticket` are done.
     * Any thread may wait. */
    void (*copy_sync)(st_backend *be, int d2h, uint64_t ticket);
    /* Nonzero when that direction's copies up to `ticket` are done; never blocks. */
    int (*copy_query)(st_backend *be, int d2h, uint64_t ticket);

    /* ---- device memory (appended; NULL where allocations are unbounded host memory, as the
     * CPU and reference backends'): the bytes the backend's allocations hold now (*used),
     * their high-water mark since it was made (*peak) and all they can hold (*capacity),
     * in the blocks it carves (the CUDA backend: its arena, cuBLASLt's workspace a block of
     * it; tier's budgeted arena: the budget's). Read through st_backend_memory. */
    void (*memory)(st_backend *be, size_t *used, size_t *peak, size_t *capacity);

    /* ---- orthogonal block transforms of POET-X (appended; NULL in a backend without them,
     * the CUDA backend's today). Names: b block size (>= 2), nb blocks, k Neumann terms,
     * d = nb*b features of a row (b divides d), N rows (0 does nothing). A skew-symmetric
     * block Q (b,b) is stored as its strict upper triangle, row by row: q[p] = Q[i][j] for
     * i < j, p counting (0,1), (0,2) .. (0,b-1), (1,2) ..; Q[j][i] = -Q[i][j], Q[i][i] = 0:
     * b(b-1)/2 floats per block.
     * G is the Cayley-Neumann polynomial of Q: the Cayley transform (I + Q)(I - Q)^-1 with
     * the inverse cut to k Neumann terms, G = (I + Q)(I + Q + Q^2 + ... + Q^k) =
     * I + 2Q + ... + 2Q^k + Q^(k+1). It is orthogonal up to G^T G - I, which for Q of
     * spectral norm t has eigenvalues e(s) = s^(2k+2) - 2 cos((k+1) pi/2) s^(k+1), s the
     * magnitudes of Q's eigenvalues (so |e| <= t^(2k+2) for even k, 2 t^(k+1) + t^(2k+2)
     * for odd k): derived in src/backend/ref/ops_ref_poetx.c, docs/ARCHITECTURE.md. */
    /* G (nb,b,b) from q (nb, b(b-1)/2), k >= 0. writes G. */
    void (*poet_cayley_forward)(st_backend *be, float *G, const float *q, int nb, int b, int k);
    /* dq (nb, b(b-1)/2) += the gradient through the polynomial of dG (nb,b,b), the
     * gradient w.r.t. G: dQ = sum over the terms, packed as dq[p] = dQ[i][j] - dQ[j][i]. */
    void (*poet_cayley_backward)(st_backend *be, float *dq, const float *dG, const float *q, int nb, int b, int k);
    /* The permuted block-diagonal apply, row by row: for each row x (d) of x (N,d),
     * y = P^T blockdiag(G_1 .. G_nb) P x with (P x)[i] = x[perm[i]], i.e.
     *   y[perm[j*b + r]] = sum_c G_j[r][c] x[perm[j*b + c]]      (trans 0)
     * and G_j^T in place of G_j for trans 1 (the inverse rotation). perm (d) int32, a
     * permutation of 0..d-1 in backend memory; NULL is the identity. writes y (N,d);
     * y may be x (in place). */
    void (*poet_apply_forward)(st_backend *be, float *y, const float *x, const float *G, const int32_t *perm,
                               int N, int d, int b, int trans);
    /* dx (N,d) += P^T blockdiag(G^T) P dy (G for trans 1); dG (nb,b,b) += sum over rows of
     * (P dy)_j (P x)_j^T ((P x)_j (P dy)_j^T for trans 1); either may be NULL. The gradient
     * of the packed q is then poet_cayley_backward of dG. The CPU backend sums dG over
     * fixed chunks of rows in a fixed order: the same bits for any thread count. */
    void (*poet_apply_backward)(st_backend *be, float *dx, float *dG, const float *dy, const float *x,
                                const float *G, const int32_t *perm, int N, int d, int b, int trans);

    /* ---- the caller's host memory page-locked for copies (appended; NULL where copies are
     * host work, as on the CPU and reference backends). host_register page-locks
     * [p, p + bytes) of memory the caller allocated (the CUDA backend: cudaHostRegister), so
     * that copy_async to and from it runs at pinned bandwidth and overlaps the compute, as
     * host_alloc's memory does; 0 on success, nonzero when refused (the memory stays
     * pageable: copies remain correct, only slower and synchronous). host_unregister undoes
     * it once no copy touches the memory (it waits for queued copies first), before the
     * caller frees it. */
    int (*host_register)(st_backend *be, void *p, size_t bytes);
    void (*host_unregister)(st_backend *be, void *p);

    /* ---- device timing (appended; NULL where the ops run when called, as on the CPU and
     * reference backends, so the host's clock around them is their time). timer_mark
     * records a mark behind every op queued so far (the CUDA backend: an event on the
     * compute stream) and returns its number (> 0, increasing; 0 on failure), from the
     * thread that queues the ops. timer_seconds waits until mark `to` is reached and
     * returns the device's seconds between marks `from` and `to`: what the ops queued
     * between them took on the device, queueing excluded; < 0 when unknown (a mark among
     * the last 4096 only). */
    uint64_t (*timer_mark)(st_backend *be);
    double (*timer_seconds)(st_backend *be, uint64_t from, uint64_t to);

    /* ---- scaled add of row blocks (appended; NULL in a backend without it, the CUDA
     * backend's today): for n < N and i < W, y[n*ldy + i] += alpha * x[n*ldx + i]. LoRA's
     * low-rank term goes into columns of a packed projection's output with it (ldy the packed
     * width, ldx = W), and its gradient comes back out (the strides swapped). */
    void (*axpy_rows)(st_backend *be, float *y, int ldy, const float *x, int ldx, float alpha, int N, int W);

    /* ---- bf16 back to fp32 (appended; NULL in a backend without it): dst (n f32) = src (n
     * bf16), exact (a bf16 is the top half of its fp32). With to_bf16 it keeps the block
     * executor's activation sets in bf16 (st_stream_plan.act_dtype): rounded after the
     * forward, widened where the backward reads them. writes. */
    void (*from_bf16)(st_backend *be, float *dst, const uint16_t *src, size_t n);

    /* ---- input gradients written, not added (appended; NULL in a backend without them, where
     * the caller clears the gradient and calls the op above). Each
     * is exactly the op it names (shapes, bits, dw and dbias +=) except that the input
     * gradient is WRITTEN: what dinp / dqkv held before is never read, so the clearing pass
     * and the re-reading of zeros go. attention_backward_write takes doc_start as
     * attention_doc_backward does; NULL is the causal op. */
    void (*matmul_backward_write)(st_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                  const float *inp, const float *w, int N, int C, int OC, st_wlayout layout);
    void (*gelu_backward_write)(st_backend *be, float *dinp, const float *inp, const float *dout, int n);
    void (*attention_backward_write)(st_backend *be, float *dqkv, const float *dout, const float *qkv,
                                     const float *out, const float *lse, const int32_t *doc_start, int B, int T,
                                     int C, int NH);

    /* ---- columns of rows through a permutation (appended; NULL in a backend without it): for
     * n < N and i < d, with perm (d) int32 a permutation of 0..d-1 in backend memory,
     *   ST_PERMUTE_GATHER       y[n*ldy + i]       = x[n*ldx + perm[i]]
     *   ST_PERMUTE_SCATTER      y[n*ldy + perm[i]] = x[n*ldx + i]
     *   ST_PERMUTE_SCATTER_ADD  y[n*ldy + perm[i]] += x[n*ldx + i]
     * POET-X holds W0 pre-permuted: an activation enters its frame by one gather and leaves it
     * by one scatter, and the block rotations in between take no permutation. y and x do not
     * overlap. writes (or adds to) y. */
    void (*poet_permute)(st_backend *be, float *y, int ldy, const float *x, int ldx, const int32_t *perm, int N,
                         int d, int mode);
} st_backend_ops;

/* poet_permute's modes */
enum { ST_PERMUTE_GATHER = 0, ST_PERMUTE_SCATTER = 1, ST_PERMUTE_SCATTER_ADD = 2 };

struct st_backend {
    const st_backend_ops *ops;
    void *ctx;
};

/* The CPU backend: OpenBLAS sgemm, OpenMP elsewhere. threads <= 0: OpenMP default. */
st_status st_backend_cpu_create(st_backend **out, int threads, st_err *err);
/* The plain single-threaded reference: float in and out, computed in double; the
 * oracle of the differential tests. */
st_status st_backend_ref_create(st_backend **out, st_err *err);
void st_backend_free(st_backend *be);
/* 1 when the backend's allocations are plain host memory that the host may read and
 * write in place (the CPU and reference backends); 0 for a GPU. */
int st_backend_host_memory(const st_backend *be);

/* Writing values from the host into a backend's memory without a second copy of them where
 * that memory is the host's: the host writes in place there (no buffer), and through one
 * staging buffer of `cap` floats on a device, copied to the device piece by piece.
 *
 *     st_host_stage hs;
 *     if (st_host_stage_open(&hs, be, largest, err)) return ...;  // nothing written yet
 *     for each piece (dst, n <= largest):
 *         fill(st_host_stage_at(&hs, dst), n);                   // dst itself, or the buffer
 *         st_host_stage_put(&hs, dst, n);                        // the buffer copied to dst
 *     st_host_stage_close(&hs);
 *
 * A piece is in the backend's memory once put (copy_to_device is synchronous): a caller
 * that must not leave half-written values behind checks everything before the first fill. */
typedef struct st_host_stage {
    st_backend *be;
    float *buf; /* NULL where the backend's memory is the host's */
    size_t cap; /* floats */
} st_host_stage;
st_status st_host_stage_open(st_host_stage *hs, st_backend *be, size_t cap, st_err *err);
float *st_host_stage_at(const st_host_stage *hs, float *dst);
void st_host_stage_put(const st_host_stage *hs, float *dst, size_t n);
void st_host_stage_close(st_host_stage *hs);

/* A GPU by name ("cuda", "cuda:N": the CUDA backend on device N, one cudaMalloc of `budget`
 * bytes): ST_ERR_UNSUPPORTED in a strata built without the CUDA backend (cmake
 * -DSTRATA_CUDA=ON builds it) or without such a device, ST_ERR_INVALID for "cpu" or another
 * name. tier.h's st_backend_device_create takes any device name (cpu: a budgeted arena). */
st_status st_backend_gpu_create(st_backend **out, const char *device, size_t budget, st_err *err);
/* The form of a device name alone, as st_backend_device_create takes it (nothing created;
 * cuda accepted in any build): *cuda_index -1 for "cpu" (or NULL or ""), N for "cuda"/"cuda:N". */
st_status st_backend_device_parse(const char *device, int *cuda_index, st_err *err);
/* Whether this strata has the backend of a device name (nothing created, no GPU touched):
 * ST_OK for cpu, and for cuda/cuda:N in a build with the CUDA backend; for cuda in one
 * without it ST_ERR_UNSUPPORTED, st_backend_device_create's message (how to build it). A
 * caller checks it before it writes anything (strata train: before the run directory). */
st_status st_backend_device_built(const char *device, st_err *err);
/* The first error a backend's ops met since it was created, where its ops run
 * asynchronously and return nothing (the CUDA backend: a kernel, copy or cuBLAS call,
 * after synchronizing its stream): a caller checks after a step and stops instead of
 * computing on garbage. ST_OK for the CPU and reference backends and the budgeted arena,
 * whose ops cannot fail once they return. */
st_status st_backend_status(st_backend *be, st_err *err);
/* A device's memory in bytes: *used now, *peak (the high-water mark since the device was
 * made) and *capacity (all its allocations can hold), any of them NULL if not wanted: the
 * budgeted arena's (st_backend_with_budget: capacity the budget) or the backend's `memory`
 * entry (the CUDA backend: its arena, capacity the budget rounded down to 256 bytes, used
 * and peak counting cuBLASLt's workspace). ST_ERR_UNSUPPORTED, and 0s, for a backend
 * without bounded memory (cpu, ref without a budget). What bench stream reports as
 * device_peak_bytes on every device. */
st_status st_backend_memory(st_backend *be, size_t *used, size_t *peak, size_t *capacity, st_err *err);
/* The bytes of a device budget that allocations get on st_backend_device_create's device:
 * all of it on the CPU; on a GPU the budget less the cuBLASLt workspace the CUDA backend
 * carves from its arena at creation. What an executor plans against. */
size_t st_backend_device_usable_bytes(const char *device, size_t budget);
/* The precision of a device's fp32 matmuls (strata train's key 'matmul'): ST_MATMUL_FP32
 * (every backend, the default; exact to the CPU backend's 1e-5), ST_MATMUL_TF32 (the CUDA
 * backend's tensor cores) or ST_MATMUL_BF16 (the CUDA backend's tensor cores, and the CPU
 * backend through oneDNN: AMX, AVX512-BF16, or emulated on AVX-512/AVX2): fp32 in and out,
 * the products of tf32- or bf16-rounded inputs, fp32 accumulation. ST_MATMUL_AUTO is a
 * request, never a backend's state: bf16 where the device has bf16 matrix units (a GPU; a
 * CPU with AMX-BF16 or AVX512-BF16 in a build with oneDNN), fp32 elsewhere
 * (st_backend_matmul_auto). Append-only: the CUDA backend indexes its compute types by it. */
typedef enum st_matmul_mode {
    ST_MATMUL_FP32 = 0,
    ST_MATMUL_TF32 = 1,
    ST_MATMUL_BF16 = 2,
    ST_MATMUL_AUTO = 3
} st_matmul_mode;
/* The mode named "fp32", "tf32", "bf16" or "auto" (NULL: fp32, the default), the one place
 * the names are read (the key's check, st_backend_set_matmul). Another name is
 * ST_ERR_INVALID naming the key 'matmul', the name and the four accepted; *mode is then
 * ST_MATMUL_FP32. */
st_status st_backend_matmul_parse(const char *name, st_matmul_mode *mode, st_err *err);
/* The name of a mode ("fp32", ...; "?" outside the enum). */
const char *st_backend_matmul_name(st_matmul_mode mode);
/* What matmul auto is on a device (st_backend_device_parse's names): ST_MATMUL_BF16 on cuda
 * and on a CPU with bf16 matrix units (cpuid: AMX-BF16 or AVX512-BF16, enabled by the OS) in
 * a build with oneDNN, else ST_MATMUL_FP32; why (may be NULL) gets the reason in words. */
st_matmul_mode st_backend_matmul_auto(const char *device, char *why, size_t why_size);
/* Whether a mode name is one a device of this build computes (nothing created): the name
 * (st_backend_matmul_parse), tf32 on cpu refused, and bf16 on cpu in a build without oneDNN
 * refused (ST_ERR_UNSUPPORTED, naming the key 'matmul' and how to build it); cuda takes all.
 * The key's check, before a run writes anything. */
st_status st_backend_matmul_check(const char *device, const char *mode, st_err *err);
/* Sets a device's matmul precision by name (st_backend_matmul_parse; auto resolved by
 * st_backend_matmul_auto and logged; the CUDA backend: st_backend_cuda_set_matmul; the CPU
 * backend: bf16 through oneDNN, where a CPU without bf16 units is told once, with the
 * emulated rate measured, to prefer fp32). tf32 on the CPU, bf16 in a build without oneDNN
 * and tf32/bf16 on the reference backend are refused naming them. */
st_status st_backend_set_matmul(st_backend *be, const char *mode, st_err *err);

/* A bf16 copy of the weights that a device's bf16 matmuls read instead of rounding each
 * weight at each call (the CPU backend under matmul bf16: oneDNN reads bf16 operands; the
 * CUDA backend's cuBLAS rounds inside its products and reads none). _read: 1 where the
 * matmuls would read a mapped copy now, else 0 (then _map and _round do nothing useful).
 * _map: until region is mapped again or cleared, a matmul whose weight operand lies wholly
 * inside base[0, n) reads it from copy at the same offset; the caller keeps copy equal to
 * base rounded by st_f32_to_bf16 (bit for bit what the matmul would round) while it is
 * mapped. copy NULL clears the region; region -1 clears all of them; st_backend_set_matmul
 * clears them too. _round: dst = src rounded so, over the threads (the CPU backend counts
 * its time as its weights' conversion). The block executor keeps such a copy, written by the
 * optimizer's pass (stream.h). */
#define ST_BF16_WEIGHT_REGIONS 4
int st_backend_bf16_weights_read(const st_backend *be);
void st_backend_bf16_weights_map(st_backend *be, int region, const float *base, const uint16_t *copy, size_t n);
void st_backend_bf16_weights_round(st_backend *be, uint16_t *dst, const float *src, size_t n);

/* OpenBLAS releases older than the machine fall back to their slowest kernels
 * (Prescott, SSE3) on CPUs they do not recognise: a 4x loss in every matmul. OpenBLAS
 * reads OPENBLAS_CORETYPE only when it is loaded, so a program calls this first thing
 * in main(): if the detected core is weaker than what the CPU supports and the user
 * has not set OPENBLAS_CORETYPE, it sets it (SkylakeX for AVX-512, Haswell for AVX2)
 * and re-executes the program; otherwise it returns. Returns the core name in use. */
const char *st_blas_fix_coretype(char **argv);
#endif

/* kernels_attn.cuh - the CUDA backend's causal attention in the flash style, forward and
 * backward, with grouped-query heads and optional documents, over fp32 or bf16 storage
 * (T: q, k, v, out, dout, dq, dk, dv) with fp32 arithmetic and lse. Semantics are the CPU
 * backend's attention_gqa_* and attention_gqa_doc_* (include/strata/backend.h): query head
 * h of row (b,t) at q + (b*T+t)*ld + h*hs reads kv head h / (NH/NKV) of the keys j with
 * doc_start[b*T+t] <= j <= t (0 without documents); scale 1/sqrt(hs); out (B,T,NH*hs),
 * lse (B,NH,T). GPT-2's packed attention_* is the case NKV = NH, ld = 3C.
 *
 * No T x T matrix exists: a block takes CU_ATT_BQ query rows of one head and walks the key
 * tiles of CU_ATT_BK keys at or before its last row, with the scores of one tile in shared
 * memory and an online softmax per row (running max and sum, the output rescaled when the
 * max rises); only out and lse are kept. The backward recomputes the probabilities from q,
 * k and lse, in two kernels so that no sum needs atomics: one per (query head, query tile)
 * sums dq over the key tiles in order; one per (kv head, key tile) sums dk and dv over the
 * group's query heads and the query rows in order. The two share their tile products
 * (cu_att_acc: dS K, or the transposed dS^T Q and P^T dO) and their stores
 * (cu_att_add_rows); their loops stay apart, each walking the other's tiles in its own
 * fixed order, which is what keeps atomics out. Each output element is written once,
 * from an fp32 accumulator (a bf16 result is the fp32 one rounded once), and the bits
 * never depend on timing. Head sizes up to CU_ATT_HS (cu_attn_supported). This is the
 * plain-FMA version, checked under the emulation; tensor-core tiles are later work. */
#ifndef STRATA_KERNELS_ATTN_CUH
#define STRATA_KERNELS_ATTN_CUH

#include "backend/cuda/kernels_common.cuh"

enum {
    CU_ATT_BQ = 16,                        /* query rows per tile */
    CU_ATT_BK = 16,                        /* keys per tile */
    CU_ATT_HS = 128,                       /* the largest head size */
    CU_ATT_LDS = CU_ATT_HS + 1,            /* shared row stride: rows of a tile in different banks */
    CU_ATT_THREADS = 64,                   /* two warps */
    CU_ATT_NW = CU_ATT_THREADS / 32,       /* warps */
    CU_ATT_RW = CU_ATT_BQ / CU_ATT_NW,     /* query rows (or keys) per warp */
    CU_ATT_DS = CU_ATT_HS / 32             /* head elements per lane: d = lane + 32 s */
};

/* the per-row (per-key) accumulator loops unrolled under nvcc, so that o[][], acc[][] stay
 * in registers (g++ in the emulation has no use for it) */
#if defined(__CUDACC__)
#define CU_ATT_UNROLL _Pragma("unroll")
#else
#define CU_ATT_UNROLL
#endif

static inline int cu_attn_supported(int hs) { return hs >= 1 && hs <= CU_ATT_HS; }

/* dst rows r < CU_ATT_BQ: the hs values at base + r*ld while r < n, zeros after */
template <class T>
__device__ __forceinline__ void cu_att_load(float (*dst)[CU_ATT_LDS], const T *base, size_t ld, int n, int hs) {
    for (int e = threadIdx.x; e < CU_ATT_BQ * hs; e += blockDim.x) {
        int r = e / hs, d = e % hs;
        dst[r][d] = r < n ? cu_load(base + (size_t)r * ld + d) : 0.0f;
    }
}

__device__ __forceinline__ float cu_att_dot(const float *a, const float *b, int hs) {
    float s = 0;
    for (int d = 0; d < hs; d++) s += a[d] * b[d];
    return s;
}

/* ---------------------------------------------------------------- forward */

template <class T>
__global__ void __launch_bounds__(CU_ATT_THREADS)
    k_attn_forward(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc_start, int ld, int B,
                   int T_, int NH, int NKV, int hs, float scale) {
    __shared__ float Qs[CU_ATT_BQ][CU_ATT_LDS], Ks[CU_ATT_BK][CU_ATT_LDS], Vs[CU_ATT_BK][CU_ATT_LDS];
    __shared__ float S[CU_ATT_BQ][CU_ATT_BK + 1];
    int nt = (T_ + CU_ATT_BQ - 1) / CU_ATT_BQ, G = NH / NKV, C = NH * hs;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int w = blockIdx.x; w < B * NH * nt; w += gridDim.x) {
        int b = w / (NH * nt), h = w / nt % NH, t0 = w % nt * CU_ATT_BQ;
        int nr = T_ - t0 < CU_ATT_BQ ? T_ - t0 : CU_ATT_BQ;
        size_t row0 = (size_t)b * T_;
        const int32_t *ds = doc_start ? doc_start + row0 : nullptr;
        const T *kh = k + row0 * ld + (size_t)(h / G) * hs, *vh = v + row0 * ld + (size_t)(h / G) * hs;
        __syncthreads(); /* the previous item's readers are done with Qs */
        cu_att_load(Qs, q + (row0 + t0) * ld + (size_t)h * hs, ld, nr, hs);
        float m[CU_ATT_RW], l[CU_ATT_RW], o[CU_ATT_RW][CU_ATT_DS];
        CU_ATT_UNROLL
        for (int i = 0; i < CU_ATT_RW; i++) {
            m[i] = -INFINITY, l[i] = 0;
            CU_ATT_UNROLL
            for (int s = 0; s < CU_ATT_DS; s++) o[i][s] = 0;
        }
        int kbeg = ds ? ds[t0] / CU_ATT_BK * CU_ATT_BK : 0; /* doc_start rises with t: the first row's is least */
        for (int k0 = kbeg; k0 < t0 + nr; k0 += CU_ATT_BK) {
            int nk = t0 + nr - k0 < CU_ATT_BK ? t0 + nr - k0 : CU_ATT_BK;
            __syncthreads(); /* the previous tile's readers are done with Ks, Vs, S */
            cu_att_load(Ks, kh + (size_t)k0 * ld, ld, nk, hs);
            cu_att_load(Vs, vh + (size_t)k0 * ld, ld, nk, hs);
            __syncthreads();
            for (int e = threadIdx.x; e < CU_ATT_BQ * CU_ATT_BK; e += blockDim.x) {
                int r = e / CU_ATT_BK, j = e % CU_ATT_BK, t = t0 + r, key = k0 + j;
                int ok = r < nr && key <= t && key >= (ds ? ds[t] : 0); /* t < T where r < nr */
                S[r][j] = ok ? scale * cu_att_dot(Qs[r], Ks[j], hs) : -INFINITY;
            }
            __syncthreads();
            CU_ATT_UNROLL
            for (int i = 0; i < CU_ATT_RW; i++) { /* every lane of the warp keeps the row's state */
                int r = warp + CU_ATT_NW * i;
                float mt = -INFINITY, p[CU_ATT_BK], psum = 0;
                CU_ATT_UNROLL
                for (int j = 0; j < CU_ATT_BK; j++) mt = fmaxf(mt, S[r][j]);
                if (mt == -INFINITY) continue; /* no key of this tile for this row */
                float mnew = fmaxf(m[i], mt), alpha = expf(m[i] - mnew);
                CU_ATT_UNROLL
                for (int j = 0; j < CU_ATT_BK; j++) {
                    p[j] = S[r][j] == -INFINITY ? 0.0f : expf(S[r][j] - mnew);
                    psum += p[j];
                }
                l[i] = l[i] * alpha + psum, m[i] = mnew;
                CU_ATT_UNROLL
                for (int s = 0; s < CU_ATT_DS; s++) {
                    int d = lane + 32 * s;
                    if (d >= hs) continue; /* not break: constant trip counts keep o[][] in registers */
                    float acc = o[i][s] * alpha;
                    CU_ATT_UNROLL
                    for (int j = 0; j < CU_ATT_BK; j++) acc += p[j] * Vs[j][d];
                    o[i][s] = acc;
                }
            }
        }
        CU_ATT_UNROLL
        for (int i = 0; i < CU_ATT_RW; i++) {
            int r = warp + CU_ATT_NW * i, t = t0 + r;
            if (r >= nr) continue;
            T *orow = out + (row0 + t) * C + (size_t)h * hs;
            CU_ATT_UNROLL
            for (int s = 0; s < CU_ATT_DS; s++) {
                int d = lane + 32 * s;
                if (d < hs) cu_store(orow + d, o[i][s] / l[i]);
            }
            if (lane == 0) lse[((size_t)b * NH + h) * T_ + t] = m[i] + logf(l[i]);
        }
    }
}

/* ---------------------------------------------------------------- backward */

/* delta of query row t of head h in batch b = dot(dout, out) over the head, the sum in order */
template <class T>
__device__ __forceinline__ float cu_att_delta(const T *dout, const T *out, size_t row, int h, int NH, int hs) {
    size_t o = row * (size_t)(NH * hs) + (size_t)h * hs;
    float dl = 0;
    for (int d = 0; d < hs; d++) dl += cu_load(dout + o + d) * cu_load(out + o + d);
    return dl;
}
/* delta[(b NH + h) T + t] for every row once (the backward kernels read it instead of
 * recomputing it with 16 of their 64 threads for every tile pair); the same sums, so the
 * same bits */
template <class T>
__global__ void k_attn_delta(float *delta, const T *dout, const T *out, int B, int T_, int NH, int hs) {
    size_t n = (size_t)B * NH * T_;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i % T_, bh = i / T_;
        int h = (int)(bh % NH);
        size_t b = bh / NH;
        delta[i] = cu_att_delta(dout, out, b * T_ + t, h, NH, hs);
    }
}

/* Qs, dOs: query rows t0.. of head h; Ls, Dl: their lse and delta = dot(dout, out) (from
 * the precomputed delta where given) */
template <class T>
__device__ __forceinline__ void cu_att_load_queries(float (*Qs)[CU_ATT_LDS], float (*dOs)[CU_ATT_LDS], float *Ls,
                                                    float *Dl, const T *q, const T *dout, const T *out,
                                                    const float *lse, size_t row0, int t0, int nr, int h, int ld,
                                                    int T_, int NH, int hs, const float *delta) {
    int C = NH * hs;
    cu_att_load(Qs, q + (row0 + t0) * ld + (size_t)h * hs, ld, nr, hs);
    cu_att_load(dOs, dout + (row0 + t0) * C + (size_t)h * hs, (size_t)C, nr, hs);
    for (int r = threadIdx.x; r < CU_ATT_BQ; r += blockDim.x) {
        float dl = 0;
        if (r < nr)
            dl = delta ? delta[((size_t)(row0 / T_) * NH + h) * T_ + t0 + r]
                       : cu_att_delta(dout, out, row0 + t0 + r, h, NH, hs);
        Dl[r] = dl;
        Ls[r] = r < nr ? lse[((size_t)(row0 / T_) * NH + h) * T_ + t0 + r] : 0.0f;
    }
}

/* P[r][j] = the probability of key k0+j for query t0+r, dS[r][j] = P (dP - delta) scale (0 where masked) */
__device__ __forceinline__ void cu_att_probs(float (*P)[CU_ATT_BK + 1], float (*dS)[CU_ATT_BK + 1],
                                             float (*Qs)[CU_ATT_LDS], float (*dOs)[CU_ATT_LDS],
                                             float (*Ks)[CU_ATT_LDS], float (*Vs)[CU_ATT_LDS], const float *Ls,
                                             const float *Dl, const int32_t *ds, int t0, int nr, int k0, int nk,
                                             int hs, float scale) {
    for (int e = threadIdx.x; e < CU_ATT_BQ * CU_ATT_BK; e += blockDim.x) {
        int r = e / CU_ATT_BK, j = e % CU_ATT_BK, t = t0 + r, key = k0 + j;
        int ok = r < nr && j < nk && key <= t && key >= (ds ? ds[t] : 0);
        float p = 0, g = 0;
        if (ok) {
            p = expf(scale * cu_att_dot(Qs[r], Ks[j], hs) - Ls[r]);
            g = p * (cu_att_dot(dOs[r], Vs[j], hs) - Dl[r]) * scale;
        }
        if (P) P[r][j] = p;
        dS[r][j] = g;
    }
}

/* The two backward kernels' products of a tile, into the fp32 accumulators of the rows o =
 * warp + CU_ATT_NW i a warp owns (its lanes over the head elements d = lane + 32 s < hs):
 * acc[i][s] += sum over x of M(o, x) X[x][d], x in order (the bits never depend on timing).
 * M(o, x) = M[o][x] for dq (o a query row, x its keys: dS K) or M[x][o] for dk and dv (o a
 * key, x the query rows: dS^T Q, P^T dO). */
template <bool TRANSPOSED>
__device__ __forceinline__ void cu_att_acc(float (&acc)[CU_ATT_RW][CU_ATT_DS], const float (*M)[CU_ATT_BK + 1],
                                           const float (*X)[CU_ATT_LDS], int hs) {
    static_assert(CU_ATT_BQ == CU_ATT_BK, "x runs over keys (dq) or query rows (dk, dv) alike");
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    CU_ATT_UNROLL
    for (int i = 0; i < CU_ATT_RW; i++) {
        int o = warp + CU_ATT_NW * i;
        CU_ATT_UNROLL
        for (int s = 0; s < CU_ATT_DS; s++) {
            int d = lane + 32 * s;
            if (d >= hs) continue; /* not break: constant trip counts keep acc[][] in registers */
            float a = acc[i][s];
            CU_ATT_UNROLL
            for (int x = 0; x < CU_ATT_BK; x++) a += (TRANSPOSED ? M[x][o] : M[o][x]) * X[x][d];
            acc[i][s] = a;
        }
    }
}

/* rows o < n of base (ld apart) += acc, as cu_att_acc owns them: each element written once */
template <class T>
__device__ __forceinline__ void cu_att_add_rows(T *base, size_t ld, const float (&acc)[CU_ATT_RW][CU_ATT_DS], int n,
                                                int hs) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    CU_ATT_UNROLL
    for (int i = 0; i < CU_ATT_RW; i++) {
        int o = warp + CU_ATT_NW * i;
        if (o >= n) continue;
        T *row = base + (size_t)o * ld;
        CU_ATT_UNROLL
        for (int s = 0; s < CU_ATT_DS; s++) {
            int d = lane + 32 * s;
            if (d < hs) cu_store(row + d, cu_load(row + d) + acc[i][s]);
        }
    }
}

/* dq += sum over keys of dS K; a block per (b, h, query tile) */
template <class T>
__global__ void __launch_bounds__(CU_ATT_THREADS)
    k_attn_backward_dq(T *dq, const T *dout, const T *q, const T *k, const T *v, const T *out, const float *lse,
                       const int32_t *doc_start, int ld, int B, int T_, int NH, int NKV, int hs, float scale,
                       const float *delta) {
    __shared__ float Qs[CU_ATT_BQ][CU_ATT_LDS], dOs[CU_ATT_BQ][CU_ATT_LDS];
    __shared__ float Ks[CU_ATT_BK][CU_ATT_LDS], Vs[CU_ATT_BK][CU_ATT_LDS];
    __shared__ float dS[CU_ATT_BQ][CU_ATT_BK + 1], Ls[CU_ATT_BQ], Dl[CU_ATT_BQ];
    int nt = (T_ + CU_ATT_BQ - 1) / CU_ATT_BQ, G = NH / NKV;
    for (int w = blockIdx.x; w < B * NH * nt; w += gridDim.x) {
        int b = w / (NH * nt), h = w / nt % NH, t0 = w % nt * CU_ATT_BQ;
        int nr = T_ - t0 < CU_ATT_BQ ? T_ - t0 : CU_ATT_BQ;
        size_t row0 = (size_t)b * T_;
        const int32_t *ds = doc_start ? doc_start + row0 : nullptr;
        const T *kh = k + row0 * ld + (size_t)(h / G) * hs, *vh = v + row0 * ld + (size_t)(h / G) * hs;
        __syncthreads();
        cu_att_load_queries(Qs, dOs, Ls, Dl, q, dout, out, lse, row0, t0, nr, h, ld, T_, NH, hs, delta);
        float acc[CU_ATT_RW][CU_ATT_DS] = {};
        int kbeg = ds ? ds[t0] / CU_ATT_BK * CU_ATT_BK : 0;
        for (int k0 = kbeg; k0 < t0 + nr; k0 += CU_ATT_BK) {
            int nk = t0 + nr - k0 < CU_ATT_BK ? t0 + nr - k0 : CU_ATT_BK;
            __syncthreads();
            cu_att_load(Ks, kh + (size_t)k0 * ld, ld, nk, hs);
            cu_att_load(Vs, vh + (size_t)k0 * ld, ld, nk, hs);
            __syncthreads();
            cu_att_probs(nullptr, dS, Qs, dOs, Ks, Vs, Ls, Dl, ds, t0, nr, k0, nk, hs, scale);
            __syncthreads();
            cu_att_acc<false>(acc, dS, Ks, hs);
        }
        cu_att_add_rows(dq + (row0 + t0) * ld + (size_t)h * hs, ld, acc, nr, hs);
    }
}

/* dk += sum of dS^T Q, dv += sum of P^T dO over the group's query heads (in order) and the
 * query rows (in order); a block per (b, kv head, key tile) */
template <class T>
__global__ void __launch_bounds__(CU_ATT_THREADS)
    k_attn_backward_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const T *out,
                        const float *lse, const int32_t *doc_start, int ld, int B, int T_, int NH, int NKV, int hs,
                        float scale, const float *delta) {
    __shared__ float Qs[CU_ATT_BQ][CU_ATT_LDS], dOs[CU_ATT_BQ][CU_ATT_LDS];
    __shared__ float Ks[CU_ATT_BK][CU_ATT_LDS], Vs[CU_ATT_BK][CU_ATT_LDS];
    __shared__ float P[CU_ATT_BQ][CU_ATT_BK + 1], dS[CU_ATT_BQ][CU_ATT_BK + 1], Ls[CU_ATT_BQ], Dl[CU_ATT_BQ];
    int nt = (T_ + CU_ATT_BK - 1) / CU_ATT_BK, G = NH / NKV;
    for (int w = blockIdx.x; w < B * NKV * nt; w += gridDim.x) {
        int b = w / (NKV * nt), kvh = w / nt % NKV, k0 = w % nt * CU_ATT_BK;
        int nk = T_ - k0 < CU_ATT_BK ? T_ - k0 : CU_ATT_BK;
        size_t row0 = (size_t)b * T_;
        const int32_t *ds = doc_start ? doc_start + row0 : nullptr;
        __syncthreads();
        cu_att_load(Ks, k + (row0 + k0) * ld + (size_t)kvh * hs, ld, nk, hs);
        cu_att_load(Vs, v + (row0 + k0) * ld + (size_t)kvh * hs, ld, nk, hs);
        float ak[CU_ATT_RW][CU_ATT_DS] = {}, av[CU_ATT_RW][CU_ATT_DS] = {};
        for (int h = kvh * G; h < kvh * G + G; h++)
            for (int t0 = k0; t0 < T_; t0 += CU_ATT_BQ) {
                if (ds && ds[t0] >= k0 + nk) break; /* later rows start their documents after this tile */
                int nr = T_ - t0 < CU_ATT_BQ ? T_ - t0 : CU_ATT_BQ;
                __syncthreads(); /* the previous rows' readers are done with Qs, dOs, P, dS */
                cu_att_load_queries(Qs, dOs, Ls, Dl, q, dout, out, lse, row0, t0, nr, h, ld, T_, NH, hs, delta);
                __syncthreads();
                cu_att_probs(P, dS, Qs, dOs, Ks, Vs, Ls, Dl, ds, t0, nr, k0, nk, hs, scale);
                __syncthreads();
                cu_att_acc<true>(ak, dS, Qs, hs);
                cu_att_acc<true>(av, P, dOs, hs);
            }
        size_t o = (row0 + k0) * ld + (size_t)kvh * hs;
        cu_att_add_rows(dk + o, ld, ak, nk, hs);
        cu_att_add_rows(dv + o, ld, av, nk, hs);
    }
}

/* ---------------------------------------------------------------- launchers (host) */

/* doc_start NULL: causal attention over whole rows. hs must pass cu_attn_supported. */
template <class T>
void cu_attn_forward(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc_start, int ld, int B,
                     int T_, int NH, int NKV, int hs, cudaStream_t s) {
    size_t items = (size_t)B * NH * ((T_ + CU_ATT_BQ - 1) / CU_ATT_BQ);
    ST_CUDA_LAUNCH(k_attn_forward<T>, st_cuda_grid(items, 1), CU_ATT_THREADS, 0, s, out, lse, q, k, v, doc_start, ld,
                   B, T_, NH, NKV, hs, 1.0f / sqrtf((float)hs));
}
/* scratch (device, scratch_floats floats, free on stream s): where delta is computed once
 * for every row when it holds B NH T floats; without it each tile pair recomputes it */
template <class T>
void cu_attn_backward(T *dq, T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const T *out,
                      const float *lse, const int32_t *doc_start, int ld, int B, int T_, int NH, int NKV, int hs,
                      cudaStream_t s, float *scratch = nullptr, size_t scratch_floats = 0) {
    float scale = 1.0f / sqrtf((float)hs);
    size_t qitems = (size_t)B * NH * ((T_ + CU_ATT_BQ - 1) / CU_ATT_BQ);
    size_t kitems = (size_t)B * NKV * ((T_ + CU_ATT_BK - 1) / CU_ATT_BK);
    size_t rows = (size_t)B * NH * T_;
    float *delta = scratch && scratch_floats >= rows ? scratch : nullptr;
    if (delta) ST_CUDA_LAUNCH(k_attn_delta<T>, st_cuda_grid(rows, 256), 256, 0, s, delta, dout, out, B, T_, NH, hs);
    ST_CUDA_LAUNCH(k_attn_backward_dq<T>, st_cuda_grid(qitems, 1), CU_ATT_THREADS, 0, s, dq, dout, q, k, v, out, lse,
                   doc_start, ld, B, T_, NH, NKV, hs, scale, (const float *)delta);
    ST_CUDA_LAUNCH(k_attn_backward_dkv<T>, st_cuda_grid(kitems, 1), CU_ATT_THREADS, 0, s, dk, dv, dout, q, k, v, out,
                   lse, doc_start, ld, B, T_, NH, NKV, hs, scale, (const float *)delta);
}

#endif

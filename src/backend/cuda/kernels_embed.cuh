/* kernels_embed.cuh - the CUDA backend's token (and GPT-2 position) embedding, forward and
 * backward, over fp32 or bf16 storage (T: tables, outputs, dout) with fp32 gradients
 * dwte, dwpe. Semantics are the CPU backend's encoder_* (wte[inp] + wpe[t]) and
 * embedding_* (wte[inp] only: wpe, dwpe NULL) of include/strata/backend.h.
 *
 * The backward is deterministic without atomics and gives the CPU's bits: the CPU adds
 * dout's rows into dwte in token order, one column per thread. Here a block takes a
 * token position; if its id occurred at an earlier position the block does nothing,
 * otherwise it owns that vocabulary row. It walks the later positions a block-width
 * chunk at a time: each thread tests one position's id, the block lists the matching
 * positions of the chunk in order in shared memory (a warp ballot and the warps' counts),
 * and each thread then adds, for its columns, the listed rows onto what dwte held. So
 * each dwte element is summed by one thread in the CPU's order, and the ids are read once
 * per block, not once per column: the work is O(N^2 / threads) integer compares for the
 * scans (N = B*T tokens) plus the O(N*C) additions, where it was distinct ids x C x N
 * compares before (issue 30). dwpe: one thread per (t, c) sums the B rows in order, as
 * the CPU does. */
#ifndef STRATA_KERNELS_EMBED_CUH
#define STRATA_KERNELS_EMBED_CUH

#include "backend/cuda/kernels_common.cuh"

/* out (B*T, C) = wte[inp] (+ wpe[t] when wpe) */
template <class T>
__global__ void k_embed_forward(T *out, const int32_t *inp, const T *wte, const T *wpe, int B, int T_, int C) {
    size_t n = (size_t)B * T_ * C;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t bt = e / C;
        int c = (int)(e % C);
        float v = cu_load(wte + (size_t)inp[bt] * C + c);
        if (wpe) v += cu_load(wpe + (bt % T_) * C + c);
        cu_store(out + e, v);
    }
}

/* dwte (V, C) += dout rows by token id, in position order; one block per first occurrence.
 * The block size is a multiple of 32, at most CU_EMB_MAXT. */
enum { CU_EMB_MAXT = 256 };
template <class T>
__global__ void k_embed_backward_wte(float *dwte, const T *dout, const int32_t *inp, int N, int C) {
    __shared__ float scratch[32];
    __shared__ int hits[CU_EMB_MAXT]; /* the positions of a chunk holding the id, in order */
    __shared__ int wcount[CU_EMB_MAXT / 32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int bt = blockIdx.x; bt < N; bt += gridDim.x) {
        int id = inp[bt];
        float seen = 0; /* earlier positions with this id (exact in fp32 below 2^24) */
        for (int j = threadIdx.x; j < bt; j += blockDim.x) seen += inp[j] == id;
        if (cu_block_sum(seen, scratch) != 0) continue; /* the same in every thread of the block */
        float *row = dwte + (size_t)id * C;
        for (int j0 = bt; j0 < N; j0 += blockDim.x) {
            int j = j0 + threadIdx.x, hit = j < N && inp[j] == id;
            unsigned m = __ballot_sync(0xffffffffu, hit);
            __syncthreads(); /* the previous chunk's readers are done with hits, wcount */
            if (lane == 0) wcount[warp] = __popc(m);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < nw; w++) before += w < warp ? wcount[w] : 0, total += wcount[w];
            if (hit) hits[before + __popc(m & ((1u << lane) - 1))] = j;
            __syncthreads();
            if (total == 0) continue; /* the same in every thread of the block */
            for (int c = threadIdx.x; c < C; c += blockDim.x) {
                float acc = row[c];
                for (int i = 0; i < total; i++) acc += cu_load(dout + (size_t)hits[i] * C + c);
                row[c] = acc;
            }
        }
    }
}

/* dwpe (>= T, C) += the sum over b of dout (b, t), b in order */
template <class T> __global__ void k_embed_backward_wpe(float *dwpe, const T *dout, int B, int T_, int C) {
    size_t n = (size_t)T_ * C;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[e];
        for (int b = 0; b < B; b++) acc += cu_load(dout + (size_t)b * n + e);
        dwpe[e] = acc;
    }
}

/* ---------------------------------------------------------------- launchers (host) */

/* wpe NULL: the Llama family's embedding_forward */
template <class T>
void cu_embed_forward(T *out, const int32_t *inp, const T *wte, const T *wpe, int B, int T_, int C, cudaStream_t s) {
    ST_CUDA_LAUNCH(k_embed_forward<T>, st_cuda_grid((size_t)B * T_ * C, 256), 256, 0, s, out, inp, wte, wpe, B, T_,
                   C);
}
/* dwpe NULL: embedding_backward */
template <class T>
void cu_embed_backward(float *dwte, float *dwpe, const T *dout, const int32_t *inp, int B, int T_, int C,
                       cudaStream_t s) {
    ST_CUDA_LAUNCH(k_embed_backward_wte<T>, st_cuda_grid((size_t)B * T_, 1), cu_row_block(C), 0, s, dwte, dout, inp,
                   B * T_, C);
    if (dwpe)
        ST_CUDA_LAUNCH(k_embed_backward_wpe<T>, st_cuda_grid((size_t)T_ * C, 256), 256, 0, s, dwpe, dout, B, T_, C);
}

#endif

/* test_cuda_emu.cpp - the emulation of the CUDA execution model (tests/cuda_emu/cuda_emu.h)
 * does what the kernels rely on: thread and block indices over 3-D grids and blocks,
 * __shared__ per block with __syncthreads, warp shuffles and votes (also in a short last
 * warp), the block reductions of kernels_common.cuh (sums, the max, a double sum), atomics,
 * and bf16 rounding equal to the CPU's st_f32_to_bf16. The kernels under test are written here, in CUDA. */
#include "backend/cuda/kernels_common.cuh"

extern "C" {
#include "strata/core.h"
#include "strata/tensor.h"
#include "testutil.h"
}

/* every thread writes its global linear id at that id */
__global__ void k_index(int *out) {
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned id = b * (blockDim.x * blockDim.y * blockDim.z) + t;
    out[id] = (int)id + 1;
}

/* each block reverses its 64 values through shared memory */
__global__ void k_reverse(int *out, const int *in) {
    __shared__ int s[64];
    int t = threadIdx.x, base = blockIdx.x * 64;
    s[t] = in[base + t];
    __syncthreads();
    out[base + t] = s[63 - t];
}

/* per lane: [xor-sum, down 1, up 2, broadcast of lane 5, ballot(odd), any(lane 7), all(lane < 32), all(lane < 31)] */
__global__ void k_warp(int *out) {
    int lane = threadIdx.x % 32, v = 100 * (int)(threadIdx.x / 32) + lane;
    int sum = v;
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    int *o = out + threadIdx.x * 8;
    o[0] = sum;
    o[1] = __shfl_down_sync(0xffffffffu, v, 1);
    o[2] = __shfl_up_sync(0xffffffffu, v, 2);
    o[3] = __shfl_sync(0xffffffffu, v, 5);
    o[4] = (int)__ballot_sync(0xffffffffu, lane & 1);
    o[5] = __any_sync(0xffffffffu, lane == 7);
    o[6] = __all_sync(0xffffffffu, lane < 32);
    o[7] = __all_sync(0xffffffffu, lane < 31);
}

/* a block of 48: the second warp has 16 lanes */
__global__ void k_short_warp(unsigned *out) { out[threadIdx.x] = __ballot_sync(0xffffffffu, 1); }

/* out[block] = the block sum of (thread + 1), and how many threads saw that same sum */
__global__ void k_block_sum(float *out, int *agree) {
    __shared__ float scratch[32];
    float v = cu_block_sum((float)(threadIdx.x + 1), scratch);
    float a = (float)threadIdx.x, b = 1.0f;
    __shared__ float scratch2[64];
    cu_block_sum2(a, b, scratch2);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
    __syncthreads();
    float n = (float)blockDim.x;
    if (v == out[blockIdx.x] && a == n * (n - 1) / 2 && b == n) atomicAdd(agree, 1);
}

/* cu_block_reduce's other uses: out[block] = the max of -(thread + 1) - 0.5 (all negative,
 * so a lane past the last warp must bring -inf, not 0) and the double sum of 2^-40 (thread
 * + 1) (exact in double, not in float); agree: threads that saw both */
__global__ void k_block_reduce(float *mx, double *sum, int *agree) {
    __shared__ float fs[32];
    __shared__ double ds[32];
    float m = cu_block_reduce<float, CuMax>(-(float)(threadIdx.x + 1) - 0.5f, fs);
    double d = cu_block_reduce<double, CuSum>(0x1p-40 * (threadIdx.x + 1) + 1.0, ds);
    if (threadIdx.x == 0) mx[blockIdx.x] = m, sum[blockIdx.x] = d;
    __syncthreads();
    if (m == mx[blockIdx.x] && d == sum[blockIdx.x]) atomicAdd(agree, 1);
}

__global__ void k_atomics(int *count, float *fsum, int *mx) {
    atomicAdd(count, 1);
    atomicAdd(fsum, 0.5f);
    atomicMax(mx, (int)(blockIdx.x * blockDim.x + threadIdx.x));
}

int main(void) {
    /* indices */
    {
        dim3 grid(3, 2, 2), block(4, 3, 2);
        int n = 12 * 24;
        std::vector<int> out(n, 0);
        ST_CUDA_LAUNCH(k_index, grid, block, 0, nullptr, out.data());
        int bad = 0;
        for (int i = 0; i < n; i++) bad += out[i] != i + 1;
        CHECK(bad == 0, "%d of %d threads missing or misplaced in a (3,2,2) x (4,3,2) launch", bad, n);
    }
    /* shared memory and __syncthreads, block after block */
    {
        std::vector<int> in(3 * 64), out(3 * 64, -1);
        for (int i = 0; i < 3 * 64; i++) in[i] = i * 7;
        ST_CUDA_LAUNCH(k_reverse, 3, 64, 0, nullptr, out.data(), in.data());
        int bad = 0;
        for (int b = 0; b < 3; b++)
            for (int t = 0; t < 64; t++) bad += out[b * 64 + t] != in[b * 64 + 63 - t];
        CHECK(bad == 0, "shared-memory reversal: %d of 192 wrong", bad);
    }
    /* shuffles and votes over two warps */
    {
        std::vector<int> out(64 * 8, -1);
        ST_CUDA_LAUNCH(k_warp, 1, 64, 0, nullptr, out.data());
        int bad = 0;
        for (int t = 0; t < 64; t++) {
            int w = t / 32, lane = t % 32, v = 100 * w + lane, *o = &out[t * 8];
            int want[8] = {100 * w * 32 + 31 * 32 / 2, lane < 31 ? v + 1 : v, lane >= 2 ? v - 2 : v, 100 * w + 5,
                           (int)0xaaaaaaaau, 1, 1, 0};
            for (int k = 0; k < 8; k++)
                if (o[k] != want[k]) {
                    if (bad++ < 5) fprintf(stderr, "thread %d op %d: %d, want %d\n", t, k, o[k], want[k]);
                }
        }
        CHECK(bad == 0, "warp shuffles and votes: %d wrong", bad);
        std::vector<unsigned> b(48, 0);
        ST_CUDA_LAUNCH(k_short_warp, 1, 48, 0, nullptr, b.data());
        CHECK(b[0] == 0xffffffffu && b[47] == 0xffffu, "ballot: full warp %#x, short warp of 16 %#x", b[0], b[47]);
    }
    /* the block reductions the kernels use, at 32, 96 and 256 threads */
    for (int nt : {32, 96, 256}) {
        std::vector<float> out(3, 0);
        int agree = 0;
        ST_CUDA_LAUNCH(k_block_sum, 3, nt, 0, nullptr, out.data(), &agree);
        float want = (float)nt * (nt + 1) / 2;
        CHECK(out[0] == want && out[2] == want && agree == 3 * nt, "block sum over %d threads: %g (want %g), %d agree",
              nt, out[0], want, agree);
    }
    for (int nt : {32, 96, 256}) {
        std::vector<float> mx(3, 0);
        std::vector<double> sum(3, 0);
        int agree = 0;
        ST_CUDA_LAUNCH(k_block_reduce, 3, nt, 0, nullptr, mx.data(), sum.data(), &agree);
        double want = nt + 0x1p-40 * nt * (nt + 1) / 2;
        CHECK(mx[0] == -1.5f && mx[2] == -1.5f && sum[0] == want && sum[2] == want && agree == 3 * nt,
              "block max and double sum over %d threads: %g (want -1.5), %.17g (want %.17g), %d agree", nt, mx[0],
              sum[0], want, agree);
    }
    /* atomics */
    {
        int count = 0, mx = -1;
        float fsum = 0;
        ST_CUDA_LAUNCH(k_atomics, 4, 128, 0, nullptr, &count, &fsum, &mx);
        CHECK(count == 512 && fsum == 256.0f && mx == 511, "atomics: count %d, float sum %g, max %d", count, fsum, mx);
    }
    /* bf16 rounding: the CPU's bits on random patterns, ties, infinities; NaN stays NaN */
    {
        st_rng rng;
        st_rng_seed(&rng, 29);
        int bad = 0;
        uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                               0x00000001u, 0x80000000u, 0x007fffffu};
        for (int i = 0; i < 100000 + 9; i++) {
            uint32_t u = i < 9 ? specials[i] : (uint32_t)st_rng_u64(&rng);
            float f;
            memcpy(&f, &u, 4);
            if (f != f) continue;
            __nv_bfloat16 h = __float2bfloat16_rn(f);
            bad += h.__x != st_f32_to_bf16(f) || __bfloat162float(h) != st_bf16_to_f32(st_f32_to_bf16(f));
        }
        float nan = NAN;
        __nv_bfloat16 hn = __float2bfloat16_rn(nan);
        CHECK(bad == 0, "bf16 rounding differs from st_f32_to_bf16 on %d values", bad);
        CHECK(__bfloat162float(hn) != __bfloat162float(hn), "NaN rounded to bf16 is not NaN (%#x)", hn.__x);
    }
    return test_finish("test_cuda_emu");
}

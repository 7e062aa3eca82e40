/* test_cuda_emu_sdpa_copy.cpp - the copies around cuDNN's fused attention
 * (src/backend/cuda/kernels_sdpa_copy.cuh) under the CUDA emulation, against host loops:
 * GQA's q, k and v inside rows of (NH + 2 NKV) hs floats (an offset and a stride) packed
 * into token-major bf16, each value rounded once; out unpacked into rows of NH hs (written:
 * NaN before), the gradients unpacked into the packed rows (added: random before, the
 * columns outside the head block kept). More elements than the capped emulated grid. */
#include "backend/cuda/kernels_sdpa_copy.cuh"
#include "emu_diff.h"

static void test_copies(int B, int T, int NH, int NKV, int hs) {
    int ld = (NH + 2 * NKV) * hs, C = NH * hs;
    size_t rows = (size_t)B * T;
    char tag[128], what[200];
    snprintf(tag, sizeof tag, "B=%d T=%d NH=%d NKV=%d hs=%d", B, T, NH, NKV, hs);
    vecf qkv = randn(rows * ld, 1);
    for (int part = 0; part < 3; part++) { /* q, k, v */
        int H = part ? NKV : NH, off = part == 0 ? 0 : part == 1 ? C : C + NKV * hs;
        std::vector<__nv_bfloat16> packed(rows * H * hs);
        cu_sdpa_pack(packed.data(), qkv.data() + off, rows, H, hs, ld, nullptr);
        vecf got = load(packed), want(packed.size());
        for (size_t r = 0; r < rows; r++)
            for (int e = 0; e < H * hs; e++) want[r * H * hs + e] = qkv[r * ld + off + e];
        snprintf(what, sizeof what, "%s pack part %d (bf16 rounded once)", tag, part);
        same_bits(what, got, want, 1);
        /* back, added into the packed rows: the part's columns gain the bf16 values, others keep theirs */
        vecf rowsv = randn(rows * ld, 1), ref = rowsv;
        cu_sdpa_unpack(rowsv.data() + off, packed.data(), rows, H, hs, ld, 1, nullptr);
        for (size_t r = 0; r < rows; r++)
            for (int e = 0; e < H * hs; e++) ref[r * ld + off + e] += got[r * H * hs + e];
        snprintf(what, sizeof what, "%s unpack part %d (+=, other columns kept)", tag, part);
        same_bits(what, rowsv, ref, 0);
    }
    /* out: written into rows of C */
    std::vector<__nv_bfloat16> po = store<__nv_bfloat16>(randn(rows * C, 1));
    vecf out(rows * C, NAN);
    cu_sdpa_unpack(out.data(), po.data(), rows, NH, hs, C, 0, nullptr);
    snprintf(what, sizeof what, "%s unpack out (=)", tag);
    same_bits(what, out, load(po), 0);
}

int main(void) {
    emu_setup(31);
    test_copies(1, 3, 2, 1, 8);
    test_copies(2, 7, 4, 2, 16);
    test_copies(1, 33, 8, 2, 32); /* 8448 q elements: more than 4 blocks of 256 */
    return test_finish("test_cuda_emu_sdpa_copy");
}

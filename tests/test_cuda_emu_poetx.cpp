/* test_cuda_emu_poetx.cpp - the CUDA backend's POET-X kernels (src/backend/cuda/
 * kernels_poetx.cuh) under the CUDA emulation against the CPU backend's poet_* ops (issue
 * 30: the CUDA vtable had them NULL). The polynomial and its gradient at block sizes 2 to
 * 40 and 0 to 5 Neumann terms, with the scratch holding every block, or one block at a
 * time (batches), or less than one (refused, nothing written); the apply forward and
 * backward with and without a permutation, both directions (trans), out of place and in
 * place (y = x, dx = dy), dx or dG NULL, more units than the capped emulated grid; the columns'
 * permutation (gather, scatter, scatter-add) with row strides wider than the width, exact.
 * Outputs an op writes start as NaN, outputs it adds into start random. Tolerances: both
 * sides sum in fp32 in different orders (sgemm there, loops here). */
#include "backend/cuda/kernels_poetx.cuh"
#include "emu_diff.h"

#define TOL_ATOL 2e-6
#define TOL_RTOL 2e-5

static vecf nans(size_t n) { return vecf(n, NAN); }

static void test_cayley(int nb, int b, int k, int batch_blocks) {
    size_t bb = (size_t)b * b, nq = (size_t)b * (b - 1) / 2;
    char tag[128], what[200];
    snprintf(tag, sizeof tag, "cayley nb=%d b=%d k=%d scratch=%d blocks", nb, b, k, batch_blocks);
    vecf q = randn((size_t)nb * nq, 0.3f / b), dG = randn((size_t)nb * bb, 1), dq0 = randn((size_t)nb * nq, 1);
    vecf scratch((size_t)(batch_blocks > 0 ? batch_blocks : 1) * (k + 4) * bb);
    size_t sf = batch_blocks > 0 ? scratch.size() : (size_t)(k + 4) * bb - 1; /* under one block's backward */
    vecf G = nans((size_t)nb * bb), Gr = nans((size_t)nb * bb);
    size_t sfwd = batch_blocks > 0 ? (size_t)batch_blocks * bb : bb - 1;
    int ok = cu_poet_cayley_forward(G.data(), q.data(), nb, b, k, scratch.data(), sfwd, nullptr);
    if (batch_blocks <= 0) {
        int okb = cu_poet_cayley_backward(dq0.data(), dG.data(), q.data(), nb, b, k, scratch.data(), sf, nullptr);
        CHECK(!ok && !okb && std::isnan(G[0]), "%s: scratch under one block's is refused with nothing written "
              "(forward %d, backward %d)", tag, ok, okb);
        return;
    }
    CHECK(ok, "%s: forward refused", tag);
    cpu->ops->poet_cayley_forward(cpu, Gr.data(), q.data(), nb, b, k);
    snprintf(what, sizeof what, "%s G", tag);
    compare(what, G, Gr, TOL_ATOL, TOL_RTOL);
    vecf dq = dq0, dqr = dq0;
    ok = cu_poet_cayley_backward(dq.data(), dG.data(), q.data(), nb, b, k, scratch.data(), sf, nullptr);
    CHECK(ok, "%s: backward refused", tag);
    cpu->ops->poet_cayley_backward(cpu, dqr.data(), dG.data(), q.data(), nb, b, k);
    snprintf(what, sizeof what, "%s dq (+=)", tag);
    compare(what, dq, dqr, TOL_ATOL, TOL_RTOL);
}

static void test_apply(int N, int d, int b, int permuted, int trans, int inplace) {
    int nb = d / b;
    size_t bb = (size_t)b * b, n = (size_t)N * d;
    char tag[160], what[220];
    snprintf(tag, sizeof tag, "apply N=%d d=%d b=%d perm=%d trans=%d inplace=%d", N, d, b, permuted, trans, inplace);
    int32_t *perm = permuted ? test_random_perm(&emu_rng, d) : nullptr;
    vecf x = randn(n, 1), G = randn((size_t)nb * bb, 0.5f), dy = randn(n, 1);
    /* forward */
    vecf y = inplace ? x : nans(n), yr = nans(n);
    cu_poet_apply_forward(y.data(), inplace ? y.data() : x.data(), G.data(), perm, N, d, b, trans, nullptr);
    cpu->ops->poet_apply_forward(cpu, yr.data(), x.data(), G.data(), perm, N, d, b, trans);
    snprintf(what, sizeof what, "%s y", tag);
    compare(what, y, yr, TOL_ATOL, TOL_RTOL);
    /* backward: both gradients, then each alone */
    for (int which = 0; which < 3; which++) {
        int want_dx = which != 2, want_dG = which != 1;
        vecf dx0 = randn(n, 1), dG0 = randn((size_t)nb * bb, 1);
        /* in place: dx is dy, one buffer holding dy (so the reference's dx starts from dy) */
        vecf dx = inplace ? dy : dx0, dxr = dx, dGk = dG0, dGr = dG0;
        cu_poet_apply_backward(want_dx ? dx.data() : nullptr, want_dG ? dGk.data() : nullptr,
                               inplace ? dx.data() : dy.data(), x.data(), G.data(), perm, N, d, b, trans, nullptr);
        cpu->ops->poet_apply_backward(cpu, want_dx ? dxr.data() : nullptr, want_dG ? dGr.data() : nullptr, dy.data(),
                                      x.data(), G.data(), perm, N, d, b, trans);
        if (want_dx) {
            snprintf(what, sizeof what, "%s dx (+=)%s", tag, want_dG ? "" : " dG NULL");
            compare(what, dx, dxr, TOL_ATOL, TOL_RTOL);
        }
        if (want_dG) {
            snprintf(what, sizeof what, "%s dG (+=)%s", tag, want_dx ? "" : " dx NULL");
            compare(what, dGk, dGr, TOL_ATOL, TOL_RTOL);
        }
    }
    free(perm);
}

/* poet_permute: y's untouched columns (ldy > d) stay as they were; exact (copies, one add each) */
static void test_permute(int N, int d, int ldx, int ldy, int mode) {
    char tag[128];
    snprintf(tag, sizeof tag, "permute N=%d d=%d ldx=%d ldy=%d mode=%d", N, d, ldx, ldy, mode);
    int32_t *perm = test_random_perm(&emu_rng, d);
    vecf x = randn((size_t)N * ldx, 1), y = randn((size_t)N * ldy, 1), yr = y;
    cu_poet_permute(y.data(), ldy, x.data(), ldx, perm, N, d, mode, nullptr);
    cpu->ops->poet_permute(cpu, yr.data(), ldy, x.data(), ldx, perm, N, d, mode);
    compare(tag, y, yr, 0, 0);
    free(perm);
}

int main(void) {
    emu_setup(30);
    for (int mode = 0; mode < 3; mode++) {
        test_permute(3, 8, 8, 8, mode);
        test_permute(9, 48, 64, 80, mode); /* strided both sides; more elements than the capped grid */
    }
    test_cayley(3, 2, 0, 3);
    test_cayley(4, 5, 1, 4);
    test_cayley(3, 8, 2, 1);  /* one block per batch */
    test_cayley(5, 16, 3, 2); /* batches of 2, the last of 1 */
    test_cayley(2, 40, 5, 2);
    test_cayley(2, 8, 2, 0); /* scratch too small: refused */
    for (int trans = 0; trans < 2; trans++)
        for (int permuted = 0; permuted < 2; permuted++) {
            test_apply(3, 8, 2, permuted, trans, 0);
            test_apply(5, 48, 16, permuted, trans, 0);
            test_apply(7, 80, 40, permuted, trans, 1);
            test_apply(9, 64, 8, permuted, trans, 1); /* 72 units: more than the capped grid's 4 blocks */
        }
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_poetx");
}

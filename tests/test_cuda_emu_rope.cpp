/* test_cuda_emu_rope.cpp - the CUDA rotary embedding (src/backend/cuda/kernels_rope.cuh),
 * forward and backward in place, fp32 and bf16 storage, run under the CUDA emulation
 * against the CPU backend (the checks are described in cuda_emu/emu_diff.h; the tolerance
 * is tests/test_ops_llama_diff.c's for rope). Tables from st_llama_rope_tables with the
 * Llama-3 scaling of the "llama-tiny" preset (theta 500000, factor 32). Shapes: head
 * sizes 2, 16, 64, heads inside a wider packed row (an offset into the row, ld > H*hs:
 * the elements outside the heads must keep their bits), more pairs than the 4 x 256
 * threads of the capped emulated grid, and packed documents as llama_arch.c passes them
 * (tables gathered at each token's position, B = 1, T = all tokens). */
#include "backend/cuda/kernels_rope.cuh"
#include "emu_diff.h"

extern "C" {
#include "strata/llama.h"
}

#define TOL_EW_ATOL 1e-6
#define TOL_EW_RTOL 1e-5

typedef __nv_bfloat16 bf16;

struct RopeCase {
    int B, T, H, hs, ld, c0; /* heads start c0 floats into each row of ld */
    int docs;                /* 1: gathered tables at per-document positions, launched as B = 1 */
};

struct Tables {
    vecf cos, sin;
    int rows;
};

/* the tables for c's head size, rows at 0..B*T-1, or gathered at document positions */
static Tables tables(const RopeCase &c) {
    st_llama_config cfg;
    st_err err = {};
    CHECK(st_llama_config_preset("llama-tiny", &cfg, &err) == ST_OK, "preset: %s", err.msg);
    CHECK(cfg.rope_llama3, "llama-tiny should carry Llama-3 rope scaling");
    cfg.head_dim = c.hs;
    int half = c.hs / 2, N = c.B * c.T;
    vecf cs((size_t)N * half), sn((size_t)N * half);
    st_llama_rope_tables(&cfg, N, cs.data(), sn.data());
    if (!c.docs) return {cs, sn, c.T};
    /* documents of 5, 1, 9, ... tokens: position restarts at each document start */
    vecf gc((size_t)N * half), gs((size_t)N * half);
    int lens[] = {5, 1, 9, 3, 12}, d = 0, pos = 0;
    for (int n = 0; n < N; n++) {
        if (pos == lens[d % 5]) pos = 0, d++;
        memcpy(&gc[(size_t)n * half], &cs[(size_t)pos * half], half * sizeof(float));
        memcpy(&gs[(size_t)n * half], &sn[(size_t)pos * half], half * sizeof(float));
        pos++;
    }
    return {gc, gs, N};
}

/* the launch shape: packed documents are one row of all tokens */
static void launch_shape(const RopeCase &c, int *B, int *T) {
    *B = c.docs ? 1 : c.B;
    *T = c.docs ? c.B * c.T : c.T;
}

template <class T> static void rope_cuda(const RopeCase &c, const Tables &t, const vecf &x, const vecf &dx,
                                         vecf *fw, vecf *bw) {
    auto xs = store<T>(x), ds = store<T>(dx);
    int B, Tn;
    launch_shape(c, &B, &Tn);
    cu_rope_forward<T>(xs.data() + c.c0, t.cos.data(), t.sin.data(), B, Tn, c.H, c.hs, c.ld, nullptr);
    cu_rope_backward<T>(ds.data() + c.c0, t.cos.data(), t.sin.data(), B, Tn, c.H, c.hs, c.ld, nullptr);
    *fw = load(xs), *bw = load(ds);
}

static void rope_cpu(const RopeCase &c, const Tables &t, const vecf &x, const vecf &dx, vecf *fw, vecf *bw) {
    *fw = x, *bw = dx;
    int B, Tn;
    launch_shape(c, &B, &Tn);
    cpu->ops->rope_forward(cpu, fw->data() + c.c0, t.cos.data(), t.sin.data(), B, Tn, c.H, c.hs, c.ld);
    cpu->ops->rope_backward(cpu, bw->data() + c.c0, t.cos.data(), t.sin.data(), B, Tn, c.H, c.hs, c.ld);
}

/* the elements of (B*T, ld) rows inside the heads (gap 0) or outside them (gap 1) */
static vecf pick(const vecf &v, const RopeCase &c, int gap) {
    vecf r;
    for (int n = 0; n < c.B * c.T; n++)
        for (int i = 0; i < c.ld; i++)
            if ((i >= c.c0 && i < c.c0 + c.H * c.hs) != gap) r.push_back(v[(size_t)n * c.ld + i]);
    return r;
}

static void test_rope(const RopeCase &c) {
    size_t n = (size_t)c.B * c.T * c.ld;
    Tables t = tables(c);
    vecf x = randn(n, 1), dx = randn(n, 1), fw, bw, rfw, rbw;
    char tag[160], what[200];
    snprintf(tag, sizeof tag, "rope B=%d T=%d H=%d hs=%d ld=%d c0=%d%s", c.B, c.T, c.H, c.hs, c.ld, c.c0,
             c.docs ? " documents" : "");

    rope_cuda<float>(c, t, x, dx, &fw, &bw);
    rope_cpu(c, t, x, dx, &rfw, &rbw);
    snprintf(what, sizeof what, "%s fp32 forward", tag);
    compare(what, pick(fw, c, 0), pick(rfw, c, 0), TOL_EW_ATOL, TOL_EW_RTOL);
    snprintf(what, sizeof what, "%s fp32 backward", tag);
    compare(what, pick(bw, c, 0), pick(rbw, c, 0), TOL_EW_ATOL, TOL_EW_RTOL);
    snprintf(what, sizeof what, "%s: outside the heads (forward, backward)", tag);
    same_bits(what, pick(fw, c, 1), pick(x, c, 1), 0), same_bits(what, pick(bw, c, 1), pick(dx, c, 1), 0);

    vecf rx = round_bf16(x), rdx = round_bf16(dx), f32, b32, f16, b16;
    rope_cuda<float>(c, t, rx, rdx, &f32, &b32);
    rope_cuda<bf16>(c, t, rx, rdx, &f16, &b16);
    rope_cpu(c, t, rx, rdx, &rfw, &rbw);
    snprintf(what, sizeof what, "%s bf16 forward", tag);
    compare(what, pick(f16, c, 0), pick(rfw, c, 0), TOL_EW_ATOL, TOL_EW_RTOL + BF16_RTOL);
    same_bits(what, pick(f16, c, 0), pick(f32, c, 0), 1);
    snprintf(what, sizeof what, "%s bf16 backward", tag);
    compare(what, pick(b16, c, 0), pick(rbw, c, 0), TOL_EW_ATOL, TOL_EW_RTOL + BF16_RTOL);
    same_bits(what, pick(b16, c, 0), pick(b32, c, 0), 1);
    snprintf(what, sizeof what, "%s bf16: outside the heads", tag);
    same_bits(what, pick(f16, c, 1), pick(rx, c, 1), 0), same_bits(what, pick(b16, c, 1), pick(rdx, c, 1), 0);
}

int main(void) {
    emu_setup(15);
    RopeCase cases[] = {
        {1, 3, 1, 2, 2, 0, 0},         /* one pair per head */
        {2, 7, 3, 16, 48, 0, 0},       /* q heads filling the row */
        {2, 5, 2, 16, 80, 48, 0},      /* k heads inside a packed [q | k | v] row */
        {2, 33, 2, 64, 160, 16, 0},    /* 4224 pairs: the capped grid loops */
        {3, 10, 2, 16, 40, 4, 1},      /* packed documents: gathered tables */
    };
    for (auto &c : cases) test_rope(c);
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_rope");
}

/* test_cuda_backend.cpp - the CUDA backend (src/backend/cuda/backend_cuda.cu) through the
 * st_backend_ops vtable against the CPU backend, on a GPU: the arena (allocations are
 * zeroed, one past the budget fails), and every op it implements at one shape each,
 * forward and backward, fp32, with tests/test_ops_diff.c's tolerances. Exits 77 where
 * there is no CUDA device (the kernels themselves are checked without one by
 * test_cuda_emu_*). Not yet run on a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "backend/cuda/backend_cuda.h"
#include "strata/backend.h"
#include "strata/core.h"
#include "testutil.h"
}

typedef std::vector<float> vecf;
static st_rng rng;
static st_backend *gpu, *cpu;

static vecf randn(size_t n, float scale, float offset = 0) {
    vecf v(n);
    for (auto &x : v) x = offset + scale * st_rng_normal(&rng);
    return v;
}

/* A device copy of v (freed by down). */
static float *up(const vecf &v) {
    float *d = (float *)gpu->ops->alloc(gpu, v.size() * sizeof(float));
    if (!d) {
        fprintf(stderr, "test_cuda_backend: arena full\n");
        exit(1);
    }
    gpu->ops->copy_to_device(gpu, d, v.data(), v.size() * sizeof(float));
    return d;
}
static vecf down(float *d, size_t n) {
    vecf v(n);
    gpu->ops->synchronize(gpu);
    gpu->ops->copy_to_host(gpu, v.data(), d, n * sizeof(float));
    gpu->ops->dealloc(gpu, d);
    return v;
}
static void compare(const char *what, const vecf &a, const vecf &ref, double atol, double rtol) {
    double m = 0;
    for (float r : ref) m = fmax(m, fabs((double)r));
    check_close_f32(what, a.data(), ref.data(), a.size(), atol * (m > 0 ? m : 1), rtol);
}

static void test_layernorm(int N, int C) {
    size_t n = (size_t)N * C;
    vecf x = randn(n, 1.5f, 0.3f), w = randn(C, 0.2f, 1), b = randn(C, 0.2f), dout = randn(n, 1);
    vecf out(n, NAN), mean(N, NAN), rstd(N, NAN), dx = randn(n, 1), dw = randn(C, 1), db = randn(C, 1);
    float *d_x = up(x), *d_w = up(w), *d_b = up(b), *d_dout = up(dout), *d_out = up(out), *d_mean = up(mean);
    float *d_rstd = up(rstd), *d_dx = up(dx), *d_dw = up(dw), *d_db = up(db);
    gpu->ops->layernorm_forward(gpu, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    gpu->ops->layernorm_backward(gpu, d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, N, C);
    cpu->ops->layernorm_forward(cpu, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    cpu->ops->layernorm_backward(cpu, dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                 rstd.data(), N, C);
    compare("layernorm out", down(d_out, n), out, 1e-5, 1e-4);
    compare("layernorm mean", down(d_mean, N), mean, 1e-5, 1e-4);
    compare("layernorm rstd", down(d_rstd, N), rstd, 1e-5, 1e-4);
    compare("layernorm dinp", down(d_dx, n), dx, 1e-5, 1e-4);
    compare("layernorm dw", down(d_dw, C), dw, 1e-5, 1e-4);
    compare("layernorm db", down(d_db, C), db, 1e-5, 1e-4);
    for (float *p : {d_x, d_w, d_b, d_dout}) gpu->ops->dealloc(gpu, p);
}

static void test_rmsnorm(int N, int H, int hs, int ld) {
    size_t n = (size_t)N * ld;
    vecf x = randn(n, 1.5f, 0.3f), w = randn(hs, 0.2f, 1), dout = randn(n, 1);
    vecf out = randn(n, 1), rstd((size_t)N * H, NAN), dx = randn(n, 1), dw = randn(hs, 1);
    float *d_x = up(x), *d_w = up(w), *d_dout = up(dout), *d_out = up(out), *d_rstd = up(rstd), *d_dx = up(dx);
    float *d_dw = up(dw);
    gpu->ops->rmsnorm_forward(gpu, d_out, d_rstd, d_x, d_w, N, H, hs, ld, 1e-6f);
    gpu->ops->rmsnorm_backward(gpu, d_dx, d_dw, d_dout, d_x, d_w, d_rstd, N, H, hs, ld);
    cpu->ops->rmsnorm_forward(cpu, out.data(), rstd.data(), x.data(), w.data(), N, H, hs, ld, 1e-6f);
    cpu->ops->rmsnorm_backward(cpu, dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, H, hs, ld);
    compare("rmsnorm out (elements outside the groups kept)", down(d_out, n), out, 1e-5, 1e-4);
    compare("rmsnorm rstd", down(d_rstd, (size_t)N * H), rstd, 1e-5, 1e-4);
    compare("rmsnorm dinp", down(d_dx, n), dx, 1e-5, 1e-4);
    compare("rmsnorm dw", down(d_dw, hs), dw, 1e-5, 1e-4);
    for (float *p : {d_x, d_w, d_dout}) gpu->ops->dealloc(gpu, p);
}

static void test_eltwise(int N, int F) {
    size_t n = (size_t)N * F;
    vecf a = randn(n, 2.5f), b = randn(2 * n, 2), dout = randn(n, 1), da = randn(n, 1), db = randn(2 * n, 1);
    vecf out(n, NAN), sw(n, NAN);
    float *d_a = up(a), *d_b = up(b), *d_dout = up(dout), *d_da = up(da), *d_db = up(db), *d_out = up(out);
    float *d_sw = up(sw);
    gpu->ops->gelu_forward(gpu, d_out, d_a, (int)n);
    gpu->ops->gelu_backward(gpu, d_da, d_a, d_dout, (int)n);
    gpu->ops->swiglu_forward(gpu, d_sw, d_b, N, F);
    gpu->ops->swiglu_backward(gpu, d_db, d_b, d_dout, N, F);
    cpu->ops->gelu_forward(cpu, out.data(), a.data(), (int)n);
    cpu->ops->gelu_backward(cpu, da.data(), a.data(), dout.data(), (int)n);
    cpu->ops->swiglu_forward(cpu, sw.data(), b.data(), N, F);
    cpu->ops->swiglu_backward(cpu, db.data(), b.data(), dout.data(), N, F);
    compare("gelu out", down(d_out, n), out, 1e-6, 1e-5);
    compare("gelu dinp", down(d_da, n), da, 1e-5, 1e-5);
    compare("swiglu out", down(d_sw, n), sw, 1e-6, 1e-5);
    compare("swiglu dinp", down(d_db, 2 * n), db, 1e-5, 1e-5);
    /* residual: out = a + b[:n]; da, db[:n] += dout */
    vecf r(n, NAN), ra = randn(n, 1), rb = randn(n, 1);
    float *d_r = up(r), *d_ra = up(ra), *d_rb = up(rb);
    gpu->ops->residual_forward(gpu, d_r, d_a, d_dout, (int)n);
    gpu->ops->residual_backward(gpu, d_ra, d_rb, d_dout, (int)n);
    cpu->ops->residual_forward(cpu, r.data(), a.data(), dout.data(), (int)n);
    cpu->ops->residual_backward(cpu, ra.data(), rb.data(), dout.data(), (int)n);
    compare("residual out", down(d_r, n), r, 1e-6, 1e-5);
    compare("residual da", down(d_ra, n), ra, 1e-6, 1e-5);
    compare("residual db", down(d_rb, n), rb, 1e-6, 1e-5);
    /* to_bf16: the CPU's bits */
    std::vector<uint16_t> h(n), want(n);
    uint16_t *d_h = (uint16_t *)gpu->ops->alloc(gpu, n * 2);
    gpu->ops->to_bf16(gpu, d_h, d_a, n);
    gpu->ops->synchronize(gpu);
    gpu->ops->copy_to_host(gpu, h.data(), d_h, n * 2);
    cpu->ops->to_bf16(cpu, want.data(), a.data(), n);
    CHECK(memcmp(h.data(), want.data(), n * 2) == 0, "to_bf16: bits differ from the CPU backend's");
    for (void *p : {(void *)d_a, (void *)d_b, (void *)d_dout, (void *)d_h}) gpu->ops->dealloc(gpu, p);
}

int main(void) {
    st_err err = {};
    size_t budget = (size_t)64 << 20;
    st_status s = st_backend_cuda_create(&gpu, 0, budget, &err);
    if (s == ST_ERR_UNSUPPORTED) {
        printf("test_cuda_backend: %s: skipped (needs a CUDA device)\n", err.msg);
        return 77;
    }
    CHECK(s == ST_OK, "st_backend_cuda_create: %s", err.msg);
    if (s != ST_OK) return test_finish("test_cuda_backend");
    if (st_backend_cpu_create(&cpu, 1, &err) != ST_OK) return 1;
    st_rng_seed(&rng, 15);
    /* the arena: zeroed blocks, nothing past the budget */
    float *z = (float *)gpu->ops->alloc(gpu, 4096 * sizeof(float));
    vecf zh = down(z, 4096);
    size_t nz = 0;
    for (float v : zh) nz += v != 0;
    CHECK(nz == 0, "alloc is not zeroed: %zu of 4096 nonzero", nz);
    void *all = gpu->ops->alloc(gpu, budget), *more = gpu->ops->alloc(gpu, 1);
    CHECK(all && !more, "the whole budget fits once, and then nothing more (%p, %p)", all, more);
    gpu->ops->dealloc(gpu, all);
    test_layernorm(5, 768);
    test_layernorm(67, 257);
    test_rmsnorm(3, 4, 128, 640);
    test_rmsnorm(33, 1, 4096, 4096);
    test_eltwise(3, 2309);
    s = st_backend_cuda_status(gpu, &err);
    CHECK(s == ST_OK, "the backend kept an error: %s", err.msg);
    st_backend_free(gpu);
    st_backend_free(cpu);
    return test_finish("test_cuda_backend");
}

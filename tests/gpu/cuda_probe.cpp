/* cuda_probe.cpp - the shape probe of tests/gpu/run.sh's stage 3 (issue 30): the CUDA
 * backend's ops at the shapes of a 7B-class Llama (C 4096, 32 heads, 8 KV heads, head 128,
 * T 4096, FFN 14336, vocabulary 128256 whole and in chunks), each timed on the device with
 * the backend's own timing marks (timer_mark / timer_seconds: CUDA events), a few
 * spot-checked against the CPU backend; the matmuls in fp32, tf32 and bf16 (GPT-2's
 * 512 x 768 x 50257 head among them, and 8192^3 as the card's ceiling) with TFLOPS and how
 * far bf16 lies from fp32; the copy bandwidth, pinned and pageable, both directions; and
 * cuDNN's fused attention (issue 30) timed at the same shapes and checked against the own
 * kernels, forward and backward (a fallback to the own kernels counts as a failure).
 *
 *   cuda_probe [--json FILE] [--quick]
 *
 * Prints a line per measurement and one JSON object (to FILE, else stdout); the last line
 * sums it up. Exit 0; 1 when a spot check fails or the backend kept an error; 77 without
 * a CUDA device. --quick: smaller shapes (a check of the probe itself). Not a test: built
 * beside the CUDA tests and carried in the bundle (tools/gpu_bundle.sh). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

extern "C" {
#include "backend/cuda/backend_cuda.h"
#include "strata/backend.h"
#include "strata/core.h"
}

static st_backend *gpu, *cpu;
static std::string js = "{\"strata_cuda_probe\":1";
static int failures = 0, timed = 0;
static st_rng rng;

static float *dev_random(size_t n, float scale) {
    std::vector<float> h(n);
    for (auto &x : h) x = scale * st_rng_normal(&rng);
    float *d = (float *)gpu->ops->alloc(gpu, n * 4);
    if (!d) {
        fprintf(stderr, "probe: the device budget is too small for %zu floats\n", n);
        exit(1);
    }
    gpu->ops->copy_to_device(gpu, d, h.data(), n * 4);
    return d;
}
static std::vector<float> down(const float *d, size_t n) {
    std::vector<float> h(n);
    gpu->ops->synchronize(gpu);
    gpu->ops->copy_to_host(gpu, h.data(), d, n * 4);
    return h;
}

/* the device's seconds per run of fn (one warm-up, then reps between two marks) */
template <class F> static double dev_time(F fn, int reps = 3) {
    fn();
    uint64_t a = gpu->ops->timer_mark(gpu);
    for (int i = 0; i < reps; i++) fn();
    uint64_t b = gpu->ops->timer_mark(gpu);
    double s = gpu->ops->timer_seconds(gpu, a, b);
    timed++;
    return s < 0 ? NAN : s / reps;
}
static void emit(const char *name, double sec, double flops, const char *extra = "") {
    double tf = flops > 0 && sec > 0 ? flops / sec / 1e12 : 0;
    printf("probe %-44s %9.3f ms  %8.2f TFLOPS %s\n", name, sec * 1e3, tf, extra);
    char buf[512];
    snprintf(buf, sizeof buf, ",\"%s\":{\"ms\":%.6g,\"tflops\":%.6g}", name, sec * 1e3, tf);
    js += buf;
}
static void spot(const char *what, const std::vector<float> &a, const std::vector<float> &ref, double tol) {
    double m = 0, worst = 0;
    for (float r : ref) m = fmax(m, fabs((double)r));
    for (size_t i = 0; i < a.size(); i++) {
        double e = fabs((double)a[i] - ref[i]) / (tol * (m > 0 ? m : 1) + 10 * tol * fabs((double)ref[i]));
        if (!(e <= worst)) worst = e;
    }
    bool ok = worst <= 1;
    failures += !ok;
    printf("probe spot check %-34s %s (worst err/tol %.3g)\n", what, ok ? "ok" : "FAIL", worst);
    char buf[256];
    snprintf(buf, sizeof buf, ",\"spot %s\":{\"ok\":%s,\"worst_err_over_tol\":%.4g}", what, ok ? "true" : "false", worst);
    js += buf;
}

/* matmul N x C -> OC in the three modes: time, TFLOPS, bf16 and tf32 against fp32 */
static double matmul_modes(const char *tag, int N, int C, int OC, bool backward) {
    float *x = dev_random((size_t)N * C, 1), *w = dev_random((size_t)C * OC, 0.02f);
    float *o = (float *)gpu->ops->alloc(gpu, (size_t)N * OC * 4);
    float *dx = backward ? (float *)gpu->ops->alloc(gpu, (size_t)N * C * 4) : nullptr;
    float *dw = backward ? (float *)gpu->ops->alloc(gpu, (size_t)C * OC * 4) : nullptr;
    const char *names[3] = {"fp32", "tf32", "bf16"};
    std::vector<float> ref;
    double best = 0;
    st_cuda_matmul_stats s0, s1;
    for (int m = 0; m < 3; m++) {
        st_err err = {};
        st_backend_cuda_set_matmul(gpu, (st_matmul_mode)m, &err);
        st_backend_cuda_matmul_stats(gpu, &s0);
        double t = dev_time([&] { gpu->ops->matmul_forward(gpu, o, x, w, nullptr, N, C, OC, ST_W_OUT_IN); });
        st_backend_cuda_matmul_stats(gpu, &s1);
        char name[96], extra[160] = "";
        std::vector<float> out = down(o, (size_t)N * OC);
        if (m == 0) ref = out;
        else {
            double worst = 0, mref = 0;
            for (float r : ref) mref = fmax(mref, fabs((double)r));
            for (size_t i = 0; i < out.size(); i++) worst = fmax(worst, fabs((double)out[i] - ref[i]));
            snprintf(extra, sizeof extra, "max|diff from fp32| / max|fp32| %.3g%s", worst / (mref > 0 ? mref : 1),
                     s1.fallbacks > s0.fallbacks ? " (FELL BACK TO FP32: no tensor-core algorithm)" : "");
            char b[200];
            snprintf(b, sizeof b, ",\"%s %s vs fp32\":{\"max_rel_diff\":%.4g,\"fell_back\":%s}", tag, names[m],
                     worst / (mref > 0 ? mref : 1), s1.fallbacks > s0.fallbacks ? "true" : "false");
            js += b;
        }
        snprintf(name, sizeof name, "%s fwd %s %dx%dx%d", tag, names[m], N, C, OC);
        emit(name, t, 2.0 * N * C * OC, extra);
        if (m == 2) best = 2.0 * N * C * OC / t / 1e12;
        if (backward) {
            double tb = dev_time([&] {
                gpu->ops->matmul_backward(gpu, dx, dw, nullptr, o, x, w, N, C, OC, ST_W_OUT_IN);
            });
            snprintf(name, sizeof name, "%s bwd %s %dx%dx%d", tag, names[m], N, C, OC);
            emit(name, tb, 4.0 * N * C * OC);
        }
    }
    st_err err = {};
    st_backend_cuda_set_matmul(gpu, ST_MATMUL_FP32, &err);
    for (float *p : {x, w, o, dx, dw})
        if (p) gpu->ops->dealloc(gpu, p);
    return best;
}

static void bandwidth(size_t bytes) {
    void *pinned = gpu->ops->host_alloc(gpu, bytes), *pageable = malloc(bytes);
    void *d = gpu->ops->alloc(gpu, bytes);
    if (!pinned || !pageable || !d) {
        printf("probe bandwidth: cannot allocate %zu bytes\n", bytes);
        failures++;
        return;
    }
    memset(pageable, 1, bytes);
    for (int kind = 0; kind < 2; kind++)
        for (int dir = 0; dir < 2; dir++) {
            void *h = kind ? pageable : pinned;
            double best = 1e30;
            for (int r = 0; r < 3; r++) {
                double t0 = st_now();
                uint64_t t = dir ? gpu->ops->copy_async(gpu, 1, h, d, bytes) : gpu->ops->copy_async(gpu, 0, d, h, bytes);
                gpu->ops->copy_sync(gpu, dir, t);
                best = fmin(best, st_now() - t0);
            }
            char name[64], b[160];
            snprintf(name, sizeof name, "copy %s %s", dir ? "d2h" : "h2d", kind ? "pageable" : "pinned");
            printf("probe %-44s %9.3f ms  %8.2f GB/s (%zu MiB)\n", name, best * 1e3, bytes / best / 1e9, bytes >> 20);
            snprintf(b, sizeof b, ",\"%s\":{\"GBps\":%.5g,\"bytes\":%zu}", name, bytes / best / 1e9, bytes);
            js += b;
        }
    gpu->ops->host_free(gpu, pinned);
    gpu->ops->dealloc(gpu, d);
    free(pageable);
}

int main(int argc, char **argv) {
    const char *json = nullptr;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else {
            fprintf(stderr, "usage: cuda_probe [--json FILE] [--quick]\n");
            return 2;
        }
    }
    size_t fr = 0, tot = 0;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        printf("cuda_probe: no CUDA device: skipped\n");
        return 77;
    }
    cudaMemGetInfo(&fr, &tot);
    size_t budget = quick ? (size_t)512 << 20 : (size_t)24 << 30;
    if (budget > fr * 3 / 4) budget = fr * 3 / 4;
    st_err err = {};
    if (st_backend_cuda_create(&gpu, 0, budget, &err) != ST_OK || st_backend_cpu_create(&cpu, 0, &err) != ST_OK) {
        printf("cuda_probe: %s\n", err.msg);
        return 1;
    }
    st_rng_seed(&rng, 30);
    const int C = quick ? 256 : 4096, NH = quick ? 8 : 32, NKV = quick ? 2 : 8, HS = 128 / (quick ? 4 : 1);
    const int T = quick ? 256 : 4096, F = quick ? 896 : 14336, V = quick ? 8017 : 128256, N = T, VC = quick ? 1024 : 16384;
    printf("probe: device budget %zu bytes of %zu free; C %d, heads %d/%d x %d, T %d, FFN %d, vocabulary %d (chunks of %d)\n",
           budget, fr, C, NH, NKV, HS, T, F, V, VC);

    /* matmuls: the card's ceiling, then the model's shapes, then GPT-2's head */
    int big = quick ? 1024 : 8192;
    double ceiling = matmul_modes("matmul ceiling", big, big, big, false);
    double qkv = matmul_modes("matmul qkv", N, C, C + 2 * (C / NH) * NKV, true);
    matmul_modes("matmul ffn up", N, C, 2 * F, true);
    matmul_modes("matmul ffn down", N, F, C, true);
    matmul_modes("matmul gpt2 head", 512, 768, 50257, false);
    /* the bias gradient: dbias (OC) over N rows */
    {
        float *dout = dev_random((size_t)N * C, 1), *db = (float *)gpu->ops->alloc(gpu, (size_t)C * 4);
        double t = dev_time([&] { gpu->ops->matmul_backward(gpu, nullptr, nullptr, db, dout, nullptr, nullptr, N, C, C, ST_W_OUT_IN); });
        emit("bias grad (dbias only)", t, 0);
        gpu->ops->dealloc(gpu, dout), gpu->ops->dealloc(gpu, db);
    }
    /* norms, activation, rope: spot-checked against the CPU at full shape */
    {
        size_t n = (size_t)N * C;
        float *x = dev_random(n, 1), *w = dev_random(C, 0.1f), *o = (float *)gpu->ops->alloc(gpu, n * 4);
        float *rs = (float *)gpu->ops->alloc(gpu, (size_t)N * 4 * NH), *dx = (float *)gpu->ops->alloc(gpu, n * 4);
        float *dw = (float *)gpu->ops->alloc(gpu, (size_t)C * 4);
        emit("rmsnorm fwd", dev_time([&] { gpu->ops->rmsnorm_forward(gpu, o, rs, x, w, N, 1, C, C, 1e-5f); }), 0);
        emit("rmsnorm bwd", dev_time([&] { gpu->ops->rmsnorm_backward(gpu, dx, dw, x, x, w, rs, N, 1, C, C); }), 0);
        emit("rmsnorm bwd q/k heads (head 128)", dev_time([&] {
                 gpu->ops->rmsnorm_backward(gpu, dx, dw, x, x, w, rs, N, NH, HS, C);
             }), 0);
        std::vector<float> hx = down(x, n), hw = down(w, C), ho(n), hr(N);
        gpu->ops->rmsnorm_forward(gpu, o, rs, x, w, N, 1, C, C, 1e-5f);
        cpu->ops->rmsnorm_forward(cpu, ho.data(), hr.data(), hx.data(), hw.data(), N, 1, C, C, 1e-5f);
        spot("rmsnorm fwd", down(o, n), ho, 1e-5);
        for (float *p : {x, w, o, rs, dx, dw}) gpu->ops->dealloc(gpu, p);
    }
    {
        size_t n = (size_t)N * F;
        float *x = dev_random(2 * n, 1), *o = (float *)gpu->ops->alloc(gpu, n * 4), *dx = (float *)gpu->ops->alloc(gpu, 2 * n * 4);
        emit("swiglu fwd", dev_time([&] { gpu->ops->swiglu_forward(gpu, o, x, N, F); }), 0);
        emit("swiglu bwd", dev_time([&] { gpu->ops->swiglu_backward(gpu, dx, x, o, N, F); }), 0);
        std::vector<float> hx = down(x, 2 * n), ho(n);
        gpu->ops->swiglu_forward(gpu, o, x, N, F);
        cpu->ops->swiglu_forward(cpu, ho.data(), hx.data(), N, F);
        spot("swiglu fwd", down(o, n), ho, 1e-6);
        for (float *p : {x, o, dx}) gpu->ops->dealloc(gpu, p);
    }
    {
        int half = HS / 2, ld = C + 2 * (C / NH) * NKV;
        float *q = dev_random((size_t)N * ld, 1), *cs = dev_random((size_t)T * half, 1), *sn = dev_random((size_t)T * half, 1);
        emit("rope fwd (q)", dev_time([&] { gpu->ops->rope_forward(gpu, q, cs, sn, 1, T, NH, HS, ld); }), 0);
        for (float *p : {q, cs, sn}) gpu->ops->dealloc(gpu, p);
    }
    /* attention: GQA, causal, B 1; FLOPs of the causal half: 2 T^2 hs NH forward, 2.5 x backward */
    {
        int ld = C + 2 * (C / NH) * NKV, ko = C, vo = C + (C / NH) * NKV;
        size_t nq = (size_t)N * ld, no = (size_t)N * C;
        float *q = dev_random(nq, 1), *o = (float *)gpu->ops->alloc(gpu, no * 4);
        float *l = (float *)gpu->ops->alloc(gpu, (size_t)N * NH * 4), *dq = (float *)gpu->ops->alloc(gpu, nq * 4);
        float *dy = dev_random(no, 1);
        double fl = 2.0 * T * (double)T * HS * NH;
        emit("attention gqa fwd", dev_time([&] {
                 gpu->ops->attention_gqa_forward(gpu, o, l, q, q + ko, q + vo, ld, 1, T, NH, NKV, HS);
             }, 2), fl);
        emit("attention gqa bwd", dev_time([&] {
                 gpu->ops->attention_gqa_backward(gpu, dq, dq + ko, dq + vo, dy, q, q + ko, q + vo, o, l, ld, 1, T, NH, NKV, HS);
             }, 2), 2.5 * fl);
        for (float *p : {q, o, l, dq, dy}) gpu->ops->dealloc(gpu, p);
        /* spot check at T 512 (the CPU's attention at 4096 would take the stage's time) */
        int Ts = quick ? 64 : 512;
        size_t nqs = (size_t)Ts * ld, nos = (size_t)Ts * C;
        float *qs = dev_random(nqs, 1), *os = (float *)gpu->ops->alloc(gpu, nos * 4);
        float *ls = (float *)gpu->ops->alloc(gpu, (size_t)Ts * NH * 4);
        gpu->ops->attention_gqa_forward(gpu, os, ls, qs, qs + ko, qs + vo, ld, 1, Ts, NH, NKV, HS);
        std::vector<float> hq = down(qs, nqs), ho(nos), hl((size_t)Ts * NH);
        cpu->ops->attention_gqa_forward(cpu, ho.data(), hl.data(), hq.data(), hq.data() + ko, hq.data() + vo, ld, 1, Ts,
                                        NH, NKV, HS);
        spot("attention gqa fwd (T 512)", down(os, nos), ho, 3e-5);
        for (float *p : {qs, os, ls}) gpu->ops->dealloc(gpu, p);
    }
    /* cuDNN's fused attention (issue 30): the same shapes timed through cuDNN, then at T 512
     * (64 quick) cuDNN against the own kernels on the same inputs, forward (out, lse) and
     * backward (dq, dk, dv), at bf16 tolerances; a fallback to the own kernels is a failure
     * here, with cuDNN's reason */
    {
        st_err e = {};
        if (st_backend_cuda_set_attention(gpu, ST_CUDA_ATTENTION_CUDNN, &e) != ST_OK) {
            printf("probe attention cudnn: not built: %s\n", e.msg);
            js += ",\"attention cudnn\":\"not built\"";
        } else {
            int ld = C + 2 * (C / NH) * NKV, ko = C, vo = C + (C / NH) * NKV;
            size_t nq = (size_t)N * ld, no = (size_t)N * C;
            float *q = dev_random(nq, 1), *o = (float *)gpu->ops->alloc(gpu, no * 4);
            float *l = (float *)gpu->ops->alloc(gpu, (size_t)N * NH * 4), *dq = (float *)gpu->ops->alloc(gpu, nq * 4);
            float *dy = dev_random(no, 1);
            double fl = 2.0 * T * (double)T * HS * NH;
            st_cuda_attention_stats a0, a1;
            st_backend_cuda_attention_stats(gpu, &a0);
            emit("attention gqa fwd cudnn", dev_time([&] {
                     gpu->ops->attention_gqa_forward(gpu, o, l, q, q + ko, q + vo, ld, 1, T, NH, NKV, HS);
                 }, 2), fl);
            emit("attention gqa bwd cudnn", dev_time([&] {
                     gpu->ops->attention_gqa_backward(gpu, dq, dq + ko, dq + vo, dy, q, q + ko, q + vo, o, l, ld, 1, T,
                                                      NH, NKV, HS);
                 }, 2), 2.5 * fl);
            st_backend_cuda_attention_stats(gpu, &a1);
            for (float *p : {q, o, l, dq, dy}) gpu->ops->dealloc(gpu, p);
            bool fwd = a1.cudnn[0] > a0.cudnn[0], bwd = a1.cudnn[1] > a0.cudnn[1];
            printf("probe attention cudnn: forward %s, backward %s%s%s\n", fwd ? "cuDNN" : "FELL BACK to the own kernels",
                   bwd ? "cuDNN" : "FELL BACK to the own kernels", a1.why[0] ? ": " : "", a1.why);
            failures += !fwd + !bwd;
            char b[400];
            snprintf(b, sizeof b, ",\"attention cudnn ran\":{\"forward\":%s,\"backward\":%s}", fwd ? "true" : "false",
                     bwd ? "true" : "false");
            js += b;
            /* cuDNN against the own kernels on one input */
            int Ts = quick ? 64 : 512;
            size_t nqs = (size_t)Ts * ld, nos = (size_t)Ts * C, nls = (size_t)Ts * NH;
            float *qs = dev_random(nqs, 1), *dys = dev_random(nos, 1);
            std::vector<float> res[2][5]; /* [own, cudnn][out, lse, dq, dk, dv] */
            for (int m = 0; m < 2; m++) {
                st_backend_cuda_set_attention(gpu, m ? ST_CUDA_ATTENTION_CUDNN : ST_CUDA_ATTENTION_OWN, &e);
                float *os = (float *)gpu->ops->alloc(gpu, nos * 4), *ls = (float *)gpu->ops->alloc(gpu, nls * 4);
                float *dqs = (float *)gpu->ops->alloc(gpu, nqs * 4); /* zeroed: the backward adds */
                gpu->ops->attention_gqa_forward(gpu, os, ls, qs, qs + ko, qs + vo, ld, 1, Ts, NH, NKV, HS);
                gpu->ops->attention_gqa_backward(gpu, dqs, dqs + ko, dqs + vo, dys, qs, qs + ko, qs + vo, os, ls, ld, 1,
                                                 Ts, NH, NKV, HS);
                res[m][0] = down(os, nos), res[m][1] = down(ls, nls);
                std::vector<float> g = down(dqs, nqs);
                for (int part = 0; part < 3; part++) { /* dq, dk, dv: the columns of each in every row */
                    int c0 = part == 0 ? 0 : part == 1 ? ko : vo, w = part == 0 ? C : (C / NH) * NKV;
                    for (int t = 0; t < Ts; t++)
                        res[m][2 + part].insert(res[m][2 + part].end(), g.begin() + (size_t)t * ld + c0,
                                                g.begin() + (size_t)t * ld + c0 + w);
                }
                for (float *p : {os, ls, dqs}) gpu->ops->dealloc(gpu, p);
            }
            const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
            const double tols[5] = {2e-2, 1e-2, 3e-2, 3e-2, 3e-2};
            for (int i = 0; i < 5; i++) {
                char what[64];
                snprintf(what, sizeof what, "attention cudnn vs own %s (T %d)", names[i], Ts);
                spot(what, res[1][i], res[0][i], tols[i]);
            }
            for (float *p : {qs, dys}) gpu->ops->dealloc(gpu, p);
            st_backend_cuda_set_attention(gpu, ST_CUDA_ATTENTION_AUTO, &e);
        }
    }
    /* embedding backward: distinct ids x C x N; the classifier whole and chunked */
    {
        std::vector<int32_t> ids(N);
        for (int i = 0; i < N; i++) ids[i] = (int32_t)(st_rng_u64(&rng) % (uint64_t)V);
        int32_t *d_ids = (int32_t *)gpu->ops->alloc(gpu, (size_t)N * 4);
        gpu->ops->copy_to_device(gpu, d_ids, ids.data(), (size_t)N * 4);
        float *dout = dev_random((size_t)N * C, 1), *dwte = (float *)gpu->ops->alloc(gpu, (size_t)V * C * 4);
        emit("embedding bwd", dev_time([&] { gpu->ops->embedding_backward(gpu, dwte, dout, d_ids, 1, T, C); }, 1), 0);
        gpu->ops->dealloc(gpu, dout), gpu->ops->dealloc(gpu, dwte);
        float *lg = dev_random((size_t)N * VC, 2), *rmax = (float *)gpu->ops->alloc(gpu, (size_t)N * 4);
        double *rsum = (double *)gpu->ops->alloc(gpu, (size_t)N * 8);
        float *tl = (float *)gpu->ops->alloc(gpu, (size_t)N * 4);
        gpu->ops->softmax_chunk_init(gpu, rmax, rsum, tl, N);
        emit("softmax chunk stats (one chunk)", dev_time([&] {
                 gpu->ops->softmax_chunk_stats(gpu, lg, d_ids, N, VC, 0, rmax, rsum, tl);
             }), 0);
        emit("softmax chunk grad (one chunk)", dev_time([&] {
                 gpu->ops->softmax_chunk_grad(gpu, lg, d_ids, N, VC, 0, rmax, rsum, 1.0f / N);
             }), 0);
        for (void *p : {(void *)lg, (void *)rmax, (void *)rsum, (void *)tl}) gpu->ops->dealloc(gpu, p);
        int rows = quick ? N : 1024; /* the whole vocabulary: 1024 rows x 128256 (0.5 GB of logits) */
        float *lw = dev_random((size_t)rows * V, 2), *loss = (float *)gpu->ops->alloc(gpu, (size_t)rows * 4);
        emit("crossentropy whole vocabulary (1024 rows)", dev_time([&] {
                 gpu->ops->crossentropy_forward_backward(gpu, lw, loss, d_ids, rows, V, 1.0f / rows);
             }, 1), 0);
        for (void *p : {(void *)lw, (void *)loss, (void *)d_ids}) gpu->ops->dealloc(gpu, p);
    }
    bandwidth(quick ? (size_t)16 << 20 : (size_t)512 << 20);

    st_status s = st_backend_cuda_status(gpu, &err);
    if (s != ST_OK) {
        printf("probe FAIL: the backend kept an error: %s\n", err.msg);
        failures++;
    }
    char b[256];
    snprintf(b, sizeof b, ",\"ceiling_bf16_tflops\":%.5g,\"qkv_bf16_tflops\":%.5g,\"timed\":%d,\"failures\":%d}", ceiling,
             qkv, timed, failures);
    js += b;
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) fputs(js.c_str(), f), fputc('\n', f), fclose(f);
    } else
        puts(js.c_str());
    st_backend_free(gpu);
    st_backend_free(cpu);
    printf("probe: %d measurements, %d spot-check failures; bf16 matmul ceiling %.1f TFLOPS (%d^3), qkv %.1f TFLOPS\n",
           timed, failures, ceiling, big, qkv);
    return failures ? 1 : 0;
}

/* test_cuda_emu_stream.cpp - the layer-streaming executor (strata/stream.h) on the CUDA
 * backend under the emulation, whose copies are asynchronous: backend_cuda.cu compiled here
 * by g++ against tests/cuda_emu (as test_cuda_emu_model does, entry points renamed), where
 * a copy queued on a copy stream is DEFERRED until something waits for it
 * (tests/cuda_emu/cuda_runtime.h). So the copy engine's copy_async path runs with copies
 * that land late, as on a GPU: a host thread that reads a gradient, an offloaded
 * activation or a logits chunk before the executor waited for it, or a weight slot
 * refilled before its wait, sees stale bytes and the run drifts from the CPU's.
 *
 * For gpt2-tiny (both blocks' activations offloaded, fp32 drain, room for 2 micro-batches:
 * the accumulation buffer is allocated, one micro-batch per step keeps the test short)
 * and llama-tiny (one block offloaded and one kept, the classifier in 3 vocabulary chunks
 * so that logits cross both ways, a bf16 gradient drain, prefetch depth 2), each
 * with a device budget of exactly what the plan needs (the blocks' weights stream through
 * prefetch_depth + 1 slots), 3 steps on the emulated CUDA backend and on the CPU backend
 * with the same budget, from the same initial weights: the losses agree within 1e-5
 * relative and the final host parameters within 1e-5 max|cpu| + 1e-4 |cpu|. The host
 * buffers the executor allocates itself must be the backend's page-locked ones
 * (host_alloc), each once at its size: the emulation lists them; for gpt2-tiny the parameters
 * and gradients are the caller's pageable vectors (as strata train's), which the executor
 * must page-lock (host_register), so that no copy on the copy streams touches pageable
 * memory (the emulation counts such copies per stream). Each step's compute_s is timed by
 * the backend's events (compute_on_device), and a trace of the CUDA run draws the blocks'
 * forward and backward on its GPU track. First, the copy engine
 * alone on that backend: tickets, waits, stats and the trace's observer. */
#define st_backend_cuda_create st_backend_cuda_emu_create
#define st_backend_cuda_status st_backend_cuda_emu_status
#include "backend/cuda/backend_cuda.cu"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

extern "C" {
#include "strata/block.h"
#include "strata/model.h"
#include "strata/prof.h"
#include "strata/stream.h"
#include "strata/tier.h"
#include "testutil.h"
}

#define STEPS 3
#define LOSS_RTOL 1e-5
#define PARAM_ATOL 1e-5 /* times max|cpu| */
#define PARAM_RTOL 1e-4

struct Variant {
    const char *preset;
    int grad_accum, n_micro, depth, vocab_chunk; /* grad_accum: the executor's bound (> 1: hg2) */
    st_dtype grad_dtype;
    unsigned char act[2];
    bool caller_host; /* the parameters and gradients are the caller's pageable vectors, as strata train's */
};

struct Run {
    std::vector<float> losses, params;
    int on_device = 0;          /* steps whose compute_s the device's marks timed */
    double compute_s = 0, wall_s = 0;
    size_t n_pinned = 0, pinned_bytes = 0, budget = 0, n_registered = 0, registered_bytes = 0;
    uint64_t h2d = 0, d2h = 0;
    uint64_t pageable_async = 0, pageable_sync = 0; /* pageable bytes on the copy streams; on the compute stream */
};

static void batch(int step, int n, int V, std::vector<int32_t> &in, std::vector<int32_t> &tg) {
    st_rng r;
    st_rng_seed(&r, 1000 + (uint64_t)step);
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(st_rng_u64(&r) % (uint64_t)V);
        tg[i] = i % 9 == 4 ? -1 : (int32_t)((3 * in[i] + 1) % V); /* some targets masked */
    }
}

/* 3 steps of v on `inner` under a budget of what the plan needs; false if it could not run */
static bool run(st_backend *inner, const st_arch *arch, const Variant &v, int B, int T, Run *out) {
    st_err err = {};
    st_stream_plan plan;
    st_stream_plan_default(&plan, arch->lay.n_blocks);
    plan.prefetch_depth = v.depth;
    plan.vocab_chunk = v.vocab_chunk;
    plan.grad_dtype = v.grad_dtype;
    for (int l = 0; l < arch->lay.n_blocks; l++) plan.act[l] = v.act[l];
    st_stream_config sc = {};
    sc.arch = arch, sc.B = B, sc.T = T, sc.weight_decay = 0.1f, sc.grad_accum = v.grad_accum;
    std::vector<float> caller_p, caller_g; /* pageable, as a model's vectors on the CPU backend */
    if (v.caller_host) {
        caller_p.assign(arch->lay.n_params, 0.0f), caller_g.assign(arch->lay.n_params, 0.0f);
        sc.host_params = caller_p.data(), sc.host_grads = caller_g.data();
    }
    size_t budget = st_stream_device_bytes(&sc, &plan);
    st_backend *dev = nullptr;
    st_stream_exec *x = nullptr;
    if (st_backend_with_budget(&dev, inner, budget, &err) != ST_OK ||
        st_stream_exec_create(&x, &sc, &plan, dev, &err) != ST_OK) {
        CHECK(0, "%s on %s: %s", v.preset, inner->ops->name, err.msg);
        st_backend_free(dev);
        return false;
    }
    out->budget = budget;
    {
        st_emu::Runtime &r = st_emu::rt();
        std::lock_guard<std::mutex> g(r.mu);
        out->n_pinned = r.pinned.size();
        for (auto &kv : r.pinned) out->pinned_bytes += kv.second;
        out->n_registered = r.registered.size();
        for (auto &kv : r.registered) out->registered_bytes += kv.second;
    }
    /* the pageable bytes copied on the backend's copy streams (the streamed path: weights,
     * gradients, activations, logits) and on its compute stream (copy_to_device/_host) */
    bool is_cuda = inner->ops->free == be_free;
    auto pageable = [&](uint64_t *async_b, uint64_t *sync_b) {
        st_emu::Runtime &r = st_emu::rt();
        std::lock_guard<std::mutex> g(r.mu);
        cuda_ctx *cc = (cuda_ctx *)inner->ctx;
        *async_b = r.pageable_by_stream[cc->copy_stream[0]->id] + r.pageable_by_stream[cc->copy_stream[1]->id];
        *sync_b = r.pageable_by_stream[cc->stream->id];
    };
    uint64_t pa0 = 0, ps0 = 0;
    if (is_cuda) pageable(&pa0, &ps0);
    st_stream_init_random(x, 7);
    int n = v.n_micro * B * T;
    std::vector<int32_t> in(n), tg(n);
    for (int s = 0; s < STEPS; s++) {
        batch(s, n, arch->lay.vocab_size, in, tg);
        st_adamw_params hp = {1e-3f, 0.9f, 0.95f, 1e-8f, s + 1, 1.0f, 0.0f}; // lr2: no second learning-rate class here
        st_stream_step_stats st;
        if (st_stream_step_accum(x, v.n_micro, in.data(), tg.data(), &hp, 1.0f, &st, &err) != ST_OK) {
            CHECK(0, "%s on %s, step %d: %s", v.preset, inner->ops->name, s, err.msg);
            break;
        }
        out->losses.push_back(st.loss);
        out->on_device += st.compute_on_device, out->compute_s += st.compute_s, out->wall_s += st.wall_s;
        out->h2d += st.h2d_bytes, out->d2h += st.d2h_bytes;
    }
    out->params.assign(st_stream_params(x), st_stream_params(x) + arch->lay.n_params);
    st_stream_exec_free(x);
    if (is_cuda) {
        uint64_t pa1 = 0, ps1 = 0;
        pageable(&pa1, &ps1);
        out->pageable_async = pa1 - pa0, out->pageable_sync = ps1 - ps0;
        std::lock_guard<std::mutex> g(st_emu::rt().mu);
        CHECK(st_emu::rt().registered.empty(), "%s: %zu host ranges still registered after the executor was freed",
              v.preset, st_emu::rt().registered.size());
    }
    st_backend_free(dev);
    return (int)out->losses.size() == STEPS;
}

static void test_variant(st_backend *gpu, st_backend *cpu, const Variant &v) {
    st_err err = {};
    st_model_shape shape;
    st_arch *arch = nullptr;
    const int B = 2, T = 11;
    if (st_model_resolve(v.preset, "", nullptr, B, T, &shape, &arch, &err) != ST_OK) {
        CHECK(0, "%s: %s", v.preset, err.msg);
        return;
    }
    const st_arch_layout *y = &arch->lay;
    size_t n = y->n_params;
    Run g, c;
    /* the CUDA run traced: its compute spans must be on the GPU track, timed by events */
    char trace[] = "/tmp/strata-emu-stream-trace-XXXXXX";
    int tfd = mkstemp(trace);
    if (tfd >= 0) close(tfd);
    CHECK(tfd >= 0 && st_prof_trace_start(trace, "test_cuda_emu_stream", &err) == ST_OK, "trace: %s", err.msg);
    bool okg = run(gpu, arch, v, B, T, &g);
    CHECK(st_prof_trace_stop(&err) == ST_OK, "trace stop: %s", err.msg);
    bool ok = okg && run(cpu, arch, v, B, T, &c);
    {
        std::string text;
        FILE *f = fopen(trace, "rb");
        char buf[65536];
        size_t k;
        while (f && (k = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, k);
        if (f) fclose(f);
        unlink(trace);
        CHECK(text.find("\"forward block 0\",\"pid\":2") != std::string::npos &&
                  text.find("\"backward block 1\",\"pid\":2") != std::string::npos,
              "%s: the trace has no device-timed compute spans on its GPU track (%zu bytes)", v.preset, text.size());
    }
    CHECK(!ok || (g.on_device == STEPS && c.on_device == 0 && g.compute_s > 0 && g.compute_s <= g.wall_s),
          "%s: compute_s timed by the device's events in %d of %d CUDA steps (want all; the CPU's %d, want 0); "
          "%.4f s of %.4f s wall", v.preset, g.on_device, STEPS, c.on_device, g.compute_s, g.wall_s);
    st_err serr = {};
    CHECK(st_backend_cuda_emu_status(gpu, &serr) == ST_OK, "%s: the CUDA backend kept an error: %s", v.preset,
          serr.msg);
    if (ok) {
        /* the executor's own host buffers, each page-locked once at its size: the parameters,
         * the gradients, the accumulation buffer, the bf16 drain, the offloaded activation
         * sets and the chunked classifier's embedding output, residual gradient and logits */
        size_t N = (size_t)B * T, C = (size_t)y->n_embd, setf = st_block_act_floats(arch, B, T);
        size_t n_off = 0, vc = v.vocab_chunk ? (size_t)v.vocab_chunk : 0, nvc = vc ? (y->vocab_size + vc - 1) / vc : 0;
        for (int l = 0; l < y->n_blocks; l++) n_off += v.act[l] == ST_STREAM_ACT_OFFLOAD;
        size_t want_n = v.caller_host ? 0 : 2, want_bytes = v.caller_host ? 0 : 2 * n * 4;
        if (v.grad_accum > 1) want_n++, want_bytes += n * 4;
        if (v.grad_dtype == ST_BF16) want_n++, want_bytes += n * 2;
        if (n_off) want_n++, want_bytes += n_off * setf * 4;
        if (vc) want_n += 2, want_bytes += 2 * N * C * 4;
        if (nvc > 2) want_n++, want_bytes += N * (nvc - 2) * vc * 4;
        CHECK(g.n_pinned == want_n && g.pinned_bytes == want_bytes,
              "%s: %zu page-locked host buffers of %zu bytes, want %zu of %zu", v.preset, g.n_pinned,
              g.pinned_bytes, want_n, want_bytes);
        CHECK(c.n_pinned == 0, "%s: the CPU backend's run took %zu page-locked buffers", v.preset, c.n_pinned);
        /* the caller's vectors are page-locked where they are (cudaHostRegister), and no
         * streamed copy (a copy stream's) touches pageable memory */
        size_t want_reg = v.caller_host ? 2 : 0;
        CHECK(g.n_registered == want_reg && g.registered_bytes == want_reg * n * 4,
              "%s: %zu host ranges of %zu bytes registered, want %zu of %zu (the caller's parameters and gradients)",
              v.preset, g.n_registered, g.registered_bytes, want_reg, want_reg * n * 4);
        CHECK(g.pageable_async == 0, "%s: %llu bytes of the streamed copies (the copy streams') were to or from "
              "pageable host memory", v.preset, (unsigned long long)g.pageable_async);
        CHECK(g.h2d == c.h2d && g.d2h == c.d2h, "%s: bytes moved differ: h2d %llu vs %llu, d2h %llu vs %llu",
              v.preset, (unsigned long long)g.h2d, (unsigned long long)c.h2d, (unsigned long long)g.d2h,
              (unsigned long long)c.d2h);
        double worst_loss = 0;
        for (int s = 0; s < STEPS; s++) {
            double rel = fabs((double)g.losses[s] - c.losses[s]) / fabs((double)c.losses[s]);
            if (!(rel <= worst_loss)) worst_loss = rel;
        }
        CHECK(worst_loss <= LOSS_RTOL, "%s: losses differ by %.3g relative (step 3: cuda %.9g, cpu %.9g)", v.preset,
              worst_loss, g.losses[STEPS - 1], c.losses[STEPS - 1]);
        double mx = 0, worst = 0;
        for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)c.params[i]));
        double atol = PARAM_ATOL * mx;
        char what[128];
        snprintf(what, sizeof what, "%s: parameters after %d steps", v.preset, STEPS);
        check_close_f32(what, g.params.data(), c.params.data(), n, atol, PARAM_RTOL);
        for (size_t i = 0; i < n; i++) {
            double e = fabs((double)g.params[i] - c.params[i]) / (atol + PARAM_RTOL * fabs((double)c.params[i]));
            if (!(e <= worst)) worst = e;
        }
        printf("%s: %zu parameters (%zu bytes), device budget %zu bytes; losses %.6f -> %.6f, worst rel %.2g; "
               "worst parameter err/tol %.3g; %zu page-locked buffers, %zu registered; pageable bytes: %llu "
               "streamed, %llu in synchronous copies\n",
               v.preset, n, n * 4, g.budget, c.losses[0], c.losses[STEPS - 1], worst_loss, worst, g.n_pinned,
               g.n_registered, (unsigned long long)g.pageable_async, (unsigned long long)g.pageable_sync);
    }
    st_arch_free(arch);
}

/* The copy engine on the asynchronous path directly: no worker, tickets over both
 * directions, st_copy_done / st_copy_wait, the stats, and the observer (what the
 * executor's trace uses) called once per copy with its direction and bytes. */
struct Seen {
    int n = 0, d2h = 0, order_ok = 1;
    size_t bytes = 0;
    double last_done = 0;
};
static int want_all(void) { return 1; }
static void seen_done(void *ctx, int d2h, size_t bytes, double t_submit, double t_done) {
    Seen *s = (Seen *)ctx;
    s->n++, s->d2h += d2h, s->bytes += bytes;
    s->order_ok &= t_done >= t_submit && t_done >= s->last_done;
    s->last_done = t_done;
}
static void test_engine(st_backend *gpu) {
    st_err err = {};
    st_copy_engine *ce = nullptr;
    if (st_copy_engine_create(&ce, gpu, &err) != ST_OK) {
        CHECK(0, "copy engine: %s", err.msg);
        return;
    }
    Seen seen;
    st_copy_observer obs = {want_all, seen_done, &seen};
    st_copy_engine_observe(ce, &obs);
    const size_t n = 256;
    float *h = (float *)gpu->ops->host_alloc(gpu, 2 * n * 4), *d = (float *)gpu->ops->alloc(gpu, n * 4);
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    uint64_t t1 = st_copy_h2d(ce, d, h, n * 4);
    uint64_t t2 = st_copy_d2h(ce, h + n, d, n * 4); /* another stream: may read d before t1 lands */
    st_copy_wait(ce, t1);
    uint64_t t3 = st_copy_d2h(ce, h + n, d, n * 4);
    st_copy_wait(ce, t3); /* t3, queued after t1 was waited for, is the copy checked */
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[n + i] != (float)i;
    CHECK(t1 == 1 && t2 == 2 && t3 == 3 && st_copy_done(ce, t2) && bad == 0,
          "engine tickets %llu %llu %llu, %zu of %zu floats wrong after st_copy_wait", (unsigned long long)t1,
          (unsigned long long)t2, (unsigned long long)t3, bad, n);
    st_copy_stats cs;
    st_copy_get_stats(ce, &cs);
    CHECK(cs.copies == 3 && cs.h2d_bytes == n * 4 && cs.d2h_bytes == 2 * n * 4 && cs.busy_s >= 0,
          "engine stats: %llu copies, %llu h2d bytes, %llu d2h bytes", (unsigned long long)cs.copies,
          (unsigned long long)cs.h2d_bytes, (unsigned long long)cs.d2h_bytes);
    st_copy_engine_destroy(ce); /* joins the observer once it saw every copy */
    CHECK(seen.n == 3 && seen.d2h == 2 && seen.bytes == 3 * n * 4 && seen.order_ok,
          "the observer saw %d copies (%d d2h, %zu bytes), want 3 (2, %zu)", seen.n, seen.d2h, seen.bytes, 3 * n * 4);
    gpu->ops->dealloc(gpu, d);
    gpu->ops->host_free(gpu, h);
}

int main(void) {
    st_err err = {};
    st_backend *gpu = nullptr, *cpu = nullptr;
    if (st_backend_cuda_emu_create(&gpu, 0, (size_t)16 << 20, &err) != ST_OK ||
        st_backend_cpu_create(&cpu, 1, &err) != ST_OK) {
        fprintf(stderr, "test_cuda_emu_stream: %s\n", err.msg);
        return 1;
    }
    CHECK(gpu->ops->copy_async && gpu->ops->host_alloc, "the CUDA backend has asynchronous copies");
    CHECK(!cpu->ops->copy_async && !cpu->ops->host_alloc, "the CPU backend's copies stay host work");
    const Variant vs[] = {
        {"gpt2-tiny", 2, 1, 1, 0, ST_F32, {ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_OFFLOAD}, true},
        {"llama-tiny", 1, 1, 2, 22, ST_BF16, {ST_STREAM_ACT_OFFLOAD, ST_STREAM_ACT_KEEP}, false},
    };
    test_engine(gpu);
    for (const Variant &v : vs) {
        double t0 = st_now();
        test_variant(gpu, cpu, v);
        printf("  %s: %.1f s\n", v.preset, st_now() - t0);
    }
    st_backend_free(gpu);
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_stream");
}

/* test_cuda_emu_xent.cpp - the CUDA classifier kernels (src/backend/cuda/kernels_xent.cuh)
 * under the CUDA emulation against the CPU backend (cuda_emu/emu_diff.h): the fused
 * cross-entropy over full rows (losses; dlogits in place, or logits untouched when dloss
 * is 0) and the chunked classifier (init, stats chunk by chunk, then grad chunk by chunk)
 * with chunks of uneven widths starting at r0 > 0, targets inside and outside each chunk
 * and masked rows (target < 0: loss 0, dlogits 0, statistics untouched). fp32 and bf16
 * storage of the logits. Odd row counts (more rows than the 4 blocks of the capped
 * emulated grid) and vocabularies of 1, 37, 300 and 1001 (past the 256 threads of a
 * block: columns loop). Tolerances: test_ops_diff's crossentropy (TOL_LN); the running
 * max and the target's logit are the CPU's bits; the double sums add the same expf
 * values in another order. */
#include "backend/cuda/kernels_xent.cuh"
#include "emu_diff.h"

#define TOL_LN_ATOL 1e-5
#define TOL_LN_RTOL 1e-4
#define TOL_SUM_RTOL 1e-6 /* rsum: the same terms in double, another order */

typedef __nv_bfloat16 bf16;

static void bits(const char *what, const vecf &a, const vecf &ref) { same_bits(what, a, ref, 0); }

static std::vector<int32_t> make_targets(int N, int V) {
    std::vector<int32_t> t(N);
    for (int i = 0; i < N; i++) t[i] = (int32_t)(st_rng_u64(&emu_rng) % (uint64_t)V);
    for (int i = 2; i < N; i += 5) t[i] = -1; /* masked */
    t[0] = 0, t[N - 1] = V - 1;               /* the first and the last vocabulary row */
    return t;
}

struct XentOut {
    vecf loss, dl, loss0, l0;
};

template <class T>
static XentOut xent_cuda(const vecf &logits, const std::vector<int32_t> &tg, int N, int V, float dloss) {
    auto l = store<T>(logits), l0 = store<T>(logits);
    vecf loss(N, NAN), loss0(N, NAN);
    cu_crossentropy<T>(l.data(), loss.data(), tg.data(), N, V, dloss, nullptr);
    cu_crossentropy<T>(l0.data(), loss0.data(), tg.data(), N, V, 0.0f, nullptr);
    return {loss, load(l), loss0, load(l0)};
}
static XentOut xent_cpu(const vecf &logits, const std::vector<int32_t> &tg, int N, int V, float dloss) {
    XentOut r = {vecf(N, NAN), logits, vecf(N, NAN), logits};
    cpu->ops->crossentropy_forward_backward(cpu, r.dl.data(), r.loss.data(), tg.data(), N, V, dloss);
    cpu->ops->crossentropy_forward_backward(cpu, r.l0.data(), r.loss0.data(), tg.data(), N, V, 0.0f);
    return r;
}

static void test_crossentropy(int N, int V, float scale) {
    vecf logits = randn((size_t)N * V, scale);
    auto tg = make_targets(N, V);
    float dloss = 1.0f / N;
    char tag[96], what[200];
    snprintf(tag, sizeof tag, "crossentropy N=%d V=%d scale %g", N, V, scale);

    XentOut k = xent_cuda<float>(logits, tg, N, V, dloss), ref = xent_cpu(logits, tg, N, V, dloss);
    snprintf(what, sizeof what, "%s fp32 losses", tag);
    compare(what, k.loss, ref.loss, TOL_LN_ATOL, TOL_LN_RTOL);
    snprintf(what, sizeof what, "%s fp32 dlogits (in place; masked rows 0)", tag);
    compare(what, k.dl, ref.dl, TOL_LN_ATOL, TOL_LN_RTOL);
    snprintf(what, sizeof what, "%s fp32 losses (dloss 0)", tag);
    compare(what, k.loss0, ref.loss0, TOL_LN_ATOL, TOL_LN_RTOL);
    snprintf(what, sizeof what, "%s fp32 dloss 0 leaves the logits", tag);
    bits(what, k.l0, logits);
    int masked_ok = 1;
    for (int i = 0; i < N; i++)
        if (tg[i] < 0) {
            masked_ok &= k.loss[i] == 0;
            for (int v = 0; v < V; v++) masked_ok &= k.dl[(size_t)i * V + v] == 0;
        }
    CHECK(masked_ok, "%s: a masked row has a nonzero loss or dlogits", tag);

    vecf r = round_bf16(logits);
    XentOut k32 = xent_cuda<float>(r, tg, N, V, dloss), k16 = xent_cuda<bf16>(r, tg, N, V, dloss);
    ref = xent_cpu(r, tg, N, V, dloss);
    snprintf(what, sizeof what, "%s bf16 losses", tag);
    compare(what, k16.loss, ref.loss, TOL_LN_ATOL, TOL_LN_RTOL);
    bits(what, k16.loss, k32.loss);
    snprintf(what, sizeof what, "%s bf16 dlogits", tag);
    compare(what, k16.dl, ref.dl, TOL_LN_ATOL, TOL_LN_RTOL + BF16_RTOL);
    same_bits(what, k16.dl, k32.dl, 1);
}

struct ChunkOut {
    vecf rmax, tlogit, grads;
    std::vector<double> rsum;
};

/* init, stats over the chunks [bounds[c], bounds[c+1]) in turn, then grad over them; each
 * chunk's logits (N, nr) are a copy of the columns of the full (N, V) */
static vecf chunk_of(const vecf &full, int N, int V, int r0, int nr) {
    vecf c((size_t)N * nr);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < nr; j++) c[(size_t)i * nr + j] = full[(size_t)i * V + r0 + j];
    return c;
}
template <class T>
static ChunkOut chunks_run(st_backend *be, const vecf &logits, const std::vector<int32_t> &tg, int N, int V,
                           const std::vector<int> &bounds, float dloss) {
    ChunkOut r = {vecf(N, NAN), vecf(N, NAN), vecf((size_t)N * V, NAN), std::vector<double>(N, NAN)};
    if (be) be->ops->softmax_chunk_init(be, r.rmax.data(), r.rsum.data(), r.tlogit.data(), N);
    else cu_softmax_chunk_init(r.rmax.data(), r.rsum.data(), r.tlogit.data(), N, nullptr);
    for (int pass = 0; pass < 2; pass++)
        for (size_t c = 0; c + 1 < bounds.size(); c++) {
            int r0 = bounds[c], nr = bounds[c + 1] - r0;
            vecf ch = chunk_of(logits, N, V, r0, nr);
            if (be) {
                if (pass == 0)
                    be->ops->softmax_chunk_stats(be, ch.data(), tg.data(), N, nr, r0, r.rmax.data(), r.rsum.data(),
                                                 r.tlogit.data());
                else
                    be->ops->softmax_chunk_grad(be, ch.data(), tg.data(), N, nr, r0, r.rmax.data(), r.rsum.data(),
                                                dloss);
            } else {
                auto s = store<T>(ch);
                if (pass == 0)
                    cu_softmax_chunk_stats<T>(s.data(), tg.data(), N, nr, r0, r.rmax.data(), r.rsum.data(),
                                              r.tlogit.data(), nullptr);
                else
                    cu_softmax_chunk_grad<T>(s.data(), tg.data(), N, nr, r0, r.rmax.data(), r.rsum.data(), dloss,
                                             nullptr);
                ch = load(s);
            }
            if (pass == 1)
                for (int i = 0; i < N; i++)
                    for (int j = 0; j < nr; j++) r.grads[(size_t)i * V + r0 + j] = ch[(size_t)i * nr + j];
        }
    return r;
}

static void test_chunks(int N, int V, std::vector<int> bounds, float scale) {
    vecf logits = randn((size_t)N * V, scale);
    auto tg = make_targets(N, V);
    float dloss = 1.0f / N;
    char tag[128], what[220];
    snprintf(tag, sizeof tag, "softmax_chunk N=%d V=%d %zu chunks", N, V, bounds.size() - 1);

    ChunkOut k = chunks_run<float>(nullptr, logits, tg, N, V, bounds, dloss);
    ChunkOut ref = chunks_run<float>(cpu, logits, tg, N, V, bounds, dloss);
    snprintf(what, sizeof what, "%s fp32 rmax", tag);
    bits(what, k.rmax, ref.rmax);
    snprintf(what, sizeof what, "%s fp32 tlogit", tag);
    bits(what, k.tlogit, ref.tlogit);
    size_t bad = 0, first = 0;
    for (int i = 0; i < N; i++)
        if (!(fabs(k.rsum[i] - ref.rsum[i]) <= TOL_SUM_RTOL * fabs(ref.rsum[i])) && !bad++) first = i;
    CHECK(bad == 0, "%s fp32 rsum: %zu of %d rows differ (first [%zu]: %.17g vs %.17g)", tag, bad, N, first,
          bad ? k.rsum[first] : 0.0, bad ? ref.rsum[first] : 0.0);
    snprintf(what, sizeof what, "%s fp32 dlogits (in place; masked rows 0)", tag);
    compare(what, k.grads, ref.grads, TOL_LN_ATOL, TOL_LN_RTOL);
    /* the chunks' loss is the full cross-entropy's */
    XentOut full = xent_cpu(logits, tg, N, V, dloss);
    vecf loss(N);
    for (int i = 0; i < N; i++) loss[i] = tg[i] < 0 ? 0.0f : (float)(k.rmax[i] + log(k.rsum[i]) - k.tlogit[i]);
    snprintf(what, sizeof what, "%s rmax + log(rsum) - tlogit vs crossentropy's loss", tag);
    compare(what, loss, full.loss, TOL_LN_ATOL, TOL_LN_RTOL);
    snprintf(what, sizeof what, "%s dlogits vs crossentropy's", tag);
    compare(what, k.grads, full.dl, TOL_LN_ATOL, TOL_LN_RTOL);

    vecf r = round_bf16(logits);
    ChunkOut k32 = chunks_run<float>(nullptr, r, tg, N, V, bounds, dloss);
    ChunkOut k16 = chunks_run<bf16>(nullptr, r, tg, N, V, bounds, dloss);
    ref = chunks_run<float>(cpu, r, tg, N, V, bounds, dloss);
    snprintf(what, sizeof what, "%s bf16 rmax, tlogit", tag);
    bits(what, k16.rmax, k32.rmax), bits(what, k16.tlogit, k32.tlogit);
    CHECK(memcmp(k16.rsum.data(), k32.rsum.data(), sizeof(double) * N) == 0, "%s bf16 rsum: not the fp32 kernel's bits",
          tag);
    snprintf(what, sizeof what, "%s bf16 dlogits", tag);
    compare(what, k16.grads, ref.grads, TOL_LN_ATOL, TOL_LN_RTOL + BF16_RTOL);
    same_bits(what, k16.grads, k32.grads, 1);
}

int main(void) {
    emu_setup(15);
    test_crossentropy(2, 1, 1.0f);
    test_crossentropy(7, 37, 3.0f);
    test_crossentropy(9, 300, 10.0f); /* large logits: must not overflow */
    test_crossentropy(5, 1001, 2.0f);
    test_chunks(7, 37, {0, 37}, 3.0f);              /* one chunk: r0 0 */
    test_chunks(9, 300, {0, 100, 101, 300}, 3.0f);  /* a chunk of one row, r0 > 0 */
    test_chunks(5, 1001, {0, 257, 700, 1001}, 10.0f); /* rows the rising max rescales */
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_xent");
}

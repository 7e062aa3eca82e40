/* test_cuda_emu_embed.cpp - the CUDA embedding kernels (src/backend/cuda/kernels_embed.cuh):
 * GPT-2's encoder (token + position) and the Llama family's embedding (token only),
 * forward and backward, fp32 and bf16 storage, run under the CUDA emulation against the
 * CPU backend (cuda_emu/emu_diff.h). The backward must give the CPU's bits in fp32: both
 * add dout's rows into a vocabulary row in token order. Token ids come from a small
 * vocabulary, so ids repeat within and across rows (the first and the last position
 * included); rows of dwte no token names, and rows of dwpe at or past T, keep their
 * values. Widths 1, 33 and 300 (more than the 256 threads of a block: columns loop);
 * more token positions than the 4 blocks of the capped emulated grid. */
#include "backend/cuda/kernels_embed.cuh"
#include "emu_diff.h"

#define TOL_EW_ATOL 1e-6
#define TOL_EW_RTOL 1e-5

typedef __nv_bfloat16 bf16;

struct EmbIn {
    std::vector<int32_t> ids;
    vecf wte, wpe, dout, gwte, gwpe; /* gwte, gwpe: what dwte, dwpe hold before backward */
};
struct EmbOut {
    vecf out, dwte, dwpe;
};

/* a (the kernel's fp32 gradient) == ref (the CPU's), bit for bit */
static void cpu_bits(const char *what, const vecf &a, const vecf &ref) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < a.size(); i++)
        if (memcmp(&a[i], &ref[i], 4) != 0 && !bad++) first = i;
    CHECK(a.size() == ref.size() && bad == 0,
          "%s: differs from the CPU backend's bits in %zu of %zu (first [%zu]: %.9g vs %.9g)", what, bad, a.size(),
          first, bad ? a[first] : 0.0, bad ? ref[first] : 0.0);
}

template <class T> static EmbOut emb_cuda(const EmbIn &in, int B, int T_, int C, int pos) {
    auto wte = store<T>(in.wte), wpe = store<T>(in.wpe), dout = store<T>(in.dout);
    auto out = store<T>(vecf((size_t)B * T_ * C, NAN));
    vecf dwte = in.gwte, dwpe = in.gwpe;
    cu_embed_forward<T>(out.data(), in.ids.data(), wte.data(), pos ? wpe.data() : nullptr, B, T_, C, nullptr);
    cu_embed_backward<T>(dwte.data(), pos ? dwpe.data() : nullptr, dout.data(), in.ids.data(), B, T_, C, nullptr);
    return {load(out), dwte, dwpe};
}

static EmbOut emb_cpu(const EmbIn &in, int B, int T_, int C, int pos) {
    EmbOut r = {vecf((size_t)B * T_ * C, NAN), in.gwte, in.gwpe};
    if (pos) {
        cpu->ops->encoder_forward(cpu, r.out.data(), in.ids.data(), in.wte.data(), in.wpe.data(), B, T_, C);
        cpu->ops->encoder_backward(cpu, r.dwte.data(), r.dwpe.data(), in.dout.data(), in.ids.data(), B, T_, C);
    } else {
        cpu->ops->embedding_forward(cpu, r.out.data(), in.ids.data(), in.wte.data(), B, T_, C);
        cpu->ops->embedding_backward(cpu, r.dwte.data(), in.dout.data(), in.ids.data(), B, T_, C);
    }
    return r;
}

static void test_embed(int B, int T_, int C, int V, int pos) {
    int N = B * T_, P = T_ + 3; /* wpe has rows past T */
    EmbIn in;
    for (int i = 0; i < N; i++) in.ids.push_back((int32_t)(st_rng_u64(&emu_rng) % (uint64_t)(V - 1)));
    in.ids[N - 1] = in.ids[0]; /* the first position's id again at the last */
    in.wte = randn((size_t)V * C, 1), in.wpe = randn((size_t)P * C, 0.5f), in.dout = randn((size_t)N * C, 1);
    in.gwte = randn((size_t)V * C, 1), in.gwpe = randn((size_t)P * C, 1);
    const char *op = pos ? "encoder" : "embedding";
    char tag[128], what[200];
    snprintf(tag, sizeof tag, "%s B=%d T=%d C=%d V=%d", op, B, T_, C, V);

    EmbOut k = emb_cuda<float>(in, B, T_, C, pos), ref = emb_cpu(in, B, T_, C, pos);
    snprintf(what, sizeof what, "%s fp32 out", tag);
    compare(what, k.out, ref.out, TOL_EW_ATOL, TOL_EW_RTOL);
    snprintf(what, sizeof what, "%s fp32 dwte (+=)", tag);
    cpu_bits(what, k.dwte, ref.dwte);
    snprintf(what, sizeof what, "%s fp32 dwpe (+=, rows >= T kept)", tag);
    cpu_bits(what, k.dwpe, ref.dwpe);

    EmbIn r = in;
    r.wte = round_bf16(in.wte), r.wpe = round_bf16(in.wpe), r.dout = round_bf16(in.dout);
    EmbOut k32 = emb_cuda<float>(r, B, T_, C, pos), k16 = emb_cuda<bf16>(r, B, T_, C, pos);
    ref = emb_cpu(r, B, T_, C, pos);
    snprintf(what, sizeof what, "%s bf16 out", tag);
    compare(what, k16.out, ref.out, TOL_EW_ATOL, TOL_EW_RTOL + BF16_RTOL);
    same_bits(what, k16.out, k32.out, 1);
    snprintf(what, sizeof what, "%s bf16 dwte, dwpe", tag);
    cpu_bits(what, k16.dwte, ref.dwte), cpu_bits(what, k16.dwpe, ref.dwpe);
}

int main(void) {
    emu_setup(15);
    for (int pos = 0; pos < 2; pos++) {
        test_embed(2, 5, 1, 4, pos);
        test_embed(3, 7, 33, 9, pos);
        test_embed(2, 9, 300, 13, pos);
        /* more positions than a block has threads: an id's rows span several chunks of the
         * backward's scan (64 threads for C 40, 256 for C 300), ids dense and sparse */
        test_embed(2, 100, 40, 7, pos);
        test_embed(1, 280, 300, 200, pos);
    }
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_embed");
}

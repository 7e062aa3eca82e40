/* test_cuda_emu_attn.cpp - the CUDA flash-style causal attention (src/backend/cuda/
 * kernels_attn.cuh), forward (out, lse) and backward (dq, dk, dv +=, recomputed from lse),
 * fp32 and bf16 storage, run under the CUDA emulation against the CPU backend's
 * attention_forward/_backward (GPT-2's packed qkv), attention_gqa_* and attention_gqa_doc_*
 * (cuda_emu/emu_diff.h; the tolerance is tests/test_ops_diff.c's for attention). q, k, v
 * are one packed [q | k | v] buffer as the models use it. The backward gets the CPU
 * forward's out and lse, so it is checked on its own; in bf16 it gets them rounded as a
 * bf16 forward would store out. Shapes stay tiny (the emulation runs a block's 64
 * threads as threads): T 19 to 40 (tails of the 16-row tiles), head sizes 16, 24 (lanes
 * idle past hs) and 64, groups of 1, 2 and 4 query heads per kv head, documents of
 * several lengths, more tiles than the 4 blocks of the capped emulated grid. */
#include "backend/cuda/kernels_attn.cuh"
#include "emu_diff.h"

#define TOL_ATT_ATOL 3e-5
#define TOL_ATT_RTOL 3e-4

typedef __nv_bfloat16 bf16;

struct AttCase {
    int B, T, NH, NKV, hs;
    int gpt2; /* the reference is attention_forward/_backward (NKV = NH, ld = 3C) */
    int docs; /* documents: doc_start from lengths 7, 1, 20, 3, ... */
    int ld() const { return (NH + 2 * NKV) * hs; }
    size_t nbuf() const { return (size_t)B * T * ld(); }
    size_t nout() const { return (size_t)B * T * NH * hs; }
    size_t nlse() const { return (size_t)B * NH * T; }
};

struct AttIn {
    vecf qkv, dout, out, lse, g; /* out, lse: the backward's inputs; g: what dqkv holds before */
    std::vector<int32_t> ds;
};

template <class T> static void att_fwd_cuda(const AttCase &c, const AttIn &in, vecf *out, vecf *lse) {
    auto buf = store<T>(in.qkv);
    auto o = store<T>(vecf(c.nout(), NAN));
    vecf l(c.nlse(), NAN);
    const T *q = buf.data(), *k = q + c.NH * c.hs, *v = k + c.NKV * c.hs;
    cu_attn_forward<T>(o.data(), l.data(), q, k, v, c.docs ? in.ds.data() : nullptr, c.ld(), c.B, c.T, c.NH, c.NKV,
                       c.hs, nullptr);
    *out = load(o), *lse = l;
}

template <class T> static vecf att_bwd_cuda(const AttCase &c, const AttIn &in) {
    auto buf = store<T>(in.qkv), d = store<T>(in.g), dout = store<T>(in.dout), out = store<T>(in.out);
    int qo = c.NH * c.hs, ko = qo + c.NKV * c.hs;
    cu_attn_backward<T>(d.data(), d.data() + qo, d.data() + ko, dout.data(), buf.data(), buf.data() + qo,
                        buf.data() + ko, out.data(), in.lse.data(), c.docs ? in.ds.data() : nullptr, c.ld(), c.B,
                        c.T, c.NH, c.NKV, c.hs, nullptr);
    return load(d);
}

static void att_fwd_cpu(const AttCase &c, const AttIn &in, vecf *out, vecf *lse) {
    *out = vecf(c.nout(), NAN), *lse = vecf(c.nlse(), NAN);
    const float *q = in.qkv.data(), *k = q + c.NH * c.hs, *v = k + c.NKV * c.hs;
    if (c.gpt2 && c.docs)
        cpu->ops->attention_doc_forward(cpu, out->data(), lse->data(), q, in.ds.data(), c.B, c.T, c.NH * c.hs, c.NH);
    else if (c.gpt2)
        cpu->ops->attention_forward(cpu, out->data(), lse->data(), q, c.B, c.T, c.NH * c.hs, c.NH);
    else if (c.docs)
        cpu->ops->attention_gqa_doc_forward(cpu, out->data(), lse->data(), q, k, v, in.ds.data(), c.ld(), c.B, c.T,
                                            c.NH, c.NKV, c.hs);
    else
        cpu->ops->attention_gqa_forward(cpu, out->data(), lse->data(), q, k, v, c.ld(), c.B, c.T, c.NH, c.NKV, c.hs);
}

static vecf att_bwd_cpu(const AttCase &c, const AttIn &in) {
    vecf d = in.g;
    int qo = c.NH * c.hs, ko = qo + c.NKV * c.hs;
    const float *q = in.qkv.data();
    if (c.gpt2 && c.docs)
        cpu->ops->attention_doc_backward(cpu, d.data(), in.dout.data(), q, in.out.data(), in.lse.data(),
                                         in.ds.data(), c.B, c.T, c.NH * c.hs, c.NH);
    else if (c.gpt2)
        cpu->ops->attention_backward(cpu, d.data(), in.dout.data(), q, in.out.data(), in.lse.data(), c.B, c.T,
                                     c.NH * c.hs, c.NH);
    else if (c.docs)
        cpu->ops->attention_gqa_doc_backward(cpu, d.data(), d.data() + qo, d.data() + ko, in.dout.data(), q, q + qo,
                                             q + ko, in.out.data(), in.lse.data(), in.ds.data(), c.ld(), c.B, c.T,
                                             c.NH, c.NKV, c.hs);
    else
        cpu->ops->attention_gqa_backward(cpu, d.data(), d.data() + qo, d.data() + ko, in.dout.data(), q, q + qo,
                                         q + ko, in.out.data(), in.lse.data(), c.ld(), c.B, c.T, c.NH, c.NKV, c.hs);
    return d;
}

static void test_attention(const AttCase &c) {
    char tag[160], what[220];
    snprintf(tag, sizeof tag, "%s B=%d T=%d NH=%d NKV=%d hs=%d%s", c.gpt2 ? "attention" : "attention_gqa", c.B, c.T,
             c.NH, c.NKV, c.hs, c.docs ? " documents" : "");
    AttIn in;
    in.qkv = randn(c.nbuf(), 1), in.dout = randn(c.nout(), 1), in.g = randn(c.nbuf(), 1);
    int lens[] = {7, 1, 20, 3, 12};
    for (int b = 0; b < c.B; b++)
        for (int t = 0, d = b, start = 0; t < c.T; t++) {
            if (t - start == lens[d % 5]) start = t, d++;
            in.ds.push_back(start);
        }

    /* fp32 */
    vecf out, lse;
    att_fwd_cpu(c, in, &in.out, &in.lse);
    att_fwd_cuda<float>(c, in, &out, &lse);
    snprintf(what, sizeof what, "%s fp32 out", tag);
    compare(what, out, in.out, TOL_ATT_ATOL, TOL_ATT_RTOL);
    snprintf(what, sizeof what, "%s fp32 lse", tag);
    compare(what, lse, in.lse, TOL_ATT_ATOL, TOL_ATT_RTOL);
    snprintf(what, sizeof what, "%s fp32 dq|dk|dv (+=)", tag);
    compare(what, att_bwd_cuda<float>(c, in), att_bwd_cpu(c, in), TOL_ATT_ATOL, TOL_ATT_RTOL);

    /* bf16: rounded inputs; the backward's out as a bf16 forward stores it */
    AttIn r = in;
    r.qkv = round_bf16(in.qkv), r.dout = round_bf16(in.dout), r.g = round_bf16(in.g);
    att_fwd_cpu(c, r, &r.out, &r.lse);
    vecf o32, l32, o16, l16;
    att_fwd_cuda<float>(c, r, &o32, &l32);
    att_fwd_cuda<bf16>(c, r, &o16, &l16);
    snprintf(what, sizeof what, "%s bf16 out", tag);
    compare(what, o16, r.out, TOL_ATT_ATOL, TOL_ATT_RTOL + BF16_RTOL);
    same_bits(what, o16, o32, 1);
    snprintf(what, sizeof what, "%s bf16 lse", tag);
    compare(what, l16, r.lse, TOL_ATT_ATOL, TOL_ATT_RTOL);
    same_bits(what, l16, l32, 0);
    r.out = round_bf16(r.out);
    vecf g16 = att_bwd_cuda<bf16>(c, r), g32 = att_bwd_cuda<float>(c, r);
    snprintf(what, sizeof what, "%s bf16 dq|dk|dv (+=)", tag);
    compare(what, g16, att_bwd_cpu(c, r), TOL_ATT_ATOL, TOL_ATT_RTOL + BF16_RTOL);
    same_bits(what, g16, g32, 1);
}

int main(void) {
    emu_setup(15);
    AttCase cases[] = {
        {1, 19, 2, 2, 16, 1, 0}, /* GPT-2's packed qkv */
        {2, 37, 4, 2, 24, 0, 0}, /* GQA, groups of 2; 24 of 32 lanes hold a head element */
        {1, 40, 4, 1, 64, 0, 1}, /* multi-query, documents */
        {2, 21, 2, 2, 16, 1, 1}, /* GPT-2 with documents */
    };
    for (auto &c : cases) test_attention(c);
    st_backend_free(cpu);
    return test_finish("test_cuda_emu_attn");
}

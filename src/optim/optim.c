/* optim.c - the optimizer engine's front: segments, state buffers, the work list, kernel
 * dispatch, the non-finite check and the deterministic gradient sum of squares.
 *
 * The work is a fixed list of chunks (each inside one segment, a whole number of 8-bit
 * blocks), split over OpenMP threads; every element's update depends only on its own
 * data, so a step gives the same bits for any thread count.
 */
#include "strata/optim.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "optim/adamw_kernels.h"

_Static_assert(ST_OPTIM_CHUNK_ELEMS % ST_OPTIM_Q8_BLOCK == 0, "an optimizer chunk holds whole 8-bit blocks");

typedef struct optim_chunk {
    int seg;
    size_t start, n; /* elements from the segment's start */
} optim_chunk;

struct st_optim {
    st_optim_segment *segs;
    int n_segs;
    size_t numel;
    st_optim_state_format fmt;
    float *m, *v;           /* fp32: indexed by flat element */
    uint8_t *qm, *qv;       /* 8-bit: each segment starts at a block boundary */
    float *am, *av;         /* 8-bit: absmax per block */
    size_t qbytes, nblocks;
    size_t *seg_q, *seg_blk; /* 8-bit: a segment's first byte and first block */
    optim_chunk *chunks;
    int n_chunks;
    int *chunk_first;        /* n_segs + 1 entries: the chunks of segment s */
    const adamw_kernels *kern;
    st_optim_isa isa;
    q8_tables q8;
    long skipped;
    int unbound;             /* the state lives in caller buffers (st_optim_bind_state) */
};

/* ---- dispatch ---- */

/* STRATA_OPTIM_ISA (portable, avx2, avx512, avx512bf16 or auto) caps the kernels this CPU
 * offers, e.g. to measure the AVX2 kernels on an AVX-512 machine; read once per process.
 * 0: not read yet, -1: unset or auto, -2: not a kernel set (st_optim_create refuses). */
static int isa_env_cap(void) {
    static _Atomic int cap = 0;
    int c = atomic_load(&cap);
    if (c) return c;
    const char *e = getenv("STRATA_OPTIM_ISA");
    if (!e || !*e || !strcmp(e, "auto")) c = -1;
    else if (!strcmp(e, "portable")) c = ST_OPTIM_ISA_PORTABLE;
    else if (!strcmp(e, "avx2")) c = ST_OPTIM_ISA_AVX2;
    else if (!strcmp(e, "avx512")) c = ST_OPTIM_ISA_AVX512;
    else if (!strcmp(e, "avx512bf16")) c = ST_OPTIM_ISA_AVX512_BF16;
    else c = -2;
    atomic_store(&cap, c);
    return c;
}

static st_optim_isa isa_cpu_best(void) {
    /* BW: the float map packs its codes with byte packs (every AVX-512 Xeon has it) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return __builtin_cpu_supports("avx512bf16") ? ST_OPTIM_ISA_AVX512_BF16 : ST_OPTIM_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ST_OPTIM_ISA_AVX2;
    return ST_OPTIM_ISA_PORTABLE;
}

st_optim_isa st_optim_isa_best(void) {
    st_optim_isa best = isa_cpu_best();
    int cap = isa_env_cap();
    return cap > 0 && cap < (int)best ? (st_optim_isa)cap : best;
}

const char *st_optim_isa_name(st_optim_isa isa) {
    switch (isa) {
    case ST_OPTIM_ISA_AUTO: return "auto";
    case ST_OPTIM_ISA_PORTABLE: return "portable";
    case ST_OPTIM_ISA_AVX2: return "avx2";
    case ST_OPTIM_ISA_AVX512: return "avx512";
    case ST_OPTIM_ISA_AVX512_BF16: return "avx512bf16";
    }
    return "unknown";
}

static const adamw_kernels *kernels_for(st_optim_isa isa) {
    switch (isa) {
    case ST_OPTIM_ISA_AVX512_BF16: return &adamw_kernels_avx512bf16;
    case ST_OPTIM_ISA_AVX512: return &adamw_kernels_avx512;
    case ST_OPTIM_ISA_AVX2: return &adamw_kernels_avx2;
    default: return &adamw_kernels_portable;
    }
}

st_status st_optim_set_isa(st_optim *o, st_optim_isa isa, st_err *err) {
    st_optim_isa best = st_optim_isa_best();
    if (isa == ST_OPTIM_ISA_AUTO) isa = best;
    if (isa < ST_OPTIM_ISA_PORTABLE || isa > ST_OPTIM_ISA_AVX512_BF16)
        return st_errf(err, ST_ERR_INVALID, "optimizer: unknown kernel set %d", (int)isa);
    if (isa > best)
        return st_errf(err, ST_ERR_UNSUPPORTED, "optimizer: this CPU cannot run the %s kernels (best: %s)",
                       st_optim_isa_name(isa), st_optim_isa_name(best));
    o->isa = isa;
    o->kern = kernels_for(isa);
    /* the SIMD quantisers of the dynamic map need the inverse tables (every map's are; tests check) */
    if (o->fmt == ST_OPTIM_STATE_8BIT && !(o->q8.s.inv_ok && o->q8.u.inv_ok)) o->kern = &adamw_kernels_portable;
    return ST_OK;
}

st_optim_isa st_optim_get_isa(const st_optim *o) { return o->isa; }

/* ---- create / free ---- */

static int seg_cmp(const void *a, const void *b) {
    const st_optim_segment *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static st_status create_impl(st_optim **out, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, int unbound,
                             st_err *err);

st_status st_optim_create(st_optim **out, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt,
                       st_err *err) {
    return create_impl(out, segs, n_segs, fmt, 0, err);
}

st_status st_optim_create_unbound(st_optim **out, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt,
                               st_err *err) {
    return create_impl(out, segs, n_segs, fmt, 1, err);
}

static st_status create_impl(st_optim **out, const st_optim_segment *segs, int n_segs, st_optim_state_format fmt, int unbound,
                             st_err *err) {
    *out = NULL;
    if (n_segs <= 0) return st_errf(err, ST_ERR_INVALID, "optimizer: no parameter segments");
    if (isa_env_cap() == -2)
        return st_errf(err, ST_ERR_INVALID, "optimizer: STRATA_OPTIM_ISA=%s is not a kernel set; use portable, "
                       "avx2, avx512, avx512bf16 or auto (or unset it)", getenv("STRATA_OPTIM_ISA"));
    if (fmt != ST_OPTIM_STATE_F32 && fmt != ST_OPTIM_STATE_8BIT && fmt != ST_OPTIM_STATE_8BIT_FP)
        return st_errf(err, ST_ERR_INVALID, "optimizer: unknown state format %d (use f32, 8bit or 8bit-fp)", (int)fmt);
    /* overlapping segments would update an element twice */
    st_optim_segment *sorted = malloc(sizeof *segs * (size_t)n_segs);
    if (!sorted) return st_errf(err, ST_ERR_NOMEM, "optimizer: out of memory");
    memcpy(sorted, segs, sizeof *segs * (size_t)n_segs);
    qsort(sorted, (size_t)n_segs, sizeof *sorted, seg_cmp);
    for (int i = 1; i < n_segs; i++)
        if (sorted[i - 1].offset + sorted[i - 1].n > sorted[i].offset) {
            size_t a = sorted[i - 1].offset, b = sorted[i].offset;
            free(sorted);
            return st_errf(err, ST_ERR_INVALID,
                           "optimizer: parameter segments at elements %zu and %zu overlap; each element "
                           "must belong to one segment", a, b);
        }
    free(sorted);
    for (int i = 0; i < n_segs; i++)
        if (segs[i].lr_class != ST_OPTIM_LR_MAIN && segs[i].lr_class != ST_OPTIM_LR_SECOND)
            return st_errf(err, ST_ERR_INVALID, "optimizer: segment %d (element %zu) has learning-rate class %d; "
                           "use %d (lr) or %d (lr2)", i, segs[i].offset, segs[i].lr_class, ST_OPTIM_LR_MAIN,
                           ST_OPTIM_LR_SECOND);

    st_optim *o = calloc(1, sizeof *o);
    if (!o) return st_errf(err, ST_ERR_NOMEM, "optimizer: out of memory");
    o->segs = malloc(sizeof *segs * (size_t)n_segs);
    o->seg_q = calloc((size_t)n_segs + 1, sizeof *o->seg_q);
    o->seg_blk = calloc((size_t)n_segs + 1, sizeof *o->seg_blk);
    o->chunk_first = calloc((size_t)n_segs + 1, sizeof *o->chunk_first);
    if (!o->segs || !o->seg_q || !o->seg_blk || !o->chunk_first) {
        st_optim_free(o);
        return st_errf(err, ST_ERR_NOMEM, "optimizer: out of memory");
    }
    memcpy(o->segs, segs, sizeof *segs * (size_t)n_segs);
    o->n_segs = n_segs;
    o->fmt = fmt;
    size_t nchunks = 0;
    for (int i = 0; i < n_segs; i++) {
        size_t end = segs[i].offset + segs[i].n;
        if (end > o->numel) o->numel = end;
        size_t blocks = (segs[i].n + Q8_BLOCK - 1) / Q8_BLOCK;
        o->seg_blk[i + 1] = o->seg_blk[i] + blocks;
        o->seg_q[i + 1] = o->seg_q[i] + blocks * Q8_BLOCK;
        o->chunk_first[i] = (int)nchunks;
        nchunks += (segs[i].n + ST_OPTIM_CHUNK_ELEMS - 1) / ST_OPTIM_CHUNK_ELEMS;
    }
    o->chunk_first[n_segs] = (int)nchunks;
    o->n_chunks = (int)nchunks;
    o->chunks = malloc(sizeof *o->chunks * (nchunks ? nchunks : 1));
    if (!o->chunks) {
        st_optim_free(o);
        return st_errf(err, ST_ERR_NOMEM, "optimizer: out of memory");
    }
    for (int i = 0, c = 0; i < n_segs; i++)
        for (size_t s = 0; s < segs[i].n; s += ST_OPTIM_CHUNK_ELEMS, c++)
            o->chunks[c] = (optim_chunk){i, s, segs[i].n - s < ST_OPTIM_CHUNK_ELEMS ? segs[i].n - s : ST_OPTIM_CHUNK_ELEMS};

    size_t want;
    o->unbound = unbound;
    o->nblocks = o->seg_blk[n_segs];
    o->qbytes = o->seg_q[n_segs];
    if (unbound) {
        /* no state of its own: st_optim_bind_state points it at the caller's buffers */
    } else if (fmt == ST_OPTIM_STATE_F32) {
        want = 2 * o->numel * sizeof(float);
        o->m = st_alloc(o->numel * sizeof(float) + 64);
        o->v = st_alloc(o->numel * sizeof(float) + 64);
        if (!o->m || !o->v) goto nomem;
    } else {
        want = 2 * o->qbytes + 2 * o->nblocks * sizeof(float);
        o->qm = st_alloc(o->qbytes + 64);
        o->qv = st_alloc(o->qbytes + 64);
        o->am = st_alloc(o->nblocks * sizeof(float) + 64);
        o->av = st_alloc(o->nblocks * sizeof(float) + 64);
        if (!o->qm || !o->qv || !o->am || !o->av) goto nomem;
    }
    q8_tables_init(&o->q8);
    st_optim_set_isa(o, ST_OPTIM_ISA_AUTO, NULL);
    *out = o;
    return ST_OK;
nomem:
    st_optim_free(o);
    return st_errf(err, ST_ERR_NOMEM, "optimizer: cannot allocate %zu bytes of moments; use 8-bit states "
                   "or fewer parameters per rank", want);
}

void st_optim_free(st_optim *o) {
    if (!o) return;
    if (!o->unbound) {
        st_free(o->m);
        st_free(o->v);
        st_free(o->qm);
        st_free(o->qv);
        st_free(o->am);
        st_free(o->av);
    }
    free(o->segs);
    free(o->seg_q);
    free(o->seg_blk);
    free(o->chunk_first);
    free(o->chunks);
    free(o);
}

size_t st_optim_numel(const st_optim *o) { return o->numel; }
int st_optim_segment_count(const st_optim *o) { return o->n_segs; }
st_optim_state_format st_optim_format(const st_optim *o) { return o->fmt; }
long st_optim_skipped_steps(const st_optim *o) { return o->skipped; }

/* ---- the reference ---- */

void st_adamw_ref_f32(float *p, const float *g, float *m, float *v, size_t n, float wd,
                   const st_adamw_params *hp) {
    float b1 = hp->beta1, b2 = hp->beta2;
    float bc1 = 1.0f - powf(b1, (float)hp->step), bc2 = 1.0f - powf(b2, (float)hp->step);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * hp->grad_scale;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= hp->lr * (mhat / (sqrtf(vhat) + hp->eps) + wd * p[i]);
    }
}

/* ---- the step ---- */

static adamw_consts consts_make(const st_adamw_params *hp, float lr) {
    /* in double: beta2^step and the folded products lose float precision otherwise */
    double s = hp->grad_scale, t = (double)hp->step;
    adamw_consts k;
    k.b1 = hp->beta1;
    k.c1 = (float)((1.0 - (double)hp->beta1) * s);
    k.b2 = hp->beta2;
    k.c2 = (float)((1.0 - (double)hp->beta2) * s * s);
    double bc1 = 1.0 - pow(hp->beta1, t), bc2 = 1.0 - pow(hp->beta2, t);
    k.sd = (float)(bc1 / sqrt(bc2));
    k.epsd = (float)(bc1 * hp->eps);
    k.nlr = -lr;
    return k;
}

/* The pointers of chunk ci for buffers whose element 0 is flat element base. */
static adamw_chunk chunk_make(const st_optim *o, int ci, const st_optim_step_args *a, size_t gs, size_t ws) {
    const optim_chunk *ch = &o->chunks[ci];
    const st_optim_segment *sg = &o->segs[ch->seg];
    size_t rel = sg->offset + ch->start - a->base;
    adamw_chunk c = {0};
    c.p = a->params + rel;
    c.g = (const char *)a->grads + rel * gs;
    c.w = a->work ? (char *)a->work + rel * ws : NULL;
    c.n = ch->n;
    c.wd = sg->weight_decay;
    if (o->fmt == ST_OPTIM_STATE_F32) {
        c.m = o->m + sg->offset + ch->start;
        c.v = o->v + sg->offset + ch->start;
    } else {
        c.qm = o->qm + o->seg_q[ch->seg] + ch->start;
        c.qv = o->qv + o->seg_q[ch->seg] + ch->start;
        c.am = o->am + o->seg_blk[ch->seg] + ch->start / Q8_BLOCK;
        c.av = o->av + o->seg_blk[ch->seg] + ch->start / Q8_BLOCK;
    }
    return c;
}

static st_status check_args(const st_optim *o, const st_optim_step_args *a, int *s0, int *s1, st_err *err) {
    *s0 = a->seg_begin;
    *s1 = a->seg_end == 0 ? o->n_segs : a->seg_end;
    if (*s0 < 0 || *s1 > o->n_segs || *s0 >= *s1)
        return st_errf(err, ST_ERR_INVALID, "optimizer: segment range [%d, %d) is not inside [0, %d)",
                       a->seg_begin, a->seg_end, o->n_segs);
    if (!a->params || !a->grads)
        return st_errf(err, ST_ERR_INVALID, "optimizer: params and grads are required");
    if (a->grad_dtype != ST_F32 && a->grad_dtype != ST_BF16 && a->grad_dtype != ST_F16)
        return st_errf(err, ST_ERR_INVALID, "optimizer: gradient dtype %s is not supported (use F32, BF16 or F16)",
                       st_dtype_name(a->grad_dtype));
    if (a->work && a->work_dtype != ST_F32 && a->work_dtype != ST_BF16 && a->work_dtype != ST_F16)
        return st_errf(err, ST_ERR_INVALID, "optimizer: working-copy dtype %s is not supported (use F32, BF16 or F16)",
                       st_dtype_name(a->work_dtype));
    for (int s = *s0; s < *s1; s++)
        if (o->segs[s].offset < a->base)
            return st_errf(err, ST_ERR_INVALID,
                           "optimizer: segment %d starts at element %zu, before the buffers' base %zu",
                           s, o->segs[s].offset, a->base);
    return ST_OK;
}

st_status st_optim_step_ex(st_optim *o, const st_optim_step_args *a, const st_adamw_params *hp, st_err *err) {
    int s0, s1;
    st_status st = check_args(o, a, &s0, &s1, err);
    if (st != ST_OK) return st;
    if (o->unbound && !(o->m || o->qm))
        return st_errf(err, ST_ERR_INVALID, "optimizer: no state buffers bound (st_optim_bind_state)");
    if (hp->step < 1)
        return st_errf(err, ST_ERR_INVALID, "optimizer: step number %ld; steps count from 1", hp->step);
    size_t gs = st_dtype_size(a->grad_dtype), ws = a->work ? st_dtype_size(a->work_dtype) : 0;
    double ss = a->grad_sumsq;
    if (ss < 0) {
        ss = 0;
        for (int s = s0; s < s1; s++)
            ss += st_optim_grad_sumsq((const char *)a->grads + (o->segs[s].offset - a->base) * gs, a->grad_dtype,
                                   o->segs[s].n);
    }
    if (!isfinite(ss)) {
        o->skipped++;
        return st_errf(err, ST_ERR_NONFINITE,
                       "optimizer: gradient is not finite (sum of squares %g); step %ld skipped, no state "
                       "changed; lower the loss scale or check the data", ss, hp->step);
    }
    /* one set of constants per learning-rate class; they differ only in nlr */
    const adamw_consts k[2] = {consts_make(hp, hp->lr), consts_make(hp, hp->lr2)};
    const adamw_kernels *kern = o->kern;
    int gdt = a->grad_dtype, wdt = a->work ? (int)a->work_dtype : WORK_NONE;
    int c0 = o->chunk_first[s0], c1 = o->chunk_first[s1];
    int q8 = o->fmt == ST_OPTIM_STATE_8BIT, q8f = o->fmt == ST_OPTIM_STATE_8BIT_FP;
#pragma omp parallel for schedule(static)
    for (int ci = c0; ci < c1; ci++) {
        adamw_chunk c = chunk_make(o, ci, a, gs, ws);
        const adamw_consts *kc = &k[o->segs[o->chunks[ci].seg].lr_class];
        if (q8) kern->step_q8(&c, kc, &o->q8, gdt, wdt);
        else if (q8f) kern->step_q8f(&c, kc, &o->q8, gdt, wdt);
        else kern->step_f32(&c, kc, gdt, wdt);
    }
    return ST_OK;
}

void st_optim_step(st_optim *o, float *params, const float *grads, const st_adamw_params *hp) {
    st_optim_step_args a = {.params = params, .grads = grads, .grad_dtype = ST_F32, .grad_sumsq = -1};
    st_err err = {0};
    if (st_optim_step_ex(o, &a, hp, &err) != ST_OK) st_log(1, "warning: %s\n", err.msg);
}

void st_optim_bench_ceiling(st_optim *o, const st_optim_step_args *a) {
    int s0, s1;
    if (check_args(o, a, &s0, &s1, NULL) != ST_OK) return;
    size_t gs = st_dtype_size(a->grad_dtype), ws = a->work ? st_dtype_size(a->work_dtype) : 0;
    int gdt = a->grad_dtype, wdt = a->work ? (int)a->work_dtype : WORK_NONE;
    int c0 = o->chunk_first[s0], c1 = o->chunk_first[s1], q8 = o->fmt != ST_OPTIM_STATE_F32;
    const adamw_kernels *kern = o->kern;
#pragma omp parallel for schedule(static)
    for (int ci = c0; ci < c1; ci++) {
        adamw_chunk c = chunk_make(o, ci, a, gs, ws);
        kern->ceiling(&c, q8, gdt, wdt);
    }
}

float st_optim_clip_scale(double sumsq, float loss_scale, float max_norm) {
    double ls = loss_scale > 0 ? loss_scale : 1.0;
    double norm = sqrt(sumsq) / ls;
    double clip = max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
    return (float)(clip / ls);
}

/* ---- state buffers ---- */

const char *st_optim_state_name(st_optim_state_format fmt) {
    return fmt == ST_OPTIM_STATE_F32 ? "f32" : fmt == ST_OPTIM_STATE_8BIT ? "8bit" : fmt == ST_OPTIM_STATE_8BIT_FP ? "8bit-fp" : "?";
}

int st_optim_state_count(const st_optim *o) { return o->fmt == ST_OPTIM_STATE_F32 ? 2 : 4; }

size_t st_optim_state_buffer_bytes(const st_optim *o, int i) {
    if (i < 0 || i >= st_optim_state_count(o)) return 0;
    if (o->fmt == ST_OPTIM_STATE_F32) return o->numel * sizeof(float);
    return i < 2 ? o->qbytes : o->nblocks * sizeof(float);
}

void st_optim_bind_state(st_optim *o, void *const bufs[]) {
    if (!o->unbound) return;
    if (o->fmt == ST_OPTIM_STATE_F32) {
        o->m = bufs[0];
        o->v = bufs[1];
    } else {
        o->qm = bufs[0];
        o->qv = bufs[1];
        o->am = bufs[2];
        o->av = bufs[3];
    }
}

void *st_optim_state_buffer(st_optim *o, int i, size_t *bytes) {
    *bytes = 0;
    if (o->fmt == ST_OPTIM_STATE_F32) {
        if (i < 0 || i > 1) return NULL;
        *bytes = o->numel * sizeof(float);
        return i == 0 ? (void *)o->m : (void *)o->v;
    }
    switch (i) {
    case 0: *bytes = o->qbytes; return o->qm;
    case 1: *bytes = o->qbytes; return o->qv;
    case 2: *bytes = o->nblocks * sizeof(float); return o->am;
    case 3: *bytes = o->nblocks * sizeof(float); return o->av;
    default: return NULL;
    }
}

st_status st_optim_reset_class(st_optim *o, int lr_class, size_t *n_reset, st_err *err) {
    if (n_reset) *n_reset = 0;
    if (lr_class != ST_OPTIM_LR_MAIN && lr_class != ST_OPTIM_LR_SECOND)
        return st_errf(err, ST_ERR_INVALID, "optimizer: learning-rate class %d is not %d or %d", lr_class,
                       ST_OPTIM_LR_MAIN, ST_OPTIM_LR_SECOND);
    if (!(o->m || o->qm))
        return st_errf(err, ST_ERR_INVALID, "optimizer: no state to reset (unbound, no buffers bound)");
    for (int i = 0; i < o->n_segs; i++) {
        const st_optim_segment *sg = &o->segs[i];
        if (sg->lr_class != lr_class) continue;
        if (o->fmt == ST_OPTIM_STATE_F32) {
            memset(o->m + sg->offset, 0, sg->n * sizeof(float));
            memset(o->v + sg->offset, 0, sg->n * sizeof(float));
        } else { /* the segment's whole blocks: all zero bytes, absmax 0 (a fresh state) */
            size_t q0 = o->seg_q[i], nq = o->seg_q[i + 1] - q0, b0 = o->seg_blk[i], nb = o->seg_blk[i + 1] - b0;
            memset(o->qm + q0, 0, nq);
            memset(o->qv + q0, 0, nq);
            memset(o->am + b0, 0, nb * sizeof(float));
            memset(o->av + b0, 0, nb * sizeof(float));
        }
        if (n_reset) *n_reset += sg->n;
    }
    return ST_OK;
}

double st_optim_state_bytes_per_param(const st_optim *o) {
    if (o->fmt == ST_OPTIM_STATE_F32) return 8.0;
    return o->numel ? (double)(2 * o->qbytes + 2 * o->nblocks * sizeof(float)) / (double)o->numel : 0.0;
}

double st_optim_step_bytes_per_param(const st_optim *o, st_dtype grad_dtype, int work_dtype) {
    double g = (double)st_dtype_size(grad_dtype), w = work_dtype < 0 ? 0.0 : (double)st_dtype_size((st_dtype)work_dtype);
    /* master weight read + written, gradient read, working copy written, moments read + written */
    double moments = o->fmt == ST_OPTIM_STATE_F32 ? 2 * 2 * 4.0 : 2 * 2 * 1.0 + 2 * 2 * 4.0 / Q8_BLOCK;
    return 2 * 4.0 + g + w + moments;
}

/* ---- gradient sum of squares ---- */

/* Each part's lanes combined pairwise in a fixed tree, then the parts the same way; chunk
 * partials are then added in chunk order. */
static double lanes_total(double *l) {
    double part[SUMSQ_PARTS];
    for (int s = 0; s < SUMSQ_PARTS; s++) {
        double *x = l + s * SUMSQ_LANES;
        for (int w = SUMSQ_LANES / 2; w >= 1; w /= 2)
            for (int i = 0; i < w; i++) x[i] = x[i] + x[i + w];
        part[s] = x[0];
    }
    for (int w = SUMSQ_PARTS / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) part[i] = part[i] + part[i + w];
    return part[0];
}

size_t st_optim_grad_sumsq_parts(const void *g, st_dtype dt, size_t n, double *part) {
    const adamw_kernels *kern = kernels_for(st_optim_isa_best());
    size_t es = st_dtype_size(dt);
    long nchunks = (long)((n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK);
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (long c = 0; c < nchunks; c++) {
        size_t lo = (size_t)c * SUMSQ_CHUNK, hi = lo + SUMSQ_CHUNK < n ? lo + SUMSQ_CHUNK : n;
        double lanes[SUMSQ_PARTS * SUMSQ_LANES] = {0};
        kern->sumsq((const char *)g + lo * es, dt, hi - lo, lanes);
        part[c] = lanes_total(lanes);
    }
    return (size_t)nchunks;
}

double st_optim_grad_sumsq(const void *g, st_dtype dt, size_t n) {
    if (dt != ST_F32 && dt != ST_BF16 && dt != ST_F16) return NAN;
    size_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double stackbuf[64], *part = nchunks <= 64 ? stackbuf : malloc(sizeof(double) * nchunks);
    if (!part) return NAN;
    st_optim_grad_sumsq_parts(g, dt, n, part);
    double total = 0;
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    if (part != stackbuf) free(part);
    return total;
}

double st_optim_grad_sumsq_f32(const float *g, size_t n) { return st_optim_grad_sumsq(g, ST_F32, n); }
double st_optim_grad_sumsq_bf16(const uint16_t *g, size_t n) { return st_optim_grad_sumsq(g, ST_BF16, n); }

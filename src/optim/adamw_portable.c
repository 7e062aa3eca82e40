/* adamw_portable.c - the optimizer kernels in plain C, for CPUs without AVX2+FMA.
 *
 * Element by element, the definitions in adamw_kernels.h; the SIMD kernels must agree
 * with these bit for bit (tests/test_optim_kernels.c checks it).
 */
#include <string.h>

#include "optim/adamw_kernels.h"

static void portable_step_f32(const adamw_chunk *c, const adamw_consts *k, int gdt, int wdt) {
    for (size_t i = 0; i < c->n; i++) {
        adamw_elem(&c->p[i], &c->m[i], &c->v[i], adamw_load_grad(c->g, gdt, i), k, c->wd);
        adamw_store_work(c->w, wdt, i, c->p[i]);
    }
}

static void portable_quant(const float *x, size_t n, float inv, const q8_map *q, int is_signed,
                           uint8_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = q8_quant_elem(x[i], inv, q, is_signed);
}

static void portable_quantf(const float *x, size_t n, float inv, int is_signed, uint8_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = q8f_quant_elem(x[i], inv, is_signed);
}

/* fp: the float map (codes q->fs / q->fu) instead of the dynamic map */
static void portable_q8(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, int gdt, int wdt, int fp) {
    float mb[Q8_BLOCK], vb[Q8_BLOCK];
    const float *ds = fp ? q->fs : q->s.dec, *du = fp ? q->fu : q->u.dec;
    for (size_t off = 0, blk = 0; off < c->n; off += Q8_BLOCK, blk++) {
        size_t nb = c->n - off < Q8_BLOCK ? c->n - off : Q8_BLOCK;
        float am = c->am[blk], av = c->av[blk], mmax = 0, vmax = 0;
        for (size_t i = 0; i < nb; i++) {
            float m = ds[c->qm[off + i]] * am, v = du[c->qv[off + i]] * av;
            adamw_elem(&c->p[off + i], &m, &v, adamw_load_grad(c->g, gdt, off + i), k, c->wd);
            adamw_store_work(c->w, wdt, off + i, c->p[off + i]);
            mb[i] = m;
            vb[i] = v;
            mmax = fmaxf(mmax, fabsf(m));
            vmax = fmaxf(vmax, v); /* v >= 0 */
        }
        c->am[blk] = mmax;
        c->av[blk] = vmax;
        float im = mmax > 0 ? 1.0f / mmax : 0.0f, iv = vmax > 0 ? 1.0f / vmax : 0.0f;
        if (fp) {
            portable_quantf(mb, nb, im, 1, c->qm + off);
            portable_quantf(vb, nb, iv, 0, c->qv + off);
        } else {
            portable_quant(mb, nb, im, &q->s, 1, c->qm + off);
            portable_quant(vb, nb, iv, &q->u, 0, c->qv + off);
        }
    }
}

static void portable_step_q8(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, int gdt, int wdt) {
    portable_q8(c, k, q, gdt, wdt, 0);
}

static void portable_step_q8f(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, int gdt, int wdt) {
    portable_q8(c, k, q, gdt, wdt, 1);
}

static void portable_sumsq(const void *g, int dt, size_t n, double *lanes) {
    size_t q = sumsq_part_len(n);
    for (size_t s = 0; s < SUMSQ_PARTS; s++)
        for (size_t i = s * q; i < n && i < (s + 1) * q; i++) {
            double x = adamw_load_grad(g, dt, i);
            lanes[s * SUMSQ_LANES + (i - s * q) % SUMSQ_LANES] += x * x;
        }
}

/* Same traffic as the step, no arithmetic: each array is read and written back (adjacent
 * elements swapped so no store can be elided), the gradient's bytes go to the working copy. */
static void portable_ceiling(const adamw_chunk *c, int q8, int gdt, int wdt) {
    size_t gs = st_dtype_size((st_dtype)gdt), ws = wdt == WORK_NONE ? 0 : st_dtype_size((st_dtype)wdt);
    for (size_t i = 0; i + 1 < c->n; i += 2) {
        float t = c->p[i]; c->p[i] = c->p[i + 1]; c->p[i + 1] = t;
        if (q8) {
            uint8_t a = c->qm[i]; c->qm[i] = c->qm[i + 1]; c->qm[i + 1] = a;
            a = c->qv[i]; c->qv[i] = c->qv[i + 1]; c->qv[i + 1] = a;
        } else {
            t = c->m[i]; c->m[i] = c->m[i + 1]; c->m[i + 1] = t;
            t = c->v[i]; c->v[i] = c->v[i + 1]; c->v[i + 1] = t;
        }
    }
    if (ws) {
        for (size_t i = 0; i < c->n; i++) {
            uint32_t x = 0;
            memcpy(&x, (const char *)c->g + i * gs, gs);
            memcpy((char *)c->w + i * ws, &x, ws);
        }
    }
    if (q8)
        for (size_t b = 0; b < (c->n + Q8_BLOCK - 1) / Q8_BLOCK; b++) {
            float t = c->am[b]; c->am[b] = c->av[b]; c->av[b] = t;
        }
}

const adamw_kernels adamw_kernels_portable = {
    .step_f32 = portable_step_f32,
    .step_q8 = portable_step_q8,
    .step_q8f = portable_step_q8f,
    .sumsq = portable_sumsq,
    .ceiling = portable_ceiling,
    .quant = portable_quant,
    .quantf = portable_quantf,
};

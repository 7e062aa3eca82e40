/* adamw_simd_body.h - the optimizer kernels written once over a small vector vocabulary.
 *
 * Included by adamw_avx512.c and adamw_avx2.c after they define, for their ISA: W (lanes),
 * V / VI / M / VB (float, int, mask and byte vectors), the v_*, vi_*, m_*, vb_* helpers
 * and KERNELS_NAME. Each operation mirrors the scalar definition in adamw_kernels.h, in the
 * same order, so the results are bit-identical. Loops over dtypes are specialised by
 * always_inline bodies called with constant dtypes.
 */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Software prefetch PF elements ahead on every stream: a core here keeps too few lines in
 * flight from the hardware prefetchers alone, and the 8-bit pass computes long enough between
 * loads to drain them. The ceiling kernel prefetches the same way, so the ratio is fair. */
#ifndef PF
#define PF 4096
#endif
#define PREFETCH_R(ptr) __builtin_prefetch((ptr), 0, 3)
#define PREFETCH_W(ptr) __builtin_prefetch((ptr), 1, 3)

typedef struct simd_consts {
    V b1, c1, b2, c2, sd, epsd, nlr, wd;
} simd_consts;

ALWAYS_INLINE simd_consts simd_consts_make(const adamw_consts *k, float wd) {
    simd_consts s = {v_set1(k->b1), v_set1(k->c1),   v_set1(k->b2),  v_set1(k->c2),
                     v_set1(k->sd), v_set1(k->epsd), v_set1(k->nlr), v_set1(wd)};
    return s;
}

/* adamw_elem on W lanes: updates *m, *v and returns the new p. */
ALWAYS_INLINE V simd_adamw(V p, V *m, V *v, V g, const simd_consts *s) {
    V mm = v_fma(s->c1, g, v_mul(s->b1, *m));
    V vv = v_fma(v_mul(s->c2, g), g, v_mul(s->b2, *v));
    V d = v_fma(v_sqrt(vv), s->sd, s->epsd);
    *m = mm;
    *v = vv;
    return v_fma(s->nlr, v_fma(s->wd, p, v_div(mm, d)), p);
}

ALWAYS_INLINE void body_f32(const adamw_chunk *c, const adamw_consts *k, const int gdt, const int wdt) {
    simd_consts s = simd_consts_make(k, c->wd);
    size_t n = c->n, nv = n / W * W;
    float *p = c->p, *m = c->m, *v = c->v;
    size_t gs = gdt == ST_F32 ? 4 : 2, ws = wdt == ST_F32 ? 4 : 2;
    for (size_t i = 0; i < nv; i += W) {
        PREFETCH_W(p + i + PF);
        PREFETCH_W(m + i + PF);
        PREFETCH_W(v + i + PF);
        PREFETCH_R((const char *)c->g + (i + PF) * gs);
        if (wdt != WORK_NONE) PREFETCH_W((char *)c->w + (i + PF) * ws);
        V mm = v_load(m + i), vv = v_load(v + i);
        V pp = simd_adamw(v_load(p + i), &mm, &vv, v_load_grad(c->g, gdt, i), &s);
        v_store(p + i, pp);
        v_store(m + i, mm);
        v_store(v + i, vv);
        if (wdt != WORK_NONE) v_store_work(c->w, wdt, i, pp);
    }
    for (size_t i = nv; i < n; i++) {
        adamw_elem(&p[i], &m[i], &v[i], adamw_load_grad(c->g, gdt, i), k, c->wd);
        adamw_store_work(c->w, wdt, i, p[i]);
    }
}

#define FOR_DTYPES(BODY, ...)                                                          \
    switch (gdt * 8 + (wdt + 1)) {                                                     \
    case ST_F32 * 8 + 0: BODY(__VA_ARGS__, ST_F32, WORK_NONE); break;                  \
    case ST_F32 * 8 + ST_F32 + 1: BODY(__VA_ARGS__, ST_F32, ST_F32); break;            \
    case ST_F32 * 8 + ST_BF16 + 1: BODY(__VA_ARGS__, ST_F32, ST_BF16); break;          \
    case ST_F32 * 8 + ST_F16 + 1: BODY(__VA_ARGS__, ST_F32, ST_F16); break;            \
    case ST_BF16 * 8 + 0: BODY(__VA_ARGS__, ST_BF16, WORK_NONE); break;                \
    case ST_BF16 * 8 + ST_F32 + 1: BODY(__VA_ARGS__, ST_BF16, ST_F32); break;          \
    case ST_BF16 * 8 + ST_BF16 + 1: BODY(__VA_ARGS__, ST_BF16, ST_BF16); break;        \
    case ST_BF16 * 8 + ST_F16 + 1: BODY(__VA_ARGS__, ST_BF16, ST_F16); break;          \
    case ST_F16 * 8 + 0: BODY(__VA_ARGS__, ST_F16, WORK_NONE); break;                  \
    case ST_F16 * 8 + ST_F32 + 1: BODY(__VA_ARGS__, ST_F16, ST_F32); break;            \
    case ST_F16 * 8 + ST_BF16 + 1: BODY(__VA_ARGS__, ST_F16, ST_BF16); break;          \
    case ST_F16 * 8 + ST_F16 + 1: BODY(__VA_ARGS__, ST_F16, ST_F16); break;            \
    default: break;                                                                    \
    }

static void simd_step_f32(const adamw_chunk *c, const adamw_consts *k, int gdt, int wdt) {
    FOR_DTYPES(body_f32, c, k)
}

/* ---- 8-bit states ---- */

/* q8_quant_elem on W lanes through the inverse table (adamw_kernels.h): a = min(|x| inv, 1)
 * as bits (an unsigned min: a NaN's bits exceed 1.0's, and fminf gives 1 for NaN too),
 * clamped below into the first cell; one gather; (E + a) >> 16 is the level (unsigned) or
 * a positive value's byte (signed); negatives (x < 0 as the scalar compares) take
 * 127 - min(level, 127) = max(254 - byte, 0). */
/* E + bits for x: bits 16 and up are the unsigned map's level, the signed map's byte if
 * x >= 0 */
ALWAYS_INLINE VI simd_quant_raw(V x, V inv, const simd_map *q) {
    VI b = vi_and(v_bits(v_mul(x, inv)), vi_set1(0x7fffffff));
    b = vi_maxu(vi_minu(b, vi_set1(0x3f800000)), vi_set1(Q8_INV_EMIN << 23));
    return vi_add(vi_gather(q->inv, vi_srli16(b)), b);
}

ALWAYS_INLINE VI simd_quant_pos(V x, V inv, const simd_map *q) { return vi_srli16(simd_quant_raw(x, inv, q)); }

ALWAYS_INLINE VI simd_quant(V x, V inv, const simd_map *q, const int is_signed) {
    VI r = simd_quant_pos(x, inv, q);
    if (!is_signed) return r; /* the byte store keeps the low 8 bits: 256 (one) -> 0 */
    return vi_blend(v_cmp_lt(x, v_set1(0.0f)), r, vi_max(vi_sub(vi_set1(254), r), vi_set1(0)));
}

/* dec[byte] on W lanes: the level's code from its bit length (register tables; a gather
 * from dec measured no faster on AVX2 and slower on AVX-512) */
ALWAYS_INLINE V simd_dequant(VI u, const simd_map *q, const int is_signed) {
    VI level = is_signed ? vi_sub(u, vi_set1(127)) : u;
    V val = simd_code(is_signed ? vi_abs(level) : level, q, is_signed);
    if (is_signed) val = v_from_bits(vi_xor(v_bits(val), vi_and(level, vi_set1((int)0x80000000u))));
    return val;
}

/* ---- the float map (adamw_kernels.h: q8f_code, q8f_quant_elem) ---- */

/* the code on W lanes (positive magnitudes; signed: the sign blended in as bit 7) */
ALWAYS_INLINE VI simd_quantf(V x, V inv, const int is_signed) {
    const uint32_t base = Q8F_BASE(is_signed ? Q8F_TOP_S : Q8F_TOP_U);
    V a = v_fma(v_abs(x), inv, v_from_bits(vi_set1((int)base)));
    VI b = vi_minu(v_bits(a), vi_set1((int)Q8F_ONE));
    VI c = vi_srli(vi_add(b, vi_set1((int)((1u << (Q8F_SH - 1)) - base))), Q8F_SH);
    if (!is_signed) return c;
    return vi_blend(v_cmp_lt(x, v_set1(0.0f)), c, vi_or(c, vi_set1(128)));
}

/* q8f_code on W lanes of bytes: (bits - delta), the sign xored in */
ALWAYS_INLINE V simd_dequantf(VI u, const int is_signed) {
    const uint32_t base = Q8F_BASE(is_signed ? Q8F_TOP_S : Q8F_TOP_U);
    VI mag = vi_slli(u, Q8F_SH);
    if (is_signed) mag = vi_and(mag, vi_set1((int)(Q8F_TOP_S << Q8F_SH)));
    V val = v_sub(v_from_bits(vi_add(mag, vi_set1((int)base))), v_from_bits(vi_set1((int)base)));
    if (is_signed) val = v_from_bits(vi_xor(v_bits(val), vi_and(vi_slli(u, 24), vi_set1((int)0x80000000u))));
    return val;
}

/* The block loops work in groups of Q8_GROUP vectors: an ISA may pack a whole group's bytes
 * at once (Q8_STORE_GROUP: adamw_avx2.c); otherwise vector by vector. */
#define Q8_GROUP 4
ALWAYS_INLINE void simd_dequant_group(const uint8_t *qb, const simd_map *q, const int is_signed, V out[Q8_GROUP],
                                      const int fp) {
    for (int j = 0; j < Q8_GROUP; j++)
        out[j] = fp ? simd_dequantf(vi_load_u8(qb + j * W), is_signed) : simd_dequant(vi_load_u8(qb + j * W), q, is_signed);
}
#ifndef WORK_STORE_GROUP
/* the working copy of Q8_GROUP vectors of parameters from element e */
ALWAYS_INLINE void v_store_work_group(void *w, const int dt, size_t e, const V pp[Q8_GROUP]) {
    for (int j = 0; j < Q8_GROUP; j++) v_store_work(w, dt, e + (size_t)j * W, pp[j]);
}
#endif
#ifndef Q8_STORE_GROUP
/* the bytes of Q8_GROUP inverse-table results (simd_quant_raw: the result in bits 16-23);
 * neg: the lanes with x < 0 (signed map) */
ALWAYS_INLINE void vi_store_group_u8(uint8_t *out, const VI raw[Q8_GROUP], const M neg[Q8_GROUP], const int is_signed) {
    for (int j = 0; j < Q8_GROUP; j++) {
        VI r = vi_srli16(raw[j]);
        vi_store_u8(out + j * W, is_signed ? vi_blend(neg[j], r, vi_max(vi_sub(vi_set1(254), r), vi_set1(0))) : r);
    }
}
#endif
#ifndef Q8F_STORE_GROUP
/* the bytes of Q8_GROUP float-map codes (each lane's low 8 bits) */
ALWAYS_INLINE void vi_store_group_u8f(uint8_t *out, const VI c[Q8_GROUP]) {
    for (int j = 0; j < Q8_GROUP; j++) vi_store_u8(out + j * W, c[j]);
}
#endif

ALWAYS_INLINE void simd_quant_group(const float *x, V inv, const simd_map *q, const int is_signed, uint8_t *out,
                                    const int fp) {
    if (fp) {
        VI c[Q8_GROUP];
        for (int j = 0; j < Q8_GROUP; j++) c[j] = simd_quantf(v_load(x + j * W), inv, is_signed);
        vi_store_group_u8f(out, c);
        return;
    }
    VI r[Q8_GROUP];
    M neg[Q8_GROUP];
    for (int j = 0; j < Q8_GROUP; j++) {
        V xj = v_load(x + j * W);
        r[j] = simd_quant_raw(xj, inv, q);
        if (is_signed) neg[j] = v_cmp_lt(xj, v_set1(0.0f));
    }
    vi_store_group_u8(out, r, neg, is_signed);
}

ALWAYS_INLINE void quant_block(const float *x, size_t n, float inv, const q8_map *q, const simd_map *sq,
                               const int is_signed, uint8_t *out, const int fp) {
    size_t ng = n / (Q8_GROUP * W) * (Q8_GROUP * W), nv = n / W * W;
    V vinv = v_set1(inv);
    for (size_t i = 0; i < ng; i += Q8_GROUP * W) simd_quant_group(x + i, vinv, sq, is_signed, out + i, fp);
    for (size_t i = ng; i < nv; i += W)
        vi_store_u8(out + i, fp ? simd_quantf(v_load(x + i), vinv, is_signed) : simd_quant(v_load(x + i), vinv, sq, is_signed));
    for (size_t i = nv; i < n; i++) out[i] = fp ? q8f_quant_elem(x[i], inv, is_signed) : q8_quant_elem(x[i], inv, q, is_signed);
}

static void simd_quantf_ext(const float *x, size_t n, float inv, int is_signed, uint8_t *out) {
    if (is_signed) quant_block(x, n, inv, NULL, NULL, 1, out, 1);
    else quant_block(x, n, inv, NULL, NULL, 0, out, 1);
}

static void simd_quant_ext(const float *x, size_t n, float inv, const q8_map *q, int is_signed, uint8_t *out) {
    simd_map sq = simd_map_make(q);
    if (is_signed) quant_block(x, n, inv, q, &sq, 1, out, 0);
    else quant_block(x, n, inv, q, &sq, 0, out, 0);
}

/* The 8-bit update of one group of block elements [off + i, off + i + Q8_GROUP W): dequantise,
 * AdamW, parameter and working copy out, new moments into the block buffers, running absmax.
 * Prefetches once per cache line of each stream (per vector they repeated the byte streams'). */
ALWAYS_INLINE void q8_update_group(const adamw_chunk *c, size_t off, size_t i, V vam, V vav, const simd_consts *s,
                                   const simd_map *ss, const simd_map *su, float *mb, float *vb, V *mxm, V *mxv,
                                   const int gdt, const int wdt, const int fp) {
    const size_t gs = gdt == ST_F32 ? 4 : 2, ws = wdt == ST_F32 ? 4 : 2, e = off + i, ge = Q8_GROUP * W;
    for (size_t l = 0; l < ge * 4; l += 64) PREFETCH_W((char *)(c->p + e + PF) + l);
    for (size_t l = 0; l < ge; l += 64) {
        PREFETCH_W(c->qm + e + PF + l);
        PREFETCH_W(c->qv + e + PF + l);
    }
    for (size_t l = 0; l < ge * gs; l += 64) PREFETCH_R((const char *)c->g + (e + PF) * gs + l);
    if (wdt != WORK_NONE)
        for (size_t l = 0; l < ge * ws; l += 64) PREFETCH_W((char *)c->w + (e + PF) * ws + l);
    V dm[Q8_GROUP], dv[Q8_GROUP], pp[Q8_GROUP];
    simd_dequant_group(c->qm + e, ss, 1, dm, fp);
    simd_dequant_group(c->qv + e, su, 0, dv, fp);
    for (int j = 0; j < Q8_GROUP; j++) {
        size_t ej = e + (size_t)j * W;
        V mm = v_mul(dm[j], vam), vv = v_mul(dv[j], vav);
        pp[j] = simd_adamw(v_load(c->p + ej), &mm, &vv, v_load_grad(c->g, gdt, ej), s);
        v_store(c->p + ej, pp[j]);
        v_store(mb + i + (size_t)j * W, mm);
        v_store(vb + i + (size_t)j * W, vv);
        *mxm = v_max(*mxm, v_abs(mm));
        *mxv = v_max(*mxv, vv); /* v >= 0 */
    }
    if (wdt != WORK_NONE) v_store_work_group(c->w, wdt, e, pp);
}

/* The 8-bit update of one vector of block elements [off + i, off + i + W): dequantise, AdamW,
 * parameter and working copy out, new moments into the block buffers, running absmax. */
ALWAYS_INLINE void q8_update_vec(const adamw_chunk *c, size_t off, size_t i, V vam, V vav, const simd_consts *s,
                                 const simd_map *ss, const simd_map *su, float *mb, float *vb, V *mxm, V *mxv,
                                 const int gdt, const int wdt, const int fp) {
    size_t gs = gdt == ST_F32 ? 4 : 2, ws = wdt == ST_F32 ? 4 : 2, e = off + i;
    PREFETCH_W(c->p + e + PF);
    PREFETCH_W(c->qm + e + PF);
    PREFETCH_W(c->qv + e + PF);
    PREFETCH_R((const char *)c->g + (e + PF) * gs);
    if (wdt != WORK_NONE) PREFETCH_W((char *)c->w + (e + PF) * ws);
    V mm = v_mul(fp ? simd_dequantf(vi_load_u8(c->qm + e), 1) : simd_dequant(vi_load_u8(c->qm + e), ss, 1), vam);
    V vv = v_mul(fp ? simd_dequantf(vi_load_u8(c->qv + e), 0) : simd_dequant(vi_load_u8(c->qv + e), su, 0), vav);
    V pp = simd_adamw(v_load(c->p + e), &mm, &vv, v_load_grad(c->g, gdt, e), s);
    v_store(c->p + e, pp);
    if (wdt != WORK_NONE) v_store_work(c->w, wdt, e, pp);
    v_store(mb + i, mm);
    v_store(vb + i, vv);
    *mxm = v_max(*mxm, v_abs(mm));
    *mxv = v_max(*mxv, vv); /* v >= 0 */
}

/* Block blk's new absmaxes from the vector maxima and the scalar tail [nv, nb); stored. */
ALWAYS_INLINE void q8_block_tail(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, size_t blk,
                                 size_t nv, size_t nb, V mxm, V mxv, float *mb, float *vb, const int gdt,
                                 const int wdt, const int fp) {
    size_t off = blk * Q8_BLOCK;
    const float *ds = fp ? q->fs : q->s.dec, *du = fp ? q->fu : q->u.dec;
    float am = c->am[blk], av = c->av[blk], mmax = v_reduce_max(mxm), vmax = v_reduce_max(mxv);
    for (size_t i = nv; i < nb; i++) {
        float m = ds[c->qm[off + i]] * am, v = du[c->qv[off + i]] * av;
        adamw_elem(&c->p[off + i], &m, &v, adamw_load_grad(c->g, gdt, off + i), k, c->wd);
        adamw_store_work(c->w, wdt, off + i, c->p[off + i]);
        mb[i] = m;
        vb[i] = v;
        mmax = fmaxf(mmax, fabsf(m));
        vmax = fmaxf(vmax, v);
    }
    c->am[blk] = mmax;
    c->av[blk] = vmax;
}

static inline float q8_inv(float amax) { return amax > 0 ? 1.0f / amax : 0.0f; }

/* Block by block: update into an L1 buffer, then requantise with the block's new absmax.
 * Blocks are software-pipelined: block b's update runs in the same loop as block b-1's
 * requantisation, so the divider-bound update and the ALU-bound quantiser share the core
 * instead of taking turns (every element's operations are unchanged). */
ALWAYS_INLINE void body_q8(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, const int fp,
                           const int gdt, const int wdt) {
    simd_consts s = simd_consts_make(k, c->wd);
    simd_map ss = simd_map_make(&q->s), su = simd_map_make(&q->u);
    float mb[2][Q8_BLOCK] __attribute__((aligned(64))), vb[2][Q8_BLOCK] __attribute__((aligned(64)));
    size_t nfull = c->n / Q8_BLOCK, tail = c->n - nfull * Q8_BLOCK;
    V zero = v_set1(0.0f);
    for (size_t b = 0; b <= nfull; b++) {
        /* update block b (if full), requantise block b-1 (if any) in the same loop */
        int upd = b < nfull, req = b > 0;
        float *um = mb[b & 1], *uv = vb[b & 1], *rm = mb[(b + 1) & 1], *rv = vb[(b + 1) & 1];
        V mxm = zero, mxv = zero;
        V vam = v_set1(upd ? c->am[b] : 0.0f), vav = v_set1(upd ? c->av[b] : 0.0f);
        V im = v_set1(req ? q8_inv(c->am[b - 1]) : 0.0f), iv = v_set1(req ? q8_inv(c->av[b - 1]) : 0.0f);
        uint8_t *qm = req ? c->qm + (b - 1) * Q8_BLOCK : NULL, *qv = req ? c->qv + (b - 1) * Q8_BLOCK : NULL;
        const size_t G = Q8_GROUP * W;
        _Static_assert(Q8_BLOCK % (Q8_GROUP * W) == 0, "a block is whole groups");
        if (upd && req) {
            for (size_t i = 0; i < Q8_BLOCK; i += G) {
                q8_update_group(c, b * Q8_BLOCK, i, vam, vav, &s, &ss, &su, um, uv, &mxm, &mxv, gdt, wdt, fp);
                simd_quant_group(rm + i, im, &ss, 1, qm + i, fp);
                simd_quant_group(rv + i, iv, &su, 0, qv + i, fp);
            }
        } else if (upd) {
            for (size_t i = 0; i < Q8_BLOCK; i += G)
                q8_update_group(c, b * Q8_BLOCK, i, vam, vav, &s, &ss, &su, um, uv, &mxm, &mxv, gdt, wdt, fp);
        } else if (req) {
            for (size_t i = 0; i < Q8_BLOCK; i += G) {
                simd_quant_group(rm + i, im, &ss, 1, qm + i, fp);
                simd_quant_group(rv + i, iv, &su, 0, qv + i, fp);
            }
        }
        if (upd) q8_block_tail(c, k, q, b, Q8_BLOCK, Q8_BLOCK, mxm, mxv, um, uv, gdt, wdt, fp);
    }
    if (tail) { /* the segment's last, partial block: on its own */
        size_t nv = tail / W * W, off = nfull * Q8_BLOCK;
        V mxm = zero, mxv = zero, vam = v_set1(c->am[nfull]), vav = v_set1(c->av[nfull]);
        for (size_t i = 0; i < nv; i += W)
            q8_update_vec(c, off, i, vam, vav, &s, &ss, &su, mb[0], vb[0], &mxm, &mxv, gdt, wdt, fp);
        q8_block_tail(c, k, q, nfull, nv, tail, mxm, mxv, mb[0], vb[0], gdt, wdt, fp);
        quant_block(mb[0], tail, q8_inv(c->am[nfull]), &q->s, &ss, 1, c->qm + off, fp);
        quant_block(vb[0], tail, q8_inv(c->av[nfull]), &q->u, &su, 0, c->qv + off, fp);
    }
}

static void simd_step_q8(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, int gdt, int wdt) {
    FOR_DTYPES(body_q8, c, k, q, 0)
}

static void simd_step_q8f(const adamw_chunk *c, const adamw_consts *k, const q8_tables *q, int gdt, int wdt) {
    FOR_DTYPES(body_q8, c, k, q, 1)
}

/* ---- gradient sum of squares ---- */

/* SUMSQ_GROUP parts at a time in lockstep (each keeps its own lanes, so the order inside a
 * lane is unchanged), then each part's tail. */
ALWAYS_INLINE void body_sumsq(const void *g, size_t n, double *lanes, const int dt) {
    size_t es = dt == ST_F32 ? 4 : 2, q = sumsq_part_len(n);
    for (size_t s0 = 0; s0 < SUMSQ_PARTS; s0 += SUMSQ_GROUP) {
        size_t start[SUMSQ_GROUP], len[SUMSQ_GROUP], common = SIZE_MAX;
        for (size_t s = 0; s < SUMSQ_GROUP; s++) {
            start[s] = (s0 + s) * q < n ? (s0 + s) * q : n;
            len[s] = n - start[s] < q ? n - start[s] : q;
            if (len[s] < common) common = len[s];
        }
        common = common / SUMSQ_LANES * SUMSQ_LANES;
        VD acc[SUMSQ_GROUP][SUMSQ_LANES / WD];
        for (size_t s = 0; s < SUMSQ_GROUP; s++)
            for (int j = 0; j < SUMSQ_LANES / WD; j++) acc[s][j] = vd_load(lanes + (s0 + s) * SUMSQ_LANES + j * WD);
        for (size_t i = 0; i < common; i += SUMSQ_LANES)
            for (size_t s = 0; s < SUMSQ_GROUP; s++) {
                PREFETCH_R((const char *)g + (start[s] + i + PF) * es);
                if (es == 4) PREFETCH_R((const char *)g + (start[s] + i + PF) * es + 64);
                for (int j = 0; j < SUMSQ_LANES / WD; j++) {
                    VD x = vd_load_grad(g, dt, start[s] + i + (size_t)j * WD);
                    acc[s][j] = vd_fma(x, x, acc[s][j]);
                }
            }
        for (size_t s = 0; s < SUMSQ_GROUP; s++) {
            double *l = lanes + (s0 + s) * SUMSQ_LANES;
            for (int j = 0; j < SUMSQ_LANES / WD; j++) vd_store(l + j * WD, acc[s][j]);
            for (size_t i = common; i < len[s]; i++) {
                double x = adamw_load_grad(g, dt, start[s] + i);
                l[i % SUMSQ_LANES] = fma(x, x, l[i % SUMSQ_LANES]);
            }
        }
    }
}

static void simd_sumsq(const void *g, int dt, size_t n, double *lanes) {
    if (dt == ST_BF16) body_sumsq(g, n, lanes, ST_BF16);
    else if (dt == ST_F16) body_sumsq(g, n, lanes, ST_F16);
    else body_sumsq(g, n, lanes, ST_F32);
}

/* ---- the bandwidth ceiling: the step's traffic with moves only ---- */

static void simd_ceiling(const adamw_chunk *c, int q8, int gdt, int wdt) {
    size_t gs = st_dtype_size((st_dtype)gdt), ws = wdt == WORK_NONE ? 0 : st_dtype_size((st_dtype)wdt);
    size_t n2 = c->n / (2 * W) * (2 * W);
    for (size_t i = 0; i < n2; i += 2 * W) {
        for (size_t h = 0; h < 2 * W; h += W) { /* the step's prefetches, per W elements */
            PREFETCH_W(c->p + i + h + PF);
            if (q8) {
                PREFETCH_W(c->qm + i + h + PF);
                PREFETCH_W(c->qv + i + h + PF);
            } else {
                PREFETCH_W(c->m + i + h + PF);
                PREFETCH_W(c->v + i + h + PF);
            }
            PREFETCH_R((const char *)c->g + (i + h + PF) * gs);
            if (ws) PREFETCH_W((char *)c->w + (i + h + PF) * ws);
        }
        /* each array's two adjacent groups swapped: read and written, nothing computed */
        V p0 = v_load(c->p + i), p1 = v_load(c->p + i + W);
        v_store(c->p + i, p1);
        v_store(c->p + i + W, p0);
        if (q8) {
            VB a0 = vb_load(c->qm + i, 1), a1 = vb_load(c->qm + i + W, 1);
            VB b0 = vb_load(c->qv + i, 1), b1 = vb_load(c->qv + i + W, 1);
            vb_store(c->qm + i, 1, a1);
            vb_store(c->qm + i + W, 1, a0);
            vb_store(c->qv + i, 1, b1);
            vb_store(c->qv + i + W, 1, b0);
        } else {
            V a0 = v_load(c->m + i), a1 = v_load(c->m + i + W);
            V b0 = v_load(c->v + i), b1 = v_load(c->v + i + W);
            v_store(c->m + i, a1);
            v_store(c->m + i + W, a0);
            v_store(c->v + i, b1);
            v_store(c->v + i + W, b0);
        }
        const char *g = (const char *)c->g + i * gs;
        VB g0 = vb_load(g, gs), g1 = vb_load(g + W * gs, gs);
        vb_keep(g0); /* the loads must happen even with no working copy to write */
        vb_keep(g1);
        if (ws) {
            char *w = (char *)c->w + i * ws;
            vb_store(w, ws, g0);
            vb_store(w + W * ws, ws, g1);
        }
    }
    if (q8)
        for (size_t b = 0; b < (c->n + Q8_BLOCK - 1) / Q8_BLOCK; b++) {
            float t = c->am[b];
            c->am[b] = c->av[b];
            c->av[b] = t;
        }
}

const adamw_kernels KERNELS_NAME = {
    .step_f32 = simd_step_f32,
    .step_q8 = simd_step_q8,
    .step_q8f = simd_step_q8f,
    .sumsq = simd_sumsq,
    .ceiling = simd_ceiling,
    .quant = simd_quant_ext,
    .quantf = simd_quantf_ext,
};

/* test_optim_q8_simd.c - the SIMD 8-bit quantisers (inverse table + gather) decide exactly as
 * the scalar q8_quant_elem, the definition of the state format, for every input.
 *
 * - Both maps' inverse tables are valid (at most one rounding boundary per cell).
 * - Every float bit pattern from 2^-26 up to 1.0 (the whole range where codes differ, about
 *   2.2e8 values per sign) quantised with inv = 1 by each SIMD kernel set this CPU has equals
 *   the portable kernel's byte, positive and negative for the signed map; below 2^-26 every
 *   1021st pattern (all must give the zero code).
 * - Blocks of edge values with a real absmax: 0, -0, denormals, exact codes x absmax, the
 *   float midpoints between neighbouring codes x absmax and their neighbours, values just over
 *   absmax, huge values, infinities and NaNs of both signs; random blocks too.
 * - A full 8-bit step from states holding every byte value, with absmax 0, denormal, normal
 *   and huge, and a few NaN and infinite parameters, gives the same parameters, bf16 working
 *   copy and state bytes on every kernel set.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/adamw_kernels.h"
#include "strata/optim.h"
#include "testutil.h"

static const adamw_kernels *kernels(int isa) {
    switch (isa) {
    case ST_OPTIM_ISA_AVX2: return &adamw_kernels_avx2;
    case ST_OPTIM_ISA_AVX512: return &adamw_kernels_avx512;
    case ST_OPTIM_ISA_AVX512_BF16: return &adamw_kernels_avx512bf16;
    default: return &adamw_kernels_portable;
    }
}

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* Every step-th bit pattern in [lo, hi] with the given sign bit, in blocks of 256 (over the
 * OpenMP threads); the AVX-512+BF16 set shares the AVX-512 quantiser, so it is swept once. */
static long sweep(const q8_map *q, int sgn, uint32_t sign, uint32_t lo, uint32_t hi, uint32_t step, int best) {
    long bad = 0, nblocks = (long)(((uint64_t)hi - lo) / step / 256 + 1);
    int top = best < ST_OPTIM_ISA_AVX512 ? best : ST_OPTIM_ISA_AVX512;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (long blk = 0; blk < nblocks; blk++) {
        float x[256];
        uint8_t ref[256], got[256];
        size_t n = 0;
        for (uint64_t b = lo + (uint64_t)blk * 256 * step; n < 256 && b <= hi; n++, b += step)
            x[n] = from_bits((uint32_t)b | sign);
        kernels(ST_OPTIM_ISA_PORTABLE)->quant(x, n, 1.0f, q, sgn, ref);
        for (int isa = ST_OPTIM_ISA_AVX2; isa <= top; isa++) {
            kernels(isa)->quant(x, n, 1.0f, q, sgn, got);
            for (size_t i = 0; i < n; i++)
                if (got[i] != ref[i]) {
                    if (bad++ < 3)
                        printf("  %s %s map: x = %.9g gives byte %d, scalar %d\n", st_optim_isa_name((st_optim_isa)isa),
                               sgn ? "signed" : "unsigned", (double)x[i], got[i], ref[i]);
                }
        }
    }
    return bad;
}

static void check_tables_and_sweep(const q8_tables *t, int best) {
    CHECK(t->s.inv_ok && t->u.inv_ok, "inverse tables valid: signed %d unsigned %d", t->s.inv_ok, t->u.inv_ok);
    const uint32_t lo = (Q8_INV_EMIN - 3u) << 23, one = 0x3f800000u;
    long bad = 0;
    for (int sgn = 0; sgn < 2; sgn++) {
        const q8_map *q = sgn ? &t->s : &t->u;
        for (int neg = 0; neg <= sgn; neg++) {
            uint32_t sign = neg ? 0x80000000u : 0;
            bad += sweep(q, sgn, sign, lo, one, 1, best);      /* every pattern where codes differ */
            bad += sweep(q, sgn, sign, 0, lo - 1, 1021, best); /* the rest, sampled */
        }
    }
    printf("every float in [2^-26, 1] (both signs for the signed map): %ld bytes differ from the scalar\n", bad);
    CHECK(bad == 0, "%ld quantised bytes differ from the scalar quantiser", bad);
}

/* Edge values around a block's absmax; the scalar kernel is the reference. */
static void check_edge_blocks(const q8_tables *t, int best) {
    st_rng r;
    st_rng_seed(&r, 31);
    long bad = 0, blocks = 0;
    for (int sgn = 0; sgn < 2; sgn++) {
        const q8_map *q = sgn ? &t->s : &t->u;
        static const float amaxes[] = {1.0f, 3.7e-3f, 1e-30f, 1.4e-45f, 2.5e30f, FLT_MAX, 0.0f};
        for (size_t ai = 0; ai < sizeof amaxes / sizeof amaxes[0]; ai++)
            for (int rep = 0; rep < 40; rep++) {
                float amax = amaxes[ai], x[256];
                for (int i = 0; i < 256; i++) {
                    int c = (int)(st_rng_u64(&r) % 256), kind = (rep + i) % 12;
                    double code = q->dec[c], next = q->dec[(c + 1) % 256];
                    switch (kind) {
                    case 0: x[i] = (float)code * amax; break;                                 /* a code */
                    case 1: x[i] = (float)((code + next) / 2 * amax); break;                  /* a midpoint */
                    case 2: x[i] = nextafterf((float)((code + next) / 2 * amax), INFINITY); break;
                    case 3: x[i] = nextafterf((float)((code + next) / 2 * amax), -INFINITY); break;
                    case 4: x[i] = (rep & 1 ? -1 : 1) * from_bits((uint32_t)(st_rng_u64(&r) % 0x800000u)); break;
                    case 5: x[i] = rep & 1 ? -0.0f : 0.0f; break;
                    case 6: x[i] = nextafterf(amax, INFINITY) * (rep & 1 ? -1 : 1); break;      /* just over */
                    case 7: x[i] = (rep & 1 ? -1 : 1) * (rep & 2 ? FLT_MAX : 1e30f); break;
                    case 8: x[i] = (rep & 1 ? -1 : 1) * INFINITY; break;
                    case 9: x[i] = from_bits((rep & 1 ? 0xffc00000u : 0x7fc00000u) | (uint32_t)(st_rng_u64(&r) & 0x3fffff)); break;
                    case 10: x[i] = st_rng_normal(&r) * amax * powf(10.0f, -8.0f * st_rng_uniform(&r)); break;
                    default: x[i] = from_bits((uint32_t)st_rng_u64(&r)); break; /* any bits at all */
                    }
                    if (!sgn && kind != 9 && kind != 11) x[i] = fabsf(x[i]);
                }
                float inv = amax > 0 ? 1.0f / amax : 0.0f;
                uint8_t ref[256], got[256];
                for (size_t n = 256; n >= 1; n = n == 256 ? 255 : n / 2) { /* vector bodies and tails */
                    kernels(ST_OPTIM_ISA_PORTABLE)->quant(x, n, inv, q, sgn, ref);
                    for (int isa = ST_OPTIM_ISA_AVX2; isa <= best; isa++) {
                        kernels(isa)->quant(x, n, inv, q, sgn, got);
                        for (size_t i = 0; i < n; i++)
                            if (got[i] != ref[i] && bad++ < 5)
                                printf("  %s %s: x = %.9g absmax %.9g: byte %d, scalar %d\n",
                                       st_optim_isa_name((st_optim_isa)isa), sgn ? "signed" : "unsigned",
                                       (double)x[i], (double)amax, got[i], ref[i]);
                    }
                    blocks++;
                    if (n == 1) break;
                }
            }
    }
    printf("%ld edge-value blocks: %ld bytes differ from the scalar\n", blocks, bad);
    CHECK(bad == 0, "%ld edge-value bytes differ from the scalar quantiser", bad);
}

/* One step from states holding every byte, several absmax magnitudes, on every kernel set. */
static void check_step_states(int best) {
    size_t n = 256 * 12 + 37;
    st_optim_segment seg = {.offset = 0, .n = n, .weight_decay = 0.1f};
    float *p0 = malloc(n * 4), *g = malloc(n * 4);
    st_rng r;
    st_rng_seed(&r, 5);
    for (size_t i = 0; i < n; i++) {
        p0[i] = st_rng_normal(&r);
        g[i] = st_rng_normal(&r) * powf(10.0f, -6.0f * st_rng_uniform(&r));
    }
    /* non-finite parameters in a few groups: their bf16 working copy takes the NaN rule */
    static const uint32_t odd[] = {0x7fc00000u, 0xffc12345u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x7fffffffu};
    for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++) p0[100 + 517 * k] = from_bits(odd[k]);
    char *ref = NULL;
    float *pref = malloc(n * 4);
    uint16_t *wref = malloc(n * 2);
    size_t ref_bytes = 0;
    long bad = 0;
    for (int isa = ST_OPTIM_ISA_PORTABLE; isa <= best; isa++) {
        st_err err = {0};
        st_optim *o;
        CHECK(st_optim_create(&o, &seg, 1, ST_OPTIM_STATE_8BIT, &err) == ST_OK &&
                  st_optim_set_isa(o, (st_optim_isa)isa, &err) == ST_OK, "create: %s", err.msg);
        size_t qb, ab;
        uint8_t *qm = st_optim_state_buffer(o, 0, &qb), *qv = st_optim_state_buffer(o, 1, &qb);
        float *am = st_optim_state_buffer(o, 2, &ab), *av = st_optim_state_buffer(o, 3, &ab);
        for (size_t i = 0; i < qb; i++) { qm[i] = (uint8_t)(i * 7 + i / 256); qv[i] = (uint8_t)(i * 13 + 5); }
        static const float mags[] = {1e-3f, 0.0f, 1e-40f, 1e-12f, 2.0f, 1e30f};
        for (size_t b = 0; b < ab / 4; b++) { am[b] = mags[b % 6]; av[b] = mags[(b + 3) % 6] * mags[(b + 3) % 6]; }
        float *p = malloc(n * 4);
        uint16_t *w = malloc(n * 2);
        memcpy(p, p0, n * 4);
        for (int s = 1; s <= 3; s++) {
            st_adamw_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = s, .grad_scale = 1.0f};
            st_optim_step_args a = {.params = p, .grads = g, .grad_dtype = ST_F32, .work = w, .work_dtype = ST_BF16,
                                    .grad_sumsq = -1};
            CHECK(st_optim_step_ex(o, &a, &hp, &err) == ST_OK, "step: %s", err.msg);
        }
        size_t bytes = 2 * qb + 2 * ab;
        char *state = malloc(bytes);
        memcpy(state, qm, qb);
        memcpy(state + qb, qv, qb);
        memcpy(state + 2 * qb, am, ab);
        memcpy(state + 2 * qb + ab, av, ab);
        if (!ref) {
            ref = state;
            ref_bytes = bytes;
            memcpy(pref, p, n * 4);
            memcpy(wref, w, n * 2);
        } else {
            int same = bytes == ref_bytes && !memcmp(state, ref, bytes) && !memcmp(p, pref, n * 4) && !memcmp(w, wref, n * 2);
            if (!same) bad++;
            printf("%s: 3 steps from every byte value and absmax 0 .. 1e30: %s the portable kernels' bits\n",
                   st_optim_isa_name((st_optim_isa)isa), same ? "same as" : "DIFFERENT from");
            free(state);
        }
        free(p);
        free(w);
        st_optim_free(o);
    }
    CHECK(bad == 0, "%ld kernel sets' 8-bit steps differ from the portable kernels", bad);
    free(ref); free(pref); free(wref); free(p0); free(g);
}

int main(void) {
    /* the best this process may run (STRATA_OPTIM_ISA can cap it) */
    int best = (int)st_optim_isa_best();
    printf("best kernels: %s\n", st_optim_isa_name((st_optim_isa)best));
    if (best < ST_OPTIM_ISA_AVX2) {
        printf("no SIMD kernels on this CPU: nothing to compare\n");
        return 77;
    }
    q8_tables t;
    q8_tables_init(&t);
    check_tables_and_sweep(&t, best);
    check_edge_blocks(&t, best);
    check_step_states(best);
    return test_finish("optim_q8_simd");
}

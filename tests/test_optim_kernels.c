/* test_optim_kernels.c - the SIMD optimizer kernels equal the portable C kernels bit for bit.
 *
 * Every ISA this CPU has (AVX2, AVX-512) against the portable kernels: every state format
 * (f32, 8-bit dynamic map, 8-bit float map),
 * every gradient dtype x working-copy dtype, segment lengths that leave vector tails and
 * partial 8-bit blocks, gradients spanning many decades with exact zeros; plus the sum of
 * squares lanes and block quantisation. Bit equality is the design (same float operations
 * in the same order), so a checkpoint resumes exactly on any CPU.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/adamw_kernels.h"
#include "strata/optim.h"
#include "testutil.h"

#define SEG(o, n_, wd) {.offset = (o), .n = (n_), .weight_decay = (wd)}
static const st_optim_segment SEGS[] = {SEG(0, 1, 0.1f),     SEG(1, 15, 0.0f),     SEG(16, 17, 0.1f),
                                        SEG(33, 255, 0.02f), SEG(288, 257, 0.0f),  SEG(545, 1000, 0.1f),
                                        SEG(1545, 16384 + 333, 0.05f)};
#define NSEG ((int)(sizeof SEGS / sizeof SEGS[0]))
#define NTOT (1545 + 16384 + 333)

static float wide_value(st_rng *r) {
    float u = st_rng_uniform(r);
    if (u < 0.02f) return 0.0f;
    return st_rng_normal(r) * powf(10.0f, 8.0f * st_rng_uniform(r) - 6.0f);
}

typedef struct run_out {
    float *p;
    uint8_t *w;
    char *state;
    size_t state_bytes;
} run_out;

static run_out run(st_optim_isa isa, st_optim_state_format fmt, st_dtype gdt, int wdt, int *ok) {
    st_err err = {0};
    st_optim *o;
    run_out out = {0};
    *ok = st_optim_create(&o, SEGS, NSEG, fmt, &err) == ST_OK && st_optim_set_isa(o, isa, &err) == ST_OK;
    if (!*ok) return out;
    size_t n = NTOT, gs = st_dtype_size(gdt);
    out.p = malloc(n * 4);
    out.w = calloc(n, 4);
    void *g = malloc(n * gs);
    st_rng r;
    st_rng_seed(&r, 77);
    for (size_t i = 0; i < n; i++) out.p[i] = st_rng_normal(&r);
    for (long step = 1; step <= 3; step++) {
        for (size_t i = 0; i < n; i++) {
            float x = wide_value(&r);
            if (gdt == ST_BF16) ((uint16_t *)g)[i] = st_f32_to_bf16(x);
            else if (gdt == ST_F16) ((uint16_t *)g)[i] = st_f32_to_f16(x);
            else ((float *)g)[i] = x;
        }
        st_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .step = step, .grad_scale = 0.7f};
        st_optim_step_args a = {.params = out.p, .grads = g, .grad_dtype = gdt, .work = wdt < 0 ? NULL : out.w,
                             .work_dtype = wdt < 0 ? ST_F32 : (st_dtype)wdt, .grad_sumsq = 1.0};
        if (st_optim_step_ex(o, &a, &hp, &err) != ST_OK) { *ok = 0; break; }
    }
    size_t bytes;
    for (int i = 0; i < st_optim_state_count(o); i++) { st_optim_state_buffer(o, i, &bytes); out.state_bytes += bytes; }
    out.state = malloc(out.state_bytes);
    char *at = out.state;
    for (int i = 0; i < st_optim_state_count(o); i++) {
        void *b = st_optim_state_buffer(o, i, &bytes);
        memcpy(at, b, bytes);
        at += bytes;
    }
    st_optim_free(o);
    free(g);
    return out;
}

static void free_out(run_out *o) { free(o->p); free(o->w); free(o->state); }

/* The working copy of special values (subnormals, ties, NaN, extremes), with lr = 0 so the
 * master weights stay put: every kernel rounds exactly as st_f32_to_bf16 / st_f32_to_f16. */
static void check_work_specials(st_optim_isa best) {
    enum { N = 96 };
    float p0[N];
    uint32_t bits[] = {0x00000001u, 0x80000001u, 0x007fffffu, 0x00400000u, 0x00008000u, 0x00018000u,
                       0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7fc00000u,
                       0x7f800001u, 0xffc12345u, 0x00000000u, 0x80000000u, 0x477ff000u, 0x477fefffu,
                       0x33800000u, 0x33000001u, 0x38800000u, 0x387fffffu};
    size_t nb = sizeof bits / sizeof bits[0];
    st_rng r;
    st_rng_seed(&r, 9);
    for (size_t i = 0; i < N; i++) {
        if (i < nb) memcpy(&p0[i], &bits[i], 4);
        else p0[i] = st_rng_normal(&r) * powf(2.0f, (float)(i % 40) - 20.0f);
    }
    st_optim_segment seg = {.offset = 0, .n = N, .weight_decay = 0.0f};
    float g[N] = {0};
    for (int isa = ST_OPTIM_ISA_PORTABLE; isa <= (int)best; isa++)
        for (int wd = 0; wd < 2; wd++) {
            st_dtype wdt = wd ? ST_F16 : ST_BF16;
            st_err err = {0};
            st_optim *o;
            st_optim_create(&o, &seg, 1, ST_OPTIM_STATE_F32, &err);
            st_optim_set_isa(o, (st_optim_isa)isa, &err);
            float p[N];
            uint16_t w[N];
            memcpy(p, p0, sizeof p);
            st_adamw_params hp = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 1, .grad_scale = 1.0f};
            st_optim_step_args a = {.params = p, .grads = g, .grad_dtype = ST_F32, .work = w, .work_dtype = wdt,
                                 .grad_sumsq = 0.0};
            st_optim_step_ex(o, &a, &hp, &err);
            int bad = 0;
            for (size_t i = 0; i < N; i++) {
                uint16_t want = wd ? st_f32_to_f16(p[i]) : st_f32_to_bf16(p[i]);
                if (w[i] != want) {
                    if (bad++ < 3)
                        fprintf(stderr, "%s %s: element %zu (0x%08x): got 0x%04x want 0x%04x\n",
                                st_optim_isa_name((st_optim_isa)isa), st_dtype_name(wdt), i, bits[i < nb ? i : 0], w[i], want);
                }
            }
            CHECK(bad == 0, "%s: %d %s working-copy values differ from the scalar conversion",
                  st_optim_isa_name((st_optim_isa)isa), bad, st_dtype_name(wdt));
            st_optim_free(o);
        }
}

int main(void) {
    st_optim_isa best = st_optim_isa_best();
    printf("best kernels on this CPU: %s\n", st_optim_isa_name(best));
    if (best == ST_OPTIM_ISA_PORTABLE) {
        printf("no SIMD kernels to compare on this CPU\n");
        return 77;
    }
    static const st_dtype gdts[3] = {ST_F32, ST_BF16, ST_F16};
    static const int wdts[4] = {-1, ST_F32, ST_BF16, ST_F16};
    for (int isa = ST_OPTIM_ISA_AVX2; isa <= (int)best; isa++)
        for (int f = 0; f < 3; f++)
            for (int gi = 0; gi < 3; gi++)
                for (int wi = 0; wi < 4; wi++) {
                    static const st_optim_state_format fmts[3] = {ST_OPTIM_STATE_F32, ST_OPTIM_STATE_8BIT,
                                                                  ST_OPTIM_STATE_8BIT_FP};
                    static const char *fname[3] = {"f32", "8bit", "8bit-fp"};
                    st_optim_state_format fmt = fmts[f];
                    int ok1, ok2;
                    run_out a = run(ST_OPTIM_ISA_PORTABLE, fmt, gdts[gi], wdts[wi], &ok1);
                    run_out b = run((st_optim_isa)isa, fmt, gdts[gi], wdts[wi], &ok2);
                    CHECK(ok1 && ok2, "runs completed");
                    if (ok1 && ok2) {
                        size_t diff_p = 0;
                        for (size_t i = 0; i < NTOT; i++) diff_p += memcmp(&a.p[i], &b.p[i], 4) != 0;
                        CHECK(diff_p == 0, "%s %s grad %s work %d: %zu params differ from portable",
                              st_optim_isa_name((st_optim_isa)isa), fname[f], st_dtype_name(gdts[gi]), wdts[wi], diff_p);
                        CHECK(memcmp(a.w, b.w, NTOT * 4) == 0, "%s %s grad %s work %d: working copy differs",
                              st_optim_isa_name((st_optim_isa)isa), fname[f], st_dtype_name(gdts[gi]), wdts[wi]);
                        CHECK(a.state_bytes == b.state_bytes && memcmp(a.state, b.state, a.state_bytes) == 0,
                              "%s %s grad %s work %d: state differs", st_optim_isa_name((st_optim_isa)isa),
                              fname[f], st_dtype_name(gdts[gi]), wdts[wi]);
                    }
                    free_out(&a);
                    free_out(&b);
                }

    /* sum of squares: identical lanes for every length remainder and dtype */
    const adamw_kernels *ks[4] = {&adamw_kernels_portable, &adamw_kernels_avx2, &adamw_kernels_avx512,
                                  &adamw_kernels_avx512bf16};
    size_t n = 5000;
    float *g = malloc(n * 4);
    uint16_t *h = malloc(n * 2);
    st_rng r;
    st_rng_seed(&r, 8);
    for (size_t i = 0; i < n; i++) { g[i] = wide_value(&r); h[i] = st_f32_to_bf16(g[i]); }
    for (int isa = ST_OPTIM_ISA_AVX2; isa <= (int)best; isa++)
        for (size_t len = 0; len <= n; len = len == 100 ? n - 40 : len + 1) /* short: empty parts */
            for (int d = 0; d < 3; d++) {
                double l0[SUMSQ_PARTS * SUMSQ_LANES] = {0}, l1[SUMSQ_PARTS * SUMSQ_LANES] = {0};
                const void *src = d == 0 ? (const void *)g : (const void *)h;
                int dt = d == 0 ? ST_F32 : d == 1 ? ST_BF16 : ST_F16;
                ks[0]->sumsq(src, dt, len, l0);
                ks[isa - 1]->sumsq(src, dt, len, l1);
                CHECK(memcmp(l0, l1, sizeof l0) == 0, "%s sumsq lanes differ (len %zu dtype %d)",
                      st_optim_isa_name((st_optim_isa)isa), len, dt);
            }

    /* block quantisation: identical bytes for odd block lengths */
    q8_tables t;
    q8_tables_init(&t);
    for (int isa = ST_OPTIM_ISA_AVX2; isa <= (int)best; isa++)
        for (int sgn = 0; sgn < 2; sgn++)
            for (size_t len = 1; len <= 256; len += 17) {
                float x[256];
                uint8_t q0[256], q1[256];
                float amax = 0;
                for (size_t i = 0; i < len; i++) {
                    x[i] = wide_value(&r);
                    if (!sgn) x[i] = fabsf(x[i]);
                    amax = fmaxf(amax, fabsf(x[i]));
                }
                float inv = amax > 0 ? 1.0f / amax : 0.0f;
                ks[0]->quant(x, len, inv, sgn ? &t.s : &t.u, sgn, q0);
                ks[isa - 1]->quant(x, len, inv, sgn ? &t.s : &t.u, sgn, q1);
                CHECK(memcmp(q0, q1, len) == 0, "%s quantisation differs (len %zu signed %d)",
                      st_optim_isa_name((st_optim_isa)isa), len, sgn);
                ks[0]->quantf(x, len, inv, sgn, q0);
                ks[isa - 1]->quantf(x, len, inv, sgn, q1);
                CHECK(memcmp(q0, q1, len) == 0, "%s float-map quantisation differs (len %zu signed %d)",
                      st_optim_isa_name((st_optim_isa)isa), len, sgn);
            }
    free(g);
    free(h);
    check_work_specials(best);
    return test_finish("optim_kernels");
}

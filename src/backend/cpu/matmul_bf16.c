/* matmul_bf16.c - bf16 matrix products on the CPU through oneDNN's matmul primitive
 * (matmul_bf16.h). Operands are rounded to bf16 here (convert_bf16.c: nearest even), oneDNN
 * multiplies them with fp32 accumulation into an fp32 result, choosing its kernel at run
 * time (AMX tiles, AVX512-BF16, or AVX-512 emulating bf16). A primitive is made once per
 * shape and kept: making one costs about as much as running it. */
#include "backend/cpu/matmul_bf16.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <omp.h>

#include "backend/cpu/backend_cpu_chunk.h"
#include "strata/tensor.h"

/* ------------------------------------------------------------------ what the CPU has */

#if defined(__x86_64__) && defined(__GNUC__)
static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static int bf16_forced_none(void) {
    const char *e = getenv("STRATA_CPU_BF16");
    return e && !strcmp(e, "none");
}

cpu_bf16_units cpu_bf16_detect(void) {
    if (bf16_forced_none()) return CPU_BF16_NONE;
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return CPU_BF16_NONE; /* no OSXSAVE: no xgetbv */
    uint64_t x = xcr0();
    int zmm = (x & 0xe6) == 0xe6;               /* the OS saves the AVX-512 state (opmask, zmm) */
    int tiles = (x & 0x60000) == 0x60000;       /* ... and the AMX tile state */
    if (__get_cpuid_max(0, NULL) < 7) return CPU_BF16_NONE;
    __cpuid_count(7, 0, a, b, c, d);
    int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1, max_sub = (int)a;
    if (zmm && tiles && amx_bf16 && amx_tile) return CPU_BF16_AMX;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if (zmm && ((a >> 5) & 1)) return CPU_BF16_AVX512;
    }
#endif
    return CPU_BF16_NONE;
}

const char *cpu_bf16_units_name(cpu_bf16_units u) {
    return u == CPU_BF16_AMX ? "AMX-BF16" : u == CPU_BF16_AVX512 ? "AVX512-BF16" : "none";
}

/* ------------------------------------------------------------------ fp32 -> bf16 */
#ifdef STRATA_HAVE_DNNL

/* dst (n bf16) = src (n floats) rounded to nearest even, over the OpenMP threads: the CPU
 * backend's one conversion (convert_bf16.c, AVX-512 where present). */
static void to_bf16(uint16_t *dst, const float *src, size_t n) { st_cpu_to_bf16(NULL, dst, src, n); }
#endif

/* ------------------------------------------------------------------ oneDNN */

#ifdef STRATA_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

int cpu_bf16_built(void) { return 1; }

#define BF16_CACHE_MAX 128 /* shapes kept; a model makes a few dozen */

/* A product's shape, layouts and options: the cache's key (compared whole; zero-filled
 * first so that padding compares equal). Batched products (nb0 x nb1 matrices, attention's
 * batch x heads) give each operand's two batch strides; a plain product has nb0 = nb1 = 1 and
 * zero batch strides. ld*: row strides of the stored matrices (A stored (M,K), or (K,M) when
 * ta; B (K,N), or (N,K) when tb; C (M,N)). */
typedef struct bf16_key {
    int nb0, nb1, M, N, K, ta, tb, bias, acc, pad_;
    int64_t lda, ldb, ldc, sa0, sa1, sb0, sb1, sc0, sc1;
} bf16_key;

typedef struct bf16_prim {
    bf16_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bs; /* bound to each call's pointers by set_data_handle */
    dnnl_memory_t pad;         /* its scratchpad, bound to the shared buffer (NULL: needs none) */
    size_t pad_bytes;
    char impl[64];
    unsigned long long used;   /* the call count when last used: the oldest is replaced */
} bf16_prim;

struct cpu_bf16 {
    pthread_mutex_t mu;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    bf16_prim cache[BF16_CACHE_MAX];
    int n;
    unsigned long long calls;
    uint16_t *slot[CPU_BF16_SLOTS];
    size_t cap[CPU_BF16_SLOTS]; /* elements */
    /* One scratchpad for every primitive (their calls are serialised by mu), grown to the
     * largest: oneDNN's own (library mode) is allocated at every call, and the pages of a
     * fresh allocation are zeroed by the kernel: a third of a bf16 step went there. */
    void *pad;
    size_t pad_cap;
    cpu_bf16_stats stats;
};

static st_status dnnl_fail(st_err *err, dnnl_status_t st, const char *what) {
    return st_errf(err, ST_ERR_IO, "matmul bf16: oneDNN's %s failed (status %d); give matmul fp32", what, (int)st);
}

st_status cpu_bf16_create(cpu_bf16 **out, st_err *err) {
    *out = NULL;
    cpu_bf16 *b = calloc(1, sizeof *b);
    if (!b) return st_errf(err, ST_ERR_NOMEM, "matmul bf16: out of memory");
    /* a CPU told to behave as one without bf16 units runs oneDNN's emulation too
     * (honoured only before oneDNN's first primitive in the process) */
    if (bf16_forced_none()) dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core);
    dnnl_status_t st = dnnl_engine_create(&b->engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        free(b);
        return dnnl_fail(err, st, "CPU engine");
    }
    if ((st = dnnl_stream_create(&b->stream, b->engine, dnnl_stream_default_flags)) != dnnl_success) {
        dnnl_engine_destroy(b->engine);
        free(b);
        return dnnl_fail(err, st, "stream");
    }
    pthread_mutex_init(&b->mu, NULL);
    *out = b;
    return ST_OK;
}

static void prim_free(bf16_prim *p) {
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->a) dnnl_memory_destroy(p->a);
    if (p->b) dnnl_memory_destroy(p->b);
    if (p->c) dnnl_memory_destroy(p->c);
    if (p->bs) dnnl_memory_destroy(p->bs);
    if (p->pad) dnnl_memory_destroy(p->pad);
    memset(p, 0, sizeof *p);
}

void cpu_bf16_free(cpu_bf16 *b) {
    if (!b) return;
    for (int i = 0; i < b->n; i++) prim_free(&b->cache[i]);
    for (int i = 0; i < CPU_BF16_SLOTS; i++) st_free(b->slot[i]);
    st_free(b->pad);
    dnnl_stream_destroy(b->stream);
    dnnl_engine_destroy(b->engine);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

void cpu_bf16_lock(cpu_bf16 *b) { pthread_mutex_lock(&b->mu); }
void cpu_bf16_unlock(cpu_bf16 *b) { pthread_mutex_unlock(&b->mu); }

uint16_t *cpu_bf16_operand(cpu_bf16 *b, int slot, const float *src, size_t n) {
    if (n > b->cap[slot]) {
        st_free(b->slot[slot]);
        size_t cap = n + n / 4; /* room for the next larger shape */
        b->slot[slot] = st_alloc(cap * sizeof(uint16_t));
        b->cap[slot] = b->slot[slot] ? cap : 0;
        if (!b->slot[slot]) return NULL;
    }
    double t0 = st_now();
    to_bf16(b->slot[slot], src, n);
    b->stats.convert_s[slot] += st_now() - t0;
    return b->slot[slot];
}

uint16_t *cpu_bf16_scratch(cpu_bf16 *b, int slot, size_t n) {
    if (n > b->cap[slot]) {
        st_free(b->slot[slot]);
        size_t cap = n + n / 4;
        b->slot[slot] = st_alloc(cap * sizeof(uint16_t));
        b->cap[slot] = b->slot[slot] ? cap : 0;
    }
    return b->slot[slot];
}

void cpu_bf16_round(uint16_t *dst, const float *src, size_t n) {
    st_cpu_to_bf16_serial(dst, src, n);
}

void cpu_bf16_round_into(cpu_bf16 *b, int slot, uint16_t *dst, const float *src, size_t n) {
    cpu_bf16_lock(b);
    double t0 = st_now();
    to_bf16(dst, src, n);
    b->stats.convert_s[slot] += st_now() - t0;
    cpu_bf16_unlock(b);
}

void cpu_bf16_add_convert_s(cpu_bf16 *b, int slot, double s) { b->stats.convert_s[slot] += s; }

void cpu_bf16_get_stats(cpu_bf16 *b, cpu_bf16_stats *out) {
    cpu_bf16_lock(b);
    *out = b->stats;
    cpu_bf16_unlock(b);
}

/* The memory descriptor of a stored row-major (rows, cols) matrix with row stride ld, read
 * as its transpose when t (dims (cols, rows), strides (1, ld)); with batch dims (nb0, nb1)
 * in front (strides s0, s1) where `batched`. */
static dnnl_status_t md_of(dnnl_memory_desc_t *md, int batched, int nb0, int nb1, int64_t s0, int64_t s1, int rows,
                           int cols, int64_t ld, int t, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {0}, strides = {0};
    int o = batched ? 2 : 0;
    if (batched) dims[0] = nb0, dims[1] = nb1, strides[0] = s0, strides[1] = s1;
    if (!t) {
        dims[o] = rows, dims[o + 1] = cols, strides[o] = ld, strides[o + 1] = 1;
    } else {
        dims[o] = cols, dims[o + 1] = rows, strides[o] = 1, strides[o + 1] = ld;
    }
    return dnnl_memory_desc_init_by_strides(md, o + 2, dims, dt, strides);
}

static bf16_prim *prim_get(cpu_bf16 *b, const bf16_key *k, st_err *err) {
    b->calls++;
    for (int i = 0; i < b->n; i++) {
        bf16_prim *p = &b->cache[i];
        if (!memcmp(&p->key, k, sizeof *k)) {
            p->used = b->calls;
            return p;
        }
    }
    bf16_prim *p;
    if (b->n < BF16_CACHE_MAX) {
        p = &b->cache[b->n++];
    } else { /* full: the least recently used shape makes way */
        p = &b->cache[0];
        for (int i = 1; i < b->n; i++)
            if (b->cache[i].used < p->used) p = &b->cache[i];
        prim_free(p);
    }
    memset(p, 0, sizeof *p);
    int M = k->M, N = k->N, K = k->K, batched = k->nb0 * k->nb1 > 1;
    dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
    dnnl_dims_t bias_dims = {1, N};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st;
    const char *what = "memory descriptor";
    /* stored A (M,K) or (K,M); stored B (K,N) or (N,K) */
    if ((st = k->ta ? md_of(&a_md, batched, k->nb0, k->nb1, k->sa0, k->sa1, K, M, k->lda, 1, dnnl_bf16)
                    : md_of(&a_md, batched, k->nb0, k->nb1, k->sa0, k->sa1, M, K, k->lda, 0, dnnl_bf16)) ||
        (st = k->tb ? md_of(&b_md, batched, k->nb0, k->nb1, k->sb0, k->sb1, N, K, k->ldb, 1, dnnl_bf16)
                    : md_of(&b_md, batched, k->nb0, k->nb1, k->sb0, k->sb1, K, N, k->ldb, 0, dnnl_bf16)) ||
        (st = md_of(&c_md, batched, k->nb0, k->nb1, k->sc0, k->sc1, M, N, k->ldc, 0, dnnl_f32)) ||
        (st = dnnl_memory_desc_init_by_tag(&bias_md, 2, bias_dims, dnnl_f32, dnnl_ab)))
        goto fail;
    what = "matmul descriptor";
    if ((st = dnnl_matmul_desc_init(&desc, &a_md, &b_md, k->bias ? &bias_md : NULL, &c_md))) goto fail;
    what = "primitive attributes";
    if ((st = dnnl_primitive_attr_create(&attr)) ||
        (st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)))
        goto fail;
    if (k->acc) { /* C += : a sum post-op adds the old C (fp32) to the fp32 product */
        if ((st = dnnl_post_ops_create(&po)) || (st = dnnl_post_ops_append_sum(po, 1.0f)) ||
            (st = dnnl_primitive_attr_set_post_ops(attr, po)))
            goto fail;
    }
    what = "matmul primitive descriptor";
    if ((st = dnnl_primitive_desc_create(&pd, &desc, attr, b->engine, NULL))) goto fail;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(p->impl, sizeof p->impl, "%s", impl);
    what = "matmul primitive";
    if ((st = dnnl_primitive_create(&p->prim, pd))) goto fail;
    what = "memory";
    if ((st = dnnl_memory_create(&p->a, &a_md, b->engine, DNNL_MEMORY_NONE)) ||
        (st = dnnl_memory_create(&p->b, &b_md, b->engine, DNNL_MEMORY_NONE)) ||
        (st = dnnl_memory_create(&p->c, &c_md, b->engine, DNNL_MEMORY_NONE)) ||
        (k->bias && (st = dnnl_memory_create(&p->bs, &bias_md, b->engine, DNNL_MEMORY_NONE))))
        goto fail;
    const dnnl_memory_desc_t *pad_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->pad_bytes = pad_md ? dnnl_memory_desc_get_size(pad_md) : 0;
    if (p->pad_bytes && (st = dnnl_memory_create(&p->pad, pad_md, b->engine, DNNL_MEMORY_NONE))) goto fail;
    dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    p->key = *k, p->used = b->calls;
    return p;
fail:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    prim_free(p);
    b->n--; /* p is the last entry or a freed one; either way a hole is not kept */
    if (p != &b->cache[b->n]) *p = b->cache[b->n], memset(&b->cache[b->n], 0, sizeof b->cache[b->n]);
    st_errf(err, ST_ERR_IO, "matmul bf16: oneDNN's %s failed for %sM %d N %d K %d%s%s (status %d)", what,
            batched ? "a batch of " : "", M, N, K, k->ta ? " A transposed" : "", k->tb ? " B transposed" : "", (int)st);
    return NULL;
}

static bf16_key key_batched(const cpu_bf16_batch *g);
static bf16_key key_2d(int ta, int tb, int M, int N, int K, int bias, int acc) {
    bf16_key k;
    memset(&k, 0, sizeof k);
    k.nb0 = k.nb1 = 1, k.M = M, k.N = N, k.K = K, k.ta = ta, k.tb = tb, k.bias = bias, k.acc = acc;
    k.lda = ta ? M : K, k.ldb = tb ? K : N, k.ldc = N;
    return k;
}

static st_status run_prim(cpu_bf16 *b, const bf16_key *k, const uint16_t *A, const uint16_t *B, const float *bias,
                          float *C, st_err *err) {
    double t0 = st_now();
    bf16_prim *p = prim_get(b, k, err);
    if (!p) return ST_ERR_IO;
    dnnl_memory_set_data_handle(p->a, (void *)A);
    dnnl_memory_set_data_handle(p->b, (void *)B);
    dnnl_memory_set_data_handle(p->c, C);
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
    int nargs = 3;
    if (p->pad_bytes) {
        if (p->pad_bytes > b->pad_cap) {
            st_free(b->pad);
            b->pad = st_alloc(p->pad_bytes);
            b->pad_cap = b->pad ? p->pad_bytes : 0;
            if (!b->pad)
                return st_errf(err, ST_ERR_NOMEM, "matmul bf16: out of memory for oneDNN's scratchpad (%zu bytes) of "
                               "M %d N %d K %d", p->pad_bytes, k->M, k->N, k->K);
        }
        dnnl_memory_set_data_handle(p->pad, b->pad);
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->pad};
    }
    if (bias) {
        dnnl_memory_set_data_handle(p->bs, (void *)bias);
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, p->bs};
    }
    dnnl_status_t st = dnnl_primitive_execute(p->prim, b->stream, nargs, args);
    if (st == dnnl_success) st = dnnl_stream_wait(b->stream);
    b->stats.gemm_s += st_now() - t0;
    b->stats.calls++;
    if (st != dnnl_success)
        return st_errf(err, ST_ERR_IO, "matmul bf16: oneDNN's matmul M %d N %d K %d failed (status %d)", k->M, k->N,
                       k->K, (int)st);
    return ST_OK;
}

st_status cpu_bf16_gemm(cpu_bf16 *b, int ta, int tb, int M, int N, int K, const uint16_t *A, const uint16_t *B,
                        const float *bias, int accumulate, float *C, st_err *err) {
    if (M <= 0 || N <= 0) return ST_OK;
    bf16_key k = key_2d(ta, tb, M, N, K, bias != NULL, accumulate);
    return run_prim(b, &k, A, B, bias, C, err);
}

st_status cpu_bf16_gemm_batched(cpu_bf16 *b, const cpu_bf16_batch *g, const uint16_t *A, const uint16_t *B, float *C,
                                st_err *err) {
    if (g->M <= 0 || g->N <= 0 || g->nb0 <= 0 || g->nb1 <= 0) return ST_OK;
    bf16_key k = key_batched(g);
    return run_prim(b, &k, A, B, NULL, C, err);
}

static bf16_key key_batched(const cpu_bf16_batch *g) {
    bf16_key k;
    memset(&k, 0, sizeof k);
    k.nb0 = g->nb0, k.nb1 = g->nb1, k.M = g->M, k.N = g->N, k.K = g->K, k.ta = g->ta, k.tb = g->tb,
    k.acc = g->accumulate;
    k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc, k.sa0 = g->sa[0], k.sa1 = g->sa[1], k.sb0 = g->sb[0],
    k.sb1 = g->sb[1], k.sc0 = g->sc[0], k.sc1 = g->sc[1];
    return k;
}

st_status cpu_bf16_batched_ready(cpu_bf16 *b, const cpu_bf16_batch *g, st_err *err) {
    bf16_key k = key_batched(g);
    return prim_get(b, &k, err) ? ST_OK : ST_ERR_IO;
}

const char *cpu_bf16_impl(cpu_bf16 *b, int ta, int tb, int M, int N, int K, int bias, int accumulate) {
    bf16_key k = key_2d(ta, tb, M, N, K, bias, accumulate);
    cpu_bf16_lock(b);
    bf16_prim *p = prim_get(b, &k, NULL);
    cpu_bf16_unlock(b);
    return p ? p->impl : "";
}

#else /* built without oneDNN */

int cpu_bf16_built(void) { return 0; }

struct cpu_bf16 {
    int unused;
};

st_status cpu_bf16_create(cpu_bf16 **out, st_err *err) {
    *out = NULL;
    return st_errf(err, ST_ERR_UNSUPPORTED, "key 'matmul': bf16 on the CPU needs oneDNN, and this strata was built "
                   "without it; install libdnnl-dev (tools/setup.sh) and build again (cmake finds it), or give "
                   "matmul fp32");
}
void cpu_bf16_free(cpu_bf16 *b) { (void)b; }
void cpu_bf16_lock(cpu_bf16 *b) { (void)b; }
void cpu_bf16_get_stats(cpu_bf16 *b, cpu_bf16_stats *out) {
    (void)b;
    memset(out, 0, sizeof *out);
}
void cpu_bf16_unlock(cpu_bf16 *b) { (void)b; }
uint16_t *cpu_bf16_operand(cpu_bf16 *b, int slot, const float *src, size_t n) {
    (void)b, (void)slot, (void)src, (void)n;
    return NULL;
}
st_status cpu_bf16_gemm(cpu_bf16 *b, int ta, int tb, int M, int N, int K, const uint16_t *A, const uint16_t *B,
                        const float *bias, int accumulate, float *C, st_err *err) {
    (void)b, (void)ta, (void)tb, (void)A, (void)B, (void)bias, (void)accumulate, (void)C;
    return st_errf(err, ST_ERR_UNSUPPORTED, "matmul bf16: M %d N %d K %d: this strata was built without oneDNN", M,
                   N, K);
}
st_status cpu_bf16_gemm_batched(cpu_bf16 *b, const cpu_bf16_batch *g, const uint16_t *A, const uint16_t *B, float *C,
                                st_err *err) {
    (void)b, (void)g, (void)A, (void)B, (void)C;
    return st_errf(err, ST_ERR_UNSUPPORTED, "matmul bf16: this strata was built without oneDNN");
}
st_status cpu_bf16_batched_ready(cpu_bf16 *b, const cpu_bf16_batch *g, st_err *err) {
    (void)b, (void)g;
    return st_errf(err, ST_ERR_UNSUPPORTED, "matmul bf16: this strata was built without oneDNN");
}
uint16_t *cpu_bf16_scratch(cpu_bf16 *b, int slot, size_t n) {
    (void)b, (void)slot, (void)n;
    return NULL;
}
void cpu_bf16_add_convert_s(cpu_bf16 *b, int slot, double s) { (void)b, (void)slot, (void)s; }
void cpu_bf16_round(uint16_t *dst, const float *src, size_t n) { st_convert(dst, ST_BF16, src, ST_F32, n); }
void cpu_bf16_round_into(cpu_bf16 *b, int slot, uint16_t *dst, const float *src, size_t n) {
    (void)b, (void)slot;
    st_convert(dst, ST_BF16, src, ST_F32, n);
}
const char *cpu_bf16_impl(cpu_bf16 *b, int ta, int tb, int M, int N, int K, int bias, int accumulate) {
    (void)b, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)bias, (void)accumulate;
    return "";
}
#endif

/* core.c - errors, allocation, clocks, logging, checksums, deterministic RNG. */
#include "strata/core.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

st_status st_errf(st_err *err, st_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

st_status st_err_prefix(st_err *err, const char *fmt, ...) {
    if (!err) return ST_ERR_INVALID;
    char prefix[ST_ERR_MSG_MAX], old[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t lp = strnlen(prefix, sizeof prefix - 3), lo = strnlen(old, sizeof old - 1);
    if (lp + 2 + lo >= sizeof err->msg) lo = sizeof err->msg - lp - 3;
    memcpy(err->msg, prefix, lp);
    memcpy(err->msg + lp, ": ", 2);
    memcpy(err->msg + lp + 2, old, lo);
    err->msg[lp + 2 + lo] = 0;
    return err->code;
}

const char *st_status_name(st_status s) {
    static const char *names[] = {"ok", "invalid", "io", "format", "truncated", "shape",
                                  "nomem", "checksum", "unsupported", "nospace", "nonfinite", "busy"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

/* Buffers of 4 MiB and more (weights, gradients, moments, activations, the device arena)
 * are 2 MiB aligned and asked to be backed by transparent huge pages, which kernels set to
 * "madvise" mode only give to those who ask: a GEMM or an optimizer pass over gigabytes
 * otherwise misses the TLB every 4 KiB. */
#define ST_HUGE_MIN (4u << 20)
#define ST_HUGE_ALIGN (2u << 20)

void *st_alloc(size_t bytes) {
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    if (rounded >= ST_HUGE_MIN) {
        size_t r2 = (rounded + ST_HUGE_ALIGN - 1) & ~(size_t)(ST_HUGE_ALIGN - 1);
        if (posix_memalign(&p, ST_HUGE_ALIGN, r2) != 0) return NULL;
#ifdef MADV_HUGEPAGE
        madvise(p, r2, MADV_HUGEPAGE); /* advice only: no error if THP is off */
#endif
        memset(p, 0, r2);
        return p;
    }
    if (posix_memalign(&p, 64, rounded) != 0) return NULL;
    memset(p, 0, rounded);
    return p;
}

void st_free(void *p) { free(p); }

/* The mapping's length: whole pages, at least one. */
static size_t untouched_len(size_t bytes) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t p = pg > 0 ? (size_t)pg : 4096;
    return bytes ? (bytes + p - 1) / p * p : p;
}

void *st_alloc_untouched(size_t bytes) {
    size_t len = untouched_len(bytes), align = len >= ST_HUGE_MIN ? ST_HUGE_ALIGN : 0;
    unsigned char *m = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    if (!align) return m; /* page aligned */
    /* the mapping cut to a 2 MiB boundary and its length: what st_free_untouched unmaps */
    uintptr_t a = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
    unsigned char *p = (unsigned char *)a;
    if (p > m) munmap(m, (size_t)(p - m));
    if (m + len + align > p + len) munmap(p + len, (size_t)(m + len + align - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE); /* advice only, as st_alloc's */
#endif
    return p;
}

void st_free_untouched(void *p, size_t bytes) {
    if (p) munmap(p, untouched_len(bytes));
}

double st_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int g_log_level = 1; /* process-wide verbosity, set once by the CLI */

void st_log_set_level(int level) { g_log_level = level; }
int st_log_level(void) { return g_log_level; }

void st_log(int level, const char *fmt, ...) {
    if (level > g_log_level) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* Slicing-by-one table CRC-32C; fast enough for checkpoints (hundreds of MB/s). */
static uint32_t crc_table[256];
static int crc_ready;
static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
    crc_ready = 1;
}

static uint32_t crc32c_table_run(uint32_t crc, const uint8_t *p, size_t n) {
    if (!crc_ready) crc_init();
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
/* SSE4.2's crc32 instruction computes the same Castagnoli CRC, 8 bytes at a time (about
 * 8 GB/s on one core against 0.5 GB/s for the table): the disk tier checksums every byte
 * it reads and writes. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw_run(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
    }
    while (n--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

static int crc_hw = -1;
void st_crc32c_force_table(int on) { crc_hw = on ? 0 : -1; }

uint32_t st_crc32c(uint32_t crc, const void *data, size_t n) {
    crc = ~crc;
#if defined(__x86_64__)
    if (crc_hw < 0) crc_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    if (crc_hw) return ~crc32c_hw_run(crc, data, n);
#endif
    return ~crc32c_table_run(crc, data, n);
}

void st_failpoint(const char *name) {
    static int hits;
    const char *e = getenv("STRATA_FAILPOINT");
    if (!e || !*e) return;
    size_t n = strlen(name);
    if (strncmp(e, name, n) || (e[n] && e[n] != ':')) return;
    int want = e[n] == ':' ? atoi(e + n + 1) : 1;
    if (++hits >= want) raise(SIGKILL);
}

int st_iofault(const char *op, const char *path) {
    static _Atomic long hits;
    const char *e = getenv("STRATA_IOFAULT");
    if (!e || !*e) return 0;
    size_t n = strlen(op);
    if (strncmp(e, op, n) || e[n] != ':') return 0;
    const char *kind = e + n + 1, *at = strchr(kind, '@');
    if (at && (!path || !strstr(path, at + 1))) return 0;
    int fault = !strncmp(kind, "eio", 3) ? EIO : !strncmp(kind, "enospc", 6) ? ENOSPC
              : !strncmp(kind, "short", 5) ? ST_IOFAULT_SHORT : 0;
    const char *colon = strchr(kind, ':');
    long want = colon && (!at || colon < at) ? atol(colon + 1) : 1;
    return fault && atomic_fetch_add(&hits, 1) + 1 == want ? fault : 0;
}

void st_rng_seed(st_rng *r, uint64_t seed) {
    /* splitmix64 so that small seeds give well-mixed states; never zero. */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->s = z ? z : 0x2545F4914F6CDD1Dull;
}

uint64_t st_rng_u64(st_rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* xorshift64's step is linear over GF(2): the state after k steps is M^k s, M a 64 x 64 bit
 * matrix kept as its columns (col[j] = M e_j). Skipping k steps costs about 2 log2(k) matrix
 * products of 64 x 64 bits, whatever k is. */
static uint64_t gf2_apply(const uint64_t col[64], uint64_t x) {
    uint64_t y = 0;
    for (int j = 0; x; j++, x >>= 1)
        if (x & 1) y ^= col[j];
    return y;
}
static void gf2_mul(uint64_t out[64], const uint64_t a[64], const uint64_t b[64]) { /* out = a b */
    uint64_t t[64];
    for (int j = 0; j < 64; j++) t[j] = gf2_apply(a, b[j]);
    memcpy(out, t, sizeof t);
}

void st_rng_skip(st_rng *r, uint64_t k) {
    uint64_t base[64], acc[64];
    for (int j = 0; j < 64; j++) {
        uint64_t x = 1ull << j;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        base[j] = x;
        acc[j] = 1ull << j;
    }
    for (; k; k >>= 1) {
        if (k & 1) gf2_mul(acc, base, acc);
        if (k > 1) gf2_mul(base, base, base);
    }
    r->s = gf2_apply(acc, r->s);
}

float st_rng_uniform(st_rng *r) { return (float)(st_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float st_rng_normal(st_rng *r) {
    float u1 = st_rng_uniform(r), u2 = st_rng_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

double st_parse_count(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    switch (*end) {
    case 'K': case 'k': v *= 1e3; end++; break;
    case 'M': case 'm': v *= 1e6; end++; break;
    case 'B': case 'G': case 'g': v *= 1e9; end++; break;
    default: break;
    }
    return *end ? -1 : v;
}

double st_parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    static const struct { const char *suf; double mul; } sufs[] = {
        {"", 1}, {"B", 1}, {"K", 1e3}, {"KB", 1e3}, {"KiB", 1024.0}, {"M", 1e6}, {"MB", 1e6},
        {"MiB", 1048576.0}, {"G", 1e9}, {"GB", 1e9}, {"GiB", 1073741824.0}, {"T", 1e12},
        {"TB", 1e12}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof sufs / sizeof sufs[0]; i++)
        if (!strcmp(end, sufs[i].suf)) return v * sufs[i].mul;
    return -1;
}

void st_fput_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 32 || ch >= 127) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

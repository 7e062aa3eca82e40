/* dedup.c - exact and near-duplicate documents of a Megatron dataset.
 *
 * One streaming pass over the documents (OpenMP, each thread with its own source handle
 * and a chunk buffer; a document is read in chunks, never held whole) gives each
 * document a 128-bit hash of its tokens and a MinHash signature over its token n-grams.
 * Exact duplicates: documents sorted by (hash, id); each member of a group is compared
 * token by token with the group's first, and points at it when equal. Near duplicates:
 * banded LSH, a band at a time on each thread (a sorted array of (band hash, id) per
 * thread, so memory is one entry per document and thread whatever the band count); each
 * document of a bucket is compared with up to max_compare earlier members by the
 * estimated Jaccard similarity (the fraction of equal signature entries), and points at
 * the earliest verified one over all bands.
 *
 * MinHash hash i of a shingle with 32-bit hash x is a_i * x + b_i mod 2^32 (a_i odd: a
 * permutation of the 32-bit values), so the signature update of a shingle is a vector
 * loop of multiplies, adds and mins over the hashes.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

#define CHUNK_TOKENS (1u << 16)

void st_data_dedup_config_init(st_data_dedup_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->ngram = 5;
    cfg->num_hashes = 128;
    cfg->bands = 32;
    cfg->rows = 4;
    cfg->threshold = 0.7;
    cfg->seed = 1;
    cfg->max_compare = 16;
}

static inline uint64_t shingle_hash(const int32_t *t, int n, uint64_t seed) {
    uint64_t h = seed ^ 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < n; k++) h = (h ^ (uint32_t)t[k]) * 0x100000001b3ull + 0x5bd1e995u;
    return data_mix64(h);
}

/* sig[i] = min(sig[i], a[i] * x + b[i]) over the H hashes: the inner loop of the pass. */
DATA_CLONES static void minhash_update(uint32_t *restrict sig, const uint32_t *restrict a, const uint32_t *restrict b,
                                       int H, uint32_t x) {
    for (int i = 0; i < H; i++) {
        uint32_t v = a[i] * x + b[i];
        sig[i] = v < sig[i] ? v : sig[i];
    }
}

/* Per thread: its source, chunk buffer (carry of ngram-1 tokens in front) and error. */
typedef struct dedup_worker {
    st_data_source *src;
    int32_t *buf;
} dedup_worker;

/* Hash and signature of document d, streamed in chunks. */
static st_status doc_pass(dedup_worker *w, uint64_t d, const st_data_dedup_config *cfg, const uint32_t *A,
                          const uint32_t *B, uint32_t *sig, uint64_t hash[2], uint32_t *len_out, st_err *err) {
    uint64_t len;
    st_status rc = st_data_source_doc_len(w->src, d, &len, err);
    if (rc) return rc;
    *len_out = (uint32_t)len;
    const int n = cfg->ngram, H = cfg->num_hashes;
    for (int i = 0; i < H; i++) sig[i] = UINT32_MAX;
    uint64_t h1 = 0xcbf29ce484222325ull ^ len, h2 = 0x84222325cbf29ce4ull + len;
    size_t carry = 0;
    for (uint64_t o = 0; o < len;) {
        size_t k = (size_t)(len - o < CHUNK_TOKENS ? len - o : CHUNK_TOKENS);
        rc = st_data_source_read(w->src, d, o, k, w->buf + carry, 0, err);
        if (rc) return rc;
        const int32_t *t = w->buf + carry;
        for (size_t j = 0; j < k; j++) {
            h1 = (h1 ^ (uint32_t)t[j]) * 0x100000001b3ull;
            h2 = ((h2 + (uint32_t)t[j]) * 0xff51afd7ed558ccdull);
            h2 ^= h2 >> 29;
        }
        size_t have = carry + k;
        if (have >= (size_t)n)
            for (size_t j = 0; j + (size_t)n <= have; j++)
                minhash_update(sig, A, B, H, (uint32_t)(shingle_hash(w->buf + j, n, cfg->seed) >> 32));
        o += k;
        carry = have >= (size_t)n ? (size_t)n - 1 : have;
        memmove(w->buf, w->buf + have - carry, carry * sizeof *w->buf);
    }
    if (len < (uint64_t)n && len > 0) /* a short document is one shingle */
        minhash_update(sig, A, B, H, (uint32_t)(shingle_hash(w->buf, (int)len, cfg->seed) >> 32));
    hash[0] = data_mix64(h1);
    hash[1] = data_mix64(h2 ^ h1 * 3);
    return ST_OK;
}

/* Do documents a and b (same length) hold the same tokens? */
static st_status same_tokens(dedup_worker *w, int32_t *other, uint64_t a, uint64_t b, uint64_t len, int *same,
                             st_err *err) {
    *same = 1;
    for (uint64_t o = 0; o < len && *same;) {
        size_t k = (size_t)(len - o < CHUNK_TOKENS ? len - o : CHUNK_TOKENS);
        st_status rc = st_data_source_read(w->src, a, o, k, w->buf, 0, err);
        if (!rc) rc = st_data_source_read(w->src, b, o, k, other, 0, err);
        if (rc) return rc;
        *same = !memcmp(w->buf, other, k * sizeof *other);
        o += k;
    }
    return ST_OK;
}

typedef struct hkey {
    uint64_t h0, h1, doc;
} hkey;
static int hkey_cmp(const void *x, const void *y) {
    const hkey *a = x, *b = y;
    if (a->h0 != b->h0) return a->h0 < b->h0 ? -1 : 1;
    if (a->h1 != b->h1) return a->h1 < b->h1 ? -1 : 1;
    return a->doc < b->doc ? -1 : a->doc > b->doc;
}
typedef struct bkey {
    uint64_t h, doc;
} bkey;
static int bkey_cmp(const void *x, const void *y) {
    const bkey *a = x, *b = y;
    if (a->h != b->h) return a->h < b->h ? -1 : 1;
    return a->doc < b->doc ? -1 : a->doc > b->doc;
}

/* The configuration's ranges, refused naming the option. */
static st_status dedup_check_config(const st_data_dedup_config *c, st_err *err) {
    if (c->ngram < 1 || c->ngram > 64)
        return st_errf(err, ST_ERR_INVALID, "dedup: ngram %d must be in [1, 64]", c->ngram);
    if (c->num_hashes < 1 || c->num_hashes > 4096)
        return st_errf(err, ST_ERR_INVALID, "dedup: hashes %d must be in [1, 4096]", c->num_hashes);
    if (c->bands < 1 || c->rows < 1 || (long)c->bands * c->rows > c->num_hashes)
        return st_errf(err, ST_ERR_INVALID, "dedup: bands x rows = %d x %d must be at least 1 x 1 and at most the "
                       "%d hashes", c->bands, c->rows, c->num_hashes);
    if (!(c->threshold > 0 && c->threshold <= 1))
        return st_errf(err, ST_ERR_INVALID, "dedup: threshold %g must be in (0, 1]", c->threshold);
    return ST_OK;
}

/* Exact duplicates: documents of one content hash compared token by token; each duplicate
 * points at the earliest document it repeats. */
static st_status dedup_exact(dedup_worker *w0, const uint64_t (*hash)[2], const uint32_t *len, uint64_t N,
                             st_data_scores *out, st_data_dedup_stats *stats, st_err *err) {
    st_status rc = ST_OK;
    hkey *k = malloc(sizeof *k * (N ? N : 1));
    if (!k) return st_errf(err, ST_ERR_NOMEM, "dedup: out of memory");
    for (uint64_t d = 0; d < N; d++) k[d] = (hkey){hash[d][0], hash[d][1], d};
    qsort(k, N, sizeof *k, hkey_cmp);
    int32_t *other = malloc(sizeof(int32_t) * CHUNK_TOKENS);
    if (!other) rc = st_errf(err, ST_ERR_NOMEM, "dedup: out of memory");
    for (uint64_t i = 0; i < N && !rc;) {
        uint64_t j = i + 1;
        while (j < N && k[j].h0 == k[i].h0 && k[j].h1 == k[i].h1) j++;
        for (uint64_t m = i + 1; m < j && !rc; m++) {
            uint64_t a = k[i].doc, b = k[m].doc;
            int same = 0;
            if (len[a] == len[b]) rc = same_tokens(w0, other, a, b, len[a], &same, err);
            if (!rc && same) {
                out->ref[b] = (int64_t)a, out->dup[b] = ST_DATA_DUP_EXACT, out->score[b] = 1.0;
                stats->exact++;
            }
        }
        i = j;
    }
    free(other);
    free(k);
    return rc;
}

/* Near duplicates over the LSH bands, nbt threads each a band at a time with its own N keys
 * (keys: N x nbt): nref[d] the earliest document whose signatures agree with d's on at least
 * the threshold's share of the hashes (-1: none), nsim[d] that share. */
static void dedup_near(const st_data_dedup_config *cfg, int nbt, const uint32_t *sig, uint64_t N, bkey *keys,
                       const st_data_scores *out, int64_t *nref, float *nsim, st_data_dedup_stats *stats) {
    const int H = cfg->num_hashes;
    uint64_t cand = 0, ver = 0;
#pragma omp parallel num_threads(nbt) reduction(+ : cand, ver)
    {
        bkey *k = keys + N * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int band = 0; band < cfg->bands; band++) {
            uint64_t m = 0;
            for (uint64_t d = 0; d < N; d++) {
                if (out->dup[d]) continue;
                const uint32_t *r = sig + (size_t)H * d + (size_t)band * cfg->rows;
                uint64_t h = data_mix64((uint64_t)band + 0x51ed27ull);
                for (int i = 0; i < cfg->rows; i++) h = data_mix64(h ^ r[i]);
                k[m++] = (bkey){h, d};
            }
            qsort(k, m, sizeof *k, bkey_cmp);
            for (uint64_t s = 0, end; s < m; s = end) {
                end = s + 1;
                while (end < m && k[end].h == k[s].h) end++;
                /* each later member compared with the earliest members before it */
                for (uint64_t i = s + 1; i < end; i++) {
                    uint64_t d = k[i].doc;
                    const uint32_t *sd = sig + (size_t)H * d;
                    for (uint64_t j = s; j < i && j < s + (uint64_t)cfg->max_compare; j++) {
                        uint64_t e = k[j].doc;
                        int64_t now = __atomic_load_n(&nref[d], __ATOMIC_RELAXED);
                        if (now >= 0 && (uint64_t)now <= e) break; /* an earlier one is verified */
                        const uint32_t *se = sig + (size_t)H * e;
                        int eq = 0;
                        for (int h = 0; h < H; h++) eq += sd[h] == se[h];
                        cand++;
                        double jac = (double)eq / H;
                        if (jac >= cfg->threshold) {
                            ver++;
#pragma omp critical(dedup_near)
                            {
                                if (nref[d] < 0 || (uint64_t)nref[d] > e) {
                                    __atomic_store_n(&nref[d], (int64_t)e, __ATOMIC_RELAXED);
                                    nsim[d] = (float)jac;
                                }
                            }
                            break;
                        }
                    }
                }
            }
        }
    }
    stats->candidates = cand;
    stats->verified = ver;
}

st_status st_data_dedup(const char *dataset, const st_data_dedup_config *cfg_in, st_data_scores *out,
                        st_data_dedup_stats *stats, st_err *err) {
    st_data_dedup_config cfg = *cfg_in;
    memset(out, 0, sizeof *out);
    memset(stats, 0, sizeof *stats);
    st_status rc = dedup_check_config(&cfg, err);
    if (rc) return rc;
    if (cfg.max_compare < 1) cfg.max_compare = 1;
    int nt = cfg.threads > 0 ? cfg.threads : omp_get_max_threads();
    double t0 = st_now();

    st_data_source *s0;
    st_data_source_config sc = {.path = dataset, .format = ST_DATA_FORMAT_MEGATRON};
    rc = data_refuse_view(dataset, err);
    if (rc) return rc;
    rc = st_data_source_open(&s0, &sc, err);
    if (rc) return rc;
    st_data_ident ident;
    rc = data_source_ident(s0, &ident, err);
    char abs[sizeof out->dataset];
    if (!rc) rc = data_dataset_abspath(dataset, abs, sizeof abs, err);
    if (rc) {
        st_data_source_close(s0);
        return rc;
    }
    const uint64_t N = ident.n_docs;
    const int H = cfg.num_hashes;
    dedup_worker *wk = calloc((size_t)nt, sizeof *wk);
    uint32_t *A = malloc(sizeof *A * (size_t)H), *Bc = malloc(sizeof *Bc * (size_t)H);
    uint32_t *sig = malloc(sizeof *sig * (size_t)H * N);
    uint64_t(*hash)[2] = malloc(sizeof *hash * N);
    uint32_t *len = malloc(sizeof *len * N);
    int64_t *nref = malloc(sizeof *nref * N);
    float *nsim = malloc(sizeof *nsim * N);
    size_t exact_peak = 0;
    size_t mem = sizeof *sig * (size_t)H * N + sizeof *hash * N + sizeof *len * N + sizeof *nref * N +
                 sizeof *nsim * N + (size_t)nt * 2 * (CHUNK_TOKENS + 64) * sizeof(int32_t);
    if (!wk || !A || !Bc || !sig || !hash || !len || !nref || !nsim) {
        rc = st_errf(err, ST_ERR_NOMEM, "dedup: out of memory for %llu documents x %d hashes (%zu bytes)",
                     (unsigned long long)N, H, mem);
        goto done;
    }
    rc = st_data_scores_alloc(out, N, err);
    if (rc) goto done;
    out->ident = ident;
    snprintf(out->dataset, sizeof out->dataset, "%s", abs);
    snprintf(out->kind, sizeof out->kind, "dedup");
    snprintf(out->params, sizeof out->params, "ngram %d, hashes %d, bands %d x rows %d, threshold %g, seed %llu",
             cfg.ngram, H, cfg.bands, cfg.rows, cfg.threshold, (unsigned long long)cfg.seed);
    mem += 17 * N;
    for (int i = 0; i < H; i++) {
        uint64_t r = data_mix64(cfg.seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 2 + 1);
        A[i] = (uint32_t)r | 1u;
        Bc[i] = (uint32_t)(r >> 32);
    }
    for (int t = 0; t < nt && !rc; t++) {
        if (t == 0) wk[0].src = s0, s0 = NULL;
        else rc = st_data_source_open(&wk[t].src, &sc, err);
        wk[t].buf = malloc(sizeof(int32_t) * 2 * (CHUNK_TOKENS + 64));
        if (!rc && !wk[t].buf) rc = st_errf(err, ST_ERR_NOMEM, "dedup: out of memory");
    }
    if (rc) goto done;

    /* The pass: hash and signature of every document. */
    volatile int failed = 0;
    st_err first = {0};
    double t1 = st_now();
#pragma omp parallel num_threads(nt)
    {
        dedup_worker *w = &wk[omp_get_thread_num()];
        st_err e = {0};
#pragma omp for schedule(dynamic, 64)
        for (uint64_t d = 0; d < N; d++) {
            if (failed) continue;
            if (doc_pass(w, d, &cfg, A, Bc, sig + (size_t)H * d, hash[d], &len[d], &e)) {
#pragma omp critical(dedup_err)
                if (!failed) first = e, failed = 1;
            }
        }
    }
    if (failed) {
        rc = first.code ? first.code : ST_ERR_IO;
        if (err) *err = first;
        goto done;
    }
    for (uint64_t d = 0; d < N; d++) stats->n_tokens += len[d];
    stats->minhash_s = st_now() - t1;

    /* Exact duplicates. */
    t1 = st_now();
    mem += exact_peak = sizeof(hkey) * N + sizeof(int32_t) * CHUNK_TOKENS;
    if ((rc = dedup_exact(&wk[0], hash, len, N, out, stats, err))) goto done;
    stats->exact_s = st_now() - t1;

    /* Near duplicates: the bands over the threads, each thread a band at a time (its own
     * key array), over the documents that are not exact duplicates. A document's match is
     * the earliest verified one over all bands: an atomic minimum, so the result does not
     * depend on which band finds it first; a comparison with a document later than the
     * match found so far is skipped, as it could not lower it. */
    t1 = st_now();
    for (uint64_t d = 0; d < N; d++) nref[d] = -1, nsim[d] = 0;
    {
        const int nbt = nt < cfg.bands ? nt : cfg.bands;
        bkey *keys = malloc(sizeof *keys * (N ? N : 1) * (size_t)nbt);
        if (!keys) {
            rc = st_errf(err, ST_ERR_NOMEM, "dedup: out of memory for the LSH keys (%zu bytes)",
                         sizeof *keys * N * (size_t)nbt);
            goto done;
        }
        size_t kb = sizeof *keys * N * (size_t)nbt;
        if (kb > exact_peak) mem += kb - exact_peak; /* the larger of the two phases */
        dedup_near(&cfg, nbt, sig, N, keys, out, nref, nsim, stats);
        free(keys);
    }
    for (uint64_t d = 0; d < N; d++)
        if (!out->dup[d] && nref[d] >= 0) {
            out->ref[d] = nref[d], out->dup[d] = ST_DATA_DUP_NEAR, out->score[d] = nsim[d];
            stats->near++;
        }
    stats->lsh_s = st_now() - t1;
    stats->n_docs = N;
    stats->mem_bytes = mem;
    stats->total_s = st_now() - t0;
done:
    if (wk)
        for (int t = 0; t < nt; t++) {
            st_data_source_close(wk[t].src);
            free(wk[t].buf);
        }
    st_data_source_close(s0);
    free(wk);
    free(A);
    free(Bc);
    free(sig);
    free(hash);
    free(len);
    free(nref);
    free(nsim);
    if (rc) st_data_scores_free(out);
    return rc;
}

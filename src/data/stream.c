/* stream.c - one source's stream of samples: the seeded permutation per epoch and the
 * walk that packs documents into T+1-token samples across document boundaries.
 *
 * Nothing is materialised: the permutation is a Feistel network evaluated per lookup,
 * and a source's whole position is a cursor of three integers (epoch, unit, offset).
 *
 * Lookahead: an indexed source's walk needs one .idx entry (size and pointer) per
 * document, in permutation order, that is at random places of an index too large to
 * keep (12 bytes per document: 120 MB for 10^10 tokens). Read one at a time that is
 * two small preads, about 1.2 us per document, most of the producer's time. But the
 * permutation says which documents come next, so the stream reads the entries of a
 * window of upcoming positions together: sorted by document, neighbouring entries
 * share one pread (data_source_doc_runs), and once a window holds more than about one
 * entry per page of index the whole index is read sequentially: 12 x documents /
 * window bytes per document (915 for the largest source of strata bench data, about
 * 0.2 us) instead of two system calls. While one window serves lookups the next is
 * read a bounded step at a time, paced to be ready well before it is needed, so no
 * batch waits for a whole window. Memory is two windows and the sort scratch (72 bytes
 * a position, 4.7 MB per source at 65536 positions), whatever the dataset's size; the
 * samples are the same with or without the lookahead (tests/test_data.c checks). An
 * entry that disagrees with the .bin, or a document that does not start where the one
 * before it in the file ends (the window reads that entry too, 8 bytes more a position),
 * is reported when its document is used;
 * a failed read of the index is reported by the lookup whose step made it, which can
 * come before the documents it was for.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

uint64_t data_mix64(uint64_t x) {
    /* splitmix64's finaliser: a full-avalanche 64-bit mixer. */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

#define FEISTEL_ROUNDS 6

static uint64_t feistel(uint64_t x, unsigned half, uint64_t key) {
    uint64_t mask = half >= 64 ? ~0ull : (1ull << half) - 1;
    uint64_t l = x >> half, r = x & mask;
    for (int i = 0; i < FEISTEL_ROUNDS; i++) {
        uint64_t f = data_mix64(r ^ (key + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull)) & mask;
        uint64_t nl = r;
        r = l ^ f;
        l = nl;
    }
    return (l << half) | r;
}

uint64_t data_perm(uint64_t j, uint64_t n, uint64_t key) {
    if (n <= 1) return 0;
    unsigned bits = 64 - (unsigned)__builtin_clzll(n - 1); /* 2^bits >= n */
    bits += bits & 1;                                     /* balanced halves: domain < 4n */
    uint64_t x = j;
    /* Cycle-walking: the orbit of j < n under the bijection returns to [0, n), and the
     * first element found there defines a bijection on [0, n). */
    do x = feistel(x, bits / 2, key);
    while (x >= n);
    return x;
}

st_status data_stream_init(data_stream *s, st_data_source *src, int index, uint64_t seed, int T,
                           int shuffle, int64_t vocab_size, int64_t eod_token, st_err *err) {
    memset(s, 0, sizeof *s);
    s->src = src;
    s->index = index;
    s->seed = seed;
    s->T = T;
    s->shuffle = shuffle && !src->view_ordered; /* an ordered view (a curriculum) is read in its order */
    s->vocab_size = vocab_size;
    s->eod_token = eod_token;
    s->windowed = src->idx_map == NULL;
    if (s->windowed) {
        if (src->n_tokens < (uint64_t)T + 1)
            return st_errf(err, ST_ERR_INVALID,
                           "%s: %llu tokens, fewer than one sample of T+1 = %d; use a shorter T or "
                           "more data",
                           src->bin_path, (unsigned long long)src->n_tokens, T + 1);
        s->n_units = (src->n_tokens - 1) / (uint64_t)T;
    } else {
        s->n_units = data_source_n_docs(src);
        return data_stream_set_lookahead(s, DATA_LOOKAHEAD_DEFAULT, err);
    }
    return ST_OK;
}

void data_stream_free(data_stream *s) {
    for (int w = 0; w < 2; w++) {
        free(s->win[w].doc);
        free(s->win[w].len);
        free(s->win[w].ptr);
        free(s->win[w].prev_end);
    }
    free(s->la_keys);
    free(s->la_tmp);
    memset(s->win, 0, sizeof s->win);
    s->la_keys = s->la_tmp = NULL;
    s->la_cap = 0;
}

st_status data_stream_set_lookahead(data_stream *s, uint32_t cap, st_err *err) {
    data_stream_free(s);
    /* A view's documents are scattered over its base's index, so a window's entries would
     * not share preads: it looks each document up on its own. */
    if (s->windowed || cap == 0 || s->src->view_docs) return ST_OK;
    if (cap > (1u << DATA_KEY_POS_BITS)) cap = 1u << DATA_KEY_POS_BITS;
    if ((uint64_t)cap > s->n_units) cap = (uint32_t)s->n_units;
    size_t n = cap;
    int ok = 1;
    for (int w = 0; w < 2; w++) {
        s->win[w].doc = malloc(n * sizeof *s->win[w].doc);
        s->win[w].len = malloc(n * sizeof *s->win[w].len);
        s->win[w].ptr = malloc(n * sizeof *s->win[w].ptr);
        s->win[w].prev_end = s->src->unordered ? NULL : malloc(n * sizeof *s->win[w].prev_end);
        ok = ok && s->win[w].doc && s->win[w].len && s->win[w].ptr && (s->src->unordered || s->win[w].prev_end);
    }
    s->la_keys = malloc(n * sizeof *s->la_keys);
    s->la_tmp = malloc(n * sizeof *s->la_tmp);
    if (!ok || !s->la_keys || !s->la_tmp) {
        data_stream_free(s);
        return st_errf(err, ST_ERR_NOMEM, "%s: cannot allocate the index lookahead of %u documents",
                       s->src->bin_path, cap);
    }
    s->la_cap = cap;
    s->la_size = cap < DATA_LOOKAHEAD_FIRST ? cap : DATA_LOOKAHEAD_FIRST;
    return ST_OK;
}

static uint64_t perm_key(const data_stream *s, uint64_t epoch) {
    return data_mix64(s->seed ^ data_mix64(((uint64_t)s->index << 40) ^ (epoch + 0x51ed27)));
}

/* A paced view's draw g (before the pacing's end): a document among the easiest, or in the band. */
static uint64_t paced_at(const data_stream *s, uint64_t g, uint64_t P) {
    const st_data_pacing *p = &s->src->view_pace;
    const uint64_t n = s->n_units;
    double c = st_data_pacing_competence(p, (double)g / (double)P);
    uint64_t r = perm_key(s, g ^ 0x7ace5eedull);
    if (p->band > 0) {
        uint64_t w = (uint64_t)ceil(p->band * (double)n);
        if (w < 1) w = 1;
        if (w > n) w = n;
        double f = p->start < 1 ? (c - p->start) / (1 - p->start) : 1;
        uint64_t lo = (uint64_t)floor(f * (double)(n - w));
        if (lo > n - w) lo = n - w;
        return lo + r % w;
    }
    uint64_t w = (uint64_t)ceil(c * (double)n);
    if (w < 1) w = 1;
    if (w > n) w = n;
    return r % w;
}

static uint64_t unit_at(const data_stream *s, uint64_t epoch, uint64_t j) {
    if (s->src->view_pace.kind != ST_DATA_PACE_NONE && !s->windowed) {
        uint64_t n = s->n_units, P = (uint64_t)ceil(s->src->view_pace.length * (double)n), g = epoch * n + j;
        if (g < P) return paced_at(s, g, P);
        return data_perm(j, n, perm_key(s, epoch)); /* paced to the end: every document, shuffled */
    }
    if (!s->shuffle) return j;
    return data_perm(j, s->n_units, perm_key(s, epoch));
}

/* Reading a window, in stages of bounded work (a step is a fraction of a ms): the
 * documents of its positions, 1024 per step; the keys (document, slot) sorted by
 * document, one 8-bit radix pass per step; then the size entries and the pointer
 * entries, up to 16 coalesced preads or 64 KiB (one pread of at most 256 KiB) a step. */
enum { WIN_EMPTY, WIN_PERM, WIN_SORT, WIN_SIZES, WIN_PTRS, WIN_READY };
#define WIN_PERM_STEP 1024u
#define WIN_PREADS_STEP 16
#define WIN_BYTES_STEP (64u * 1024u)

static void window_start(data_stream *s, data_window *w, uint64_t epoch, uint64_t first) {
    uint64_t left = s->n_units - first;
    w->epoch = epoch;
    w->first = first;
    w->n = (uint64_t)s->la_size < left ? s->la_size : (uint32_t)left;
    w->key = perm_key(s, epoch);
    w->stage = WIN_PERM;
    w->at = 0;
    if (s->la_size < s->la_cap) s->la_size = s->la_size > s->la_cap / 4 ? s->la_cap : s->la_size * 4;
}

static st_status window_step(data_stream *s, data_window *w, st_err *err) {
    st_data_source *src = s->src;
    uint64_t *keys = s->la_keys;
    const size_t n = w->n;
    switch (w->stage) {
    case WIN_PERM: {
        uint32_t end = w->n - w->at < WIN_PERM_STEP ? w->n : w->at + WIN_PERM_STEP;
        for (uint32_t k = w->at; k < end; k++) {
            uint64_t d = s->shuffle ? data_perm(w->first + k, s->n_units, w->key) : w->first + k;
            w->doc[k] = d;
            keys[k] = d << DATA_KEY_POS_BITS | k;
        }
        src->bytes_written += 16ull * (end - w->at); /* documents and keys */
        w->at = end;
        if (end < w->n) break;
        size_t i;
        for (i = 1; i < n && keys[i - 1] <= keys[i]; i++) {}
        uint64_t max_doc = s->n_units - 1;
        int bits = max_doc ? 64 - __builtin_clzll(max_doc) : 1;
        w->passes = i >= n ? 0 : (bits + 7) / 8; /* in order already without shuffling */
        w->pass = 0;
        w->stage = w->passes ? WIN_SORT : WIN_SIZES;
        w->at = 0;
        break;
    }
    case WIN_SORT: {
        /* LSD radix sort on the document bits, stable; keys and tmp alternate. */
        const int shift = DATA_KEY_POS_BITS + 8 * w->pass;
        const uint64_t *a = w->pass % 2 ? s->la_tmp : keys;
        uint64_t *b = w->pass % 2 ? keys : s->la_tmp;
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[((a[i] >> shift) & 255) + 1]++;
        for (int k = 0; k < 256; k++) count[k + 1] += count[k];
        for (size_t i = 0; i < n; i++) b[count[(a[i] >> shift) & 255]++] = a[i];
        src->bytes_read += 16ull * n; /* two reads of the keys... */
        src->bytes_written += 8ull * n; /* ...one write */
        if (++w->pass < w->passes) break;
        if (w->passes % 2) {
            memcpy(keys, s->la_tmp, n * sizeof *keys);
            src->bytes_read += 8ull * n;
            src->bytes_written += 8ull * n;
        }
        w->stage = WIN_SIZES;
        w->at = 0;
        break;
    }
    case WIN_SIZES:
    case WIN_PTRS: {
        size_t i = w->at;
        st_status rc = data_source_doc_runs(src, keys, n, &i, w->stage == WIN_PTRS, WIN_PREADS_STEP, WIN_BYTES_STEP,
                                            w->len, w->ptr, w->prev_end, err);
        if (rc) {
            w->stage = WIN_EMPTY;
            return rc;
        }
        w->at = (uint32_t)i;
        if (i == n) w->stage = w->stage == WIN_PTRS ? WIN_READY : WIN_PTRS, w->at = 0;
        break;
    }
    default: break;
    }
    return ST_OK;
}

static int window_holds(const data_window *w, const st_data_cursor *c) {
    return w->stage == WIN_READY && c->epoch == w->epoch && c->doc >= w->first && c->doc - w->first < w->n;
}

/* The window holding the position of cursor c, reading it to the end if needed; the
 * following window is started then and advanced a step every few lookups. */
static st_status lookahead_at(data_stream *s, const st_data_cursor *c, data_window **out, st_err *err) {
    data_window *cur = &s->win[s->la_cur], *nxt = &s->win[1 - s->la_cur];
    st_status rc;
    if (!window_holds(cur, c)) {
        int nxt_here = c->epoch == nxt->epoch && c->doc >= nxt->first && c->doc - nxt->first < nxt->n;
        if (nxt->stage == WIN_EMPTY || !nxt_here) {
            /* first lookup, or a jump (set_state): start over at the cursor, small so
             * that the first batch comes quickly */
            if (s->la_size > DATA_LOOKAHEAD_FIRST) s->la_size = DATA_LOOKAHEAD_FIRST;
            window_start(s, nxt, c->epoch, c->doc);
        }
        while (nxt->stage != WIN_READY) {
            rc = window_step(s, nxt, err);
            if (rc) return rc;
        }
        s->la_cur = 1 - s->la_cur;
        cur = nxt;
        nxt = &s->win[1 - s->la_cur];
        nxt->stage = WIN_EMPTY;
        s->la_lookups = 0;
    }
    if (nxt->stage == WIN_EMPTY) {
        uint64_t epoch = cur->epoch, first = cur->first + cur->n;
        if (first >= s->n_units) epoch++, first = 0;
        window_start(s, nxt, epoch, first);
    }
    /* Pace the next window so it is read within about half of this one: its steps
     * are n/1024 for the documents, a few sort passes, and for the entries at most
     * one per WIN_BYTES_STEP of the index or per WIN_PREADS_STEP / 2 positions. */
    if (nxt->stage != WIN_READY) {
        uint64_t by_bytes = 12 * s->src->n_docs / WIN_BYTES_STEP, by_reads = 2ull * nxt->n / WIN_PREADS_STEP;
        uint64_t steps = nxt->n / WIN_PERM_STEP + 4 + (by_bytes < by_reads ? by_bytes : by_reads);
        if (++s->la_lookups > cur->n / (2 * steps)) {
            s->la_lookups = 0;
            rc = window_step(s, nxt, err);
            if (rc) return rc;
        }
    }
    *out = cur;
    return ST_OK;
}

/* Document at position cur of the permutation, and its pointer and length. */
static st_status doc_at(data_stream *s, const st_data_cursor *cur, uint64_t *d, uint64_t *ptr, uint64_t *len,
                        st_err *err) {
    st_status rc;
    if (!s->la_cap) {
        *d = unit_at(s, cur->epoch, cur->doc);
        if (s->last_valid && s->last_doc == *d) {
            *ptr = s->last_ptr, *len = s->last_len;
            return ST_OK;
        }
        rc = data_source_doc(s->src, *d, ptr, len, err);
    } else {
        data_window *w;
        rc = lookahead_at(s, cur, &w, err);
        if (rc) return rc;
        size_t k = (size_t)(cur->doc - w->first);
        *d = w->doc[k];
        if (s->last_valid && s->last_doc == *d) {
            *ptr = s->last_ptr, *len = s->last_len;
            return ST_OK;
        }
        s->src->bytes_read += w->prev_end ? 28 : 20; /* document, size, pointer (and prev_end) from the window */
        rc = data_source_doc_entry(s->src, *d, w->len[k], w->ptr[k], w->prev_end ? w->prev_end[k] : 0, ptr, len, err);
    }
    if (rc) return rc;
    s->last_doc = *d, s->last_ptr = *ptr, s->last_len = *len, s->last_valid = 1;
    return ST_OK;
}

static void next_unit(const data_stream *s, st_data_cursor *c) {
    c->offset = 0;
    if (++c->doc >= s->n_units) {
        c->doc = 0;
        c->epoch++;
    }
}

st_status data_stream_take(data_stream *s, st_data_cursor *c, int32_t *row, int32_t *starts,
                           int *n_starts, st_err *err) {
    return data_stream_take_docs(s, c, row, starts, n_starts, NULL, NULL, err);
}

/* The document a reader's position d is: a view's position is a document of its base. */
static uint64_t global_doc(const data_stream *s, uint64_t d) {
    return s->src->view_docs && d < s->src->n_view ? s->src->view_docs[d] : d;
}

st_status data_stream_take_docs(data_stream *s, st_data_cursor *c, int32_t *row, int32_t *starts,
                                int *n_starts, uint64_t *docs, uint32_t *visits, st_err *err) {
    const uint64_t T = (uint64_t)s->T;
    int ns = 0;
    st_status rc;
    if (s->windowed) {
        uint64_t w = unit_at(s, c->epoch, c->doc);
        if (docs) /* no document index: no document ids (the segments are unknown documents) */
            for (uint64_t i = 0; i <= T; i++) docs[i] = UINT64_MAX, visits[i] = (uint32_t)c->epoch;
        if (row) {
            rc = st_data_source_read(s->src, 0, w * T, T + 1, row, s->vocab_size, err);
            if (rc) return rc;
            if (s->eod_token >= 0) {
                /* Without an index, a document starts after each end-of-document token. */
                int32_t eod = (int32_t)s->eod_token;
                for (uint64_t i = 1; i <= T; i++)
                    if (row[i - 1] == eod) starts[ns++] = (int32_t)i;
            }
        }
        next_unit(s, c);
        *n_starts = ns;
        return ST_OK;
    }
    /* Indexed: walk documents in permuted order, T+1 tokens; the cursor to keep is the
     * one after the first T tokens (consecutive samples share one token). */
    st_data_cursor cur = *c, after = *c;
    uint64_t pos = 0;
    int have_after = 0;
    uint64_t guard = 0;
    while (pos < T + 1) {
        uint64_t d, ptr, len;
        rc = doc_at(s, &cur, &d, &ptr, &len, err);
        if (rc) return rc;
        if (cur.offset >= len) {
            /* Empty documents (and a cursor saved at a document's end) are stepped over;
             * the source has tokens (checked at open), so this terminates. */
            if (++guard > 2 * s->n_units + 2)
                return st_errf(err, ST_ERR_INVALID, "%s: no tokens in any document", s->src->bin_path);
            next_unit(s, &cur);
            continue;
        }
        if (docs && pos == 0) docs[0] = global_doc(s, d), visits[0] = (uint32_t)cur.epoch;
        if (cur.offset == 0 && pos > 0 && pos <= T) {
            if (docs) docs[ns + 1] = global_doc(s, d), visits[ns + 1] = (uint32_t)cur.epoch;
            starts[ns++] = (int32_t)pos;
        }
        uint64_t k = len - cur.offset;
        if (k > T + 1 - pos) k = T + 1 - pos;
        if (!have_after && pos + k > T) {
            after = cur;
            after.offset = cur.offset + (T - pos);
            have_after = 1;
        }
        if (row) {
            rc = data_source_read_at(s->src, ptr + cur.offset * (uint64_t)s->src->itemsize, k, row + pos,
                                     s->vocab_size, err);
            if (rc) return rc;
        }
        pos += k;
        cur.offset += k;
        guard = 0;
        if (cur.offset == len) next_unit(s, &cur);
    }
    *c = after;
    *n_starts = ns;
    return ST_OK;
}

double st_data_pacing_competence(const st_data_pacing *p, double t) {
    double c0 = p->start, c;
    if (t >= 1) return 1;
    if (t < 0) t = 0;
    switch (p->kind) {
    case ST_DATA_PACE_LINEAR: c = c0 + (1 - c0) * t; break;
    case ST_DATA_PACE_ROOT: c = sqrt(c0 * c0 + (1 - c0 * c0) * t); break;
    case ST_DATA_PACE_STEP: {
        double K = p->steps >= 2 ? (double)p->steps : 2;
        c = c0 + (1 - c0) * floor(K * t) / (K - 1);
        break;
    }
    default: return 1;
    }
    return c < 1 ? c : 1;
}

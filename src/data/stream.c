/* stream.c - one source's stream of samples: the seeded permutation per epoch and the
 * walk that packs documents into T+1-token samples across document boundaries.
 *
 * Nothing is materialised: the permutation is a Feistel network evaluated per lookup,
 * and a source's whole position is a cursor of three integers (epoch, unit, offset).
 */
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

st_status data_stream_init(data_stream *s, data_source *src, int index, uint64_t seed, int T,
                           int shuffle, int64_t vocab_size, int64_t eod_token, st_err *err) {
    memset(s, 0, sizeof *s);
    s->src = src;
    s->index = index;
    s->seed = seed;
    s->T = T;
    s->shuffle = shuffle;
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
        s->n_units = src->n_docs;
    }
    return ST_OK;
}

static uint64_t unit_at(const data_stream *s, uint64_t epoch, uint64_t j) {
    if (!s->shuffle) return j;
    uint64_t key = data_mix64(s->seed ^ data_mix64(((uint64_t)s->index << 40) ^ (epoch + 0x51ed27)));
    return data_perm(j, s->n_units, key);
}

static void next_unit(const data_stream *s, data_cursor *c) {
    c->offset = 0;
    if (++c->doc >= s->n_units) {
        c->doc = 0;
        c->epoch++;
    }
}

st_status data_stream_take(data_stream *s, data_cursor *c, int32_t *row, int32_t *starts,
                           int *n_starts, st_err *err) {
    const uint64_t T = (uint64_t)s->T;
    int ns = 0;
    st_status rc;
    if (s->windowed) {
        uint64_t w = unit_at(s, c->epoch, c->doc);
        if (row) {
            rc = data_source_read(s->src, 0, w * T, T + 1, row, s->vocab_size, err);
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
    data_cursor cur = *c, after = *c;
    uint64_t pos = 0;
    int have_after = 0;
    uint64_t guard = 0;
    while (pos < T + 1) {
        uint64_t d = unit_at(s, cur.epoch, cur.doc), ptr, len;
        if (s->last_valid && s->last_doc == d) {
            ptr = s->last_ptr, len = s->last_len;
        } else {
            rc = data_source_doc(s->src, d, &ptr, &len, err);
            if (rc) return rc;
            s->last_doc = d, s->last_ptr = ptr, s->last_len = len, s->last_valid = 1;
        }
        if (cur.offset >= len) {
            /* Empty documents (and a cursor saved at a document's end) are stepped over;
             * the source has tokens (checked at open), so this terminates. */
            if (++guard > 2 * s->n_units + 2)
                return st_errf(err, ST_ERR_INVALID, "%s: no tokens in any document", s->src->bin_path);
            next_unit(s, &cur);
            continue;
        }
        if (cur.offset == 0 && pos > 0 && pos <= T) starts[ns++] = (int32_t)pos;
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

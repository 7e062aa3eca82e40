/* test_data.c - the loader's stream: deterministic, the same global stream for 1, 2
 * and 4 ranks, identical after resuming at any step (also under another world size),
 * no sample repeated or skipped when the mix changes, packing boundaries right; a data
 * list checked before a run writes anything refuses what the loader would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"
#include "strata/data.h"
#include "testutil.h"

#define EOD 0
#define VOCAB 60000
#define T_ 64
#define STEPS 40

static char path_a[512], path_b[512], path_c[512];

/* Source A: packed documents of random lengths (some empty), each ending in EOD. */
static void make_sources(void) {
    st_err err = {0};
    const char *dir = test_tmpdir();
    snprintf(path_a, sizeof path_a, "%s/a", dir);
    st_data_pack_writer *w;
    CHECK(st_data_pack_open(&w, path_a, ST_DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    st_rng r;
    st_rng_seed(&r, 7);
    int32_t doc[400];
    for (int d = 0; d < 300; d++) {
        int n = (int)(st_rng_u64(&r) % 300);
        if (d % 37 == 5) n = 0; /* empty documents happen in real data */
        for (int i = 0; i < n; i++) doc[i] = 1 + (int32_t)((d * 131 + i) % 20000);
        if (n) doc[n - 1] = EOD;
        CHECK(st_data_pack_add(w, doc, (size_t)n, &err) == ST_OK, "%s", err.msg);
    }
    CHECK(st_data_pack_close(w, &err) == ST_OK, "%s", err.msg);
    /* Source B: raw uint16 with EODs sprinkled; source C: an llm.c shard. */
    snprintf(path_b, sizeof path_b, "raw16@%s/b.u16", dir); /* headerless: the format is said */
    snprintf(path_c, sizeof path_c, "%s/c.bin", dir);
    FILE *f = fopen(path_b + strlen("raw16@"), "wb");
    for (int i = 0; i < 20000; i++) {
        uint16_t t = (uint16_t)(i % 97 == 3 ? EOD : 20001 + i % 19000);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
    f = fopen(path_c, "wb");
    int32_t hdr[256] = {DATA_LLMC_MAGIC_U16, DATA_LLMC_VERSION_U16, 15000};
    fwrite(hdr, 4, 256, f);
    for (int i = 0; i < 15000; i++) {
        uint16_t t = (uint16_t)(i % 211 == 0 ? EOD : 40001 + i % 19000);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

static void base_config(st_data_loader_config *c, int B, int rank, int world) {
    st_data_loader_config_init(c);
    c->n_sources = 3;
    c->sources[0] = (st_data_source_config){.path = path_a, .weight = 0.5};
    c->sources[1] = (st_data_source_config){.path = path_b, .weight = 0.3};
    c->sources[2] = (st_data_source_config){.path = path_c, .weight = 0.2};
    c->T = T_;
    c->B = B;
    c->rank = rank;
    c->world = world;
    c->seed = 1234;
    c->vocab_size = VOCAB;
    c->eod_token = EOD;
    c->mask_eod = 1;
}

/* A copy of a batch that outlives the loader's ring. */
typedef struct rec {
    int B, T, n_seqs;
    int32_t *tok, *pos, *cu;
    uint8_t *mask, *src;
    st_data_loader_state after;
} rec;

static void rec_free(rec *r) {
    free(r->tok), free(r->pos), free(r->mask), free(r->src), free(r->cu);
    memset(r, 0, sizeof *r);
}

/* Global batches as a world of `world` ranks sees them, concatenated over ranks. */
static void run_world(int world, int Bglobal, int steps, rec *out, int prefetch) {
    int B = Bglobal / world;
    st_data_loader *dl[4];
    st_err err = {0};
    for (int r = 0; r < world; r++) {
        st_data_loader_config c;
        base_config(&c, B, r, world);
        c.prefetch = prefetch;
        CHECK(st_data_loader_open(&dl[r], &c, &err) == ST_OK, "%s", err.msg);
    }
    for (int s = 0; s < steps; s++) {
        rec *g = &out[s];
        memset(g, 0, sizeof *g);
        g->B = Bglobal, g->T = T_;
        g->tok = malloc((size_t)Bglobal * (T_ + 1) * 4);
        g->pos = malloc((size_t)Bglobal * T_ * 4);
        g->mask = malloc((size_t)Bglobal * T_);
        g->src = malloc((size_t)Bglobal);
        g->cu = malloc(((size_t)Bglobal * T_ + 1) * 4);
        g->cu[0] = 0;
        for (int r = 0; r < world; r++) {
            st_data_batch b;
            CHECK(st_data_loader_next(dl[r], &b, &err) == ST_OK, "%s", err.msg);
            CHECK(b.step == (uint64_t)s, "step %llu != %d", (unsigned long long)b.step, s);
            CHECK(b.first_sample == (uint64_t)s * Bglobal + (uint64_t)r * B, "first_sample");
            memcpy(g->tok + (size_t)r * B * (T_ + 1), b.tokens, (size_t)B * (T_ + 1) * 4);
            memcpy(g->pos + (size_t)r * B * T_, b.positions, (size_t)B * T_ * 4);
            memcpy(g->mask + (size_t)r * B * T_, b.loss_mask, (size_t)B * T_);
            memcpy(g->src + (size_t)r * B, b.source, (size_t)B);
            for (int k = 1; k <= b.n_seqs; k++) g->cu[g->n_seqs + k] = b.cu_seqlens[k] + r * B * T_;
            g->n_seqs += b.n_seqs;
            CHECK(b.cu_seqlens[0] == 0 && b.cu_seqlens[b.n_seqs] == B * T_, "cu_seqlens ends");
        }
        st_data_loader_get_state(dl[0], &g->after);
        for (int r = 1; r < world; r++) {
            st_data_loader_state o;
            st_data_loader_get_state(dl[r], &o);
            CHECK(!memcmp(&o, &g->after, sizeof o), "ranks disagree on the state at step %d", s);
        }
    }
    for (int r = 0; r < world; r++) st_data_loader_close(dl[r]);
}

static int rec_equal(const rec *a, const rec *b) {
    size_t nt = (size_t)a->B * (a->T + 1), ni = (size_t)a->B * a->T;
    return a->B == b->B && a->n_seqs == b->n_seqs && !memcmp(a->tok, b->tok, nt * 4) &&
           !memcmp(a->pos, b->pos, ni * 4) && !memcmp(a->mask, b->mask, ni) && !memcmp(a->src, b->src, (size_t)a->B) &&
           !memcmp(a->cu, b->cu, ((size_t)a->n_seqs + 1) * 4);
}

static void test_perm(void) {
    uint64_t ns[] = {1, 2, 3, 5, 16, 17, 1000, 4097};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        uint64_t n = ns[k];
        uint8_t *seen = calloc(n, 1);
        int ok = 1, moved = 0;
        for (uint64_t j = 0; j < n; j++) {
            uint64_t p = data_perm(j, n, 0xabcdef + k);
            if (p >= n || seen[p]) ok = 0;
            else seen[p] = 1;
            moved += p != j;
        }
        CHECK(ok, "data_perm is not a bijection on [0, %llu)", (unsigned long long)n);
        if (n >= 16) CHECK(moved > (int)n / 2, "data_perm of %llu moved only %d", (unsigned long long)n, moved);
        free(seen);
    }
}

/* Unshuffled single source: rows are the concatenated documents, advancing by T,
 * and the boundaries/positions/mask agree with an independent reading of the index. */
static void test_packing(void) {
    st_err err = {0};
    st_data_source *s;
    st_data_source_config sc = {.path = path_a};
    CHECK(st_data_source_open(&s, &sc, &err) == ST_OK, "%s", err.msg);
    st_data_source_info info;
    st_data_source_get_info(s, &info);
    int32_t *all = malloc(info.n_tokens * 4);
    uint8_t *start = calloc(info.n_tokens + 1, 1);
    uint64_t at = 0;
    for (uint64_t d = 0; d < info.n_docs; d++) {
        uint64_t len;
        CHECK(st_data_source_doc_len(s, d, &len, &err) == ST_OK, "%s", err.msg);
        CHECK(st_data_source_read(s, d, 0, len, all + at, VOCAB, &err) == ST_OK, "%s", err.msg);
        if (len) start[at] = 1;
        at += len;
    }
    CHECK(at == info.n_tokens, "documents sum to %llu of %llu tokens", (unsigned long long)at,
          (unsigned long long)info.n_tokens);
    st_data_source_close(s);

    st_data_loader_config c;
    base_config(&c, 3, 0, 1);
    c.n_sources = 1;
    c.no_shuffle = 1;
    c.prefetch = 2;
    st_data_loader *dl;
    CHECK(st_data_loader_open(&dl, &c, &err) == ST_OK, "%s", err.msg);
    uint64_t nsamp = (info.n_tokens - 1) / T_;
    int bad_tok = 0, bad_pos = 0, bad_mask = 0, bad_cu = 0;
    for (uint64_t step = 0; step * 3 + 3 <= nsamp; step++) {
        st_data_batch b;
        CHECK(st_data_loader_next(dl, &b, &err) == ST_OK, "%s", err.msg);
        int seg = 0;
        for (int r = 0; r < 3; r++) {
            uint64_t o = (step * 3 + r) * T_;
            bad_tok += memcmp(b.tokens + r * (T_ + 1), all + o, (T_ + 1) * 4) != 0;
            int p = 0;
            for (int t = 0; t < T_; t++) {
                if (t > 0 && start[o + t]) p = 0;
                if (t == 0 || start[o + t]) {
                    bad_cu += b.cu_seqlens[seg] != r * T_ + t;
                    seg++;
                }
                bad_pos += b.positions[r * T_ + t] != p++;
                bad_mask += b.loss_mask[r * T_ + t] != !start[o + t + 1];
                /* packed documents end in EOD: masking the new document's first target is
                 * the same as masking where the input is EOD */
                bad_mask += (all[o + t] == EOD) != !b.loss_mask[r * T_ + t];
            }
        }
        bad_cu += seg != b.n_seqs || b.cu_seqlens[seg] != 3 * T_;
    }
    CHECK(!bad_tok && !bad_pos && !bad_mask && !bad_cu, "packing: %d token rows, %d positions, %d mask, %d "
          "cu_seqlens wrong", bad_tok, bad_pos, bad_mask, bad_cu);
    st_data_loader_close(dl);
    free(all);
    free(start);
}

static void test_determinism_ranks_resume(void) {
    enum { BG = 8 };
    static rec w1[STEPS], w1b[STEPS], w2[STEPS], w4[STEPS];
    run_world(1, BG, STEPS, w1, 4);
    run_world(1, BG, STEPS, w1b, 0); /* prefetch off: same stream */
    run_world(2, BG, STEPS, w2, 3);
    run_world(4, BG, STEPS, w4, 1);
    int d1 = 0, d2 = 0, d4 = 0, srcs[3] = {0};
    for (int s = 0; s < STEPS; s++) {
        d1 += !rec_equal(&w1[s], &w1b[s]);
        d2 += !rec_equal(&w1[s], &w2[s]);
        d4 += !rec_equal(&w1[s], &w4[s]);
        for (int r = 0; r < BG; r++) srcs[w1[s].src[r]]++;
    }
    CHECK(!d1, "%d steps differ between two runs (prefetch 4 vs 0)", d1);
    CHECK(!d2, "%d steps differ between world 1 and world 2", d2);
    CHECK(!d4, "%d steps differ between world 1 and world 4", d4);
    CHECK(srcs[0] > srcs[1] && srcs[1] > srcs[2] && srcs[2] > 0, "mix counts %d %d %d do not follow 0.5/0.3/0.2",
          srcs[0], srcs[1], srcs[2]);
    /* consecutive steps differ (the stream moves) */
    CHECK(!rec_equal(&w1[0], &w1[1]), "steps 0 and 1 are identical");

    /* Resume at every step, under world 1 and under world 2 / world 4 from a world-1 state. */
    st_err err = {0};
    int bad = 0;
    for (int k = 0; k < STEPS; k++) {
        int world = 1 << (k % 3); /* 1, 2, 4 */
        st_data_loader_state st;
        if (k == 0) {
            st_data_loader *tmp;
            st_data_loader_config c;
            base_config(&c, BG, 0, 1);
            CHECK(st_data_loader_open(&tmp, &c, &err) == ST_OK, "%s", err.msg);
            st_data_loader_get_state(tmp, &st);
            st_data_loader_close(tmp);
        } else {
            st = w1[k - 1].after;
        }
        st_data_loader *dl[4];
        for (int r = 0; r < world; r++) {
            st_data_loader_config c;
            base_config(&c, BG / world, r, world);
            c.prefetch = 1 + k % 4;
            CHECK(st_data_loader_open(&dl[r], &c, &err) == ST_OK, "%s", err.msg);
            CHECK(st_data_loader_set_state(dl[r], &st, &err) == ST_OK, "%s", err.msg);
        }
        int upto = k + 3 < STEPS ? k + 3 : STEPS;
        for (int s = k; s < upto; s++) {
            for (int r = 0; r < world; r++) {
                st_data_batch b;
                CHECK(st_data_loader_next(dl[r], &b, &err) == ST_OK, "%s", err.msg);
                int Bl = BG / world;
                bad += memcmp(b.tokens, w1[s].tok + (size_t)r * Bl * (T_ + 1), (size_t)Bl * (T_ + 1) * 4) != 0;
                bad += memcmp(b.loss_mask, w1[s].mask + (size_t)r * Bl * T_, (size_t)Bl * T_) != 0;
                bad += b.step != (uint64_t)s;
            }
        }
        st_data_loader_state after;
        st_data_loader_get_state(dl[0], &after);
        bad += memcmp(&after, &w1[upto - 1].after, sizeof after) != 0;
        for (int r = 0; r < world; r++) st_data_loader_close(dl[r]);
    }
    CHECK(!bad, "%d mismatches after resuming", bad);

    /* A changed seed is refused, and so is a state for other sources. */
    st_data_loader *dl;
    st_data_loader_config c;
    base_config(&c, BG, 0, 1);
    c.seed = 99;
    CHECK(st_data_loader_open(&dl, &c, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_loader_set_state(dl, &w1[5].after, &err) == ST_ERR_INVALID && strstr(err.msg, "seed"),
          "seed mismatch not refused: %s", err.msg);
    st_data_loader_close(dl);

    for (int s = 0; s < STEPS; s++) rec_free(&w1[s]), rec_free(&w1b[s]), rec_free(&w2[s]), rec_free(&w4[s]);
}

/* The reference stream of source i: its samples in order, straight from the stream. */
static int32_t *reference_samples(int i, int n) {
    st_data_loader_config c;
    base_config(&c, 1, 0, 1);
    st_err err = {0};
    st_data_source *s;
    CHECK(st_data_source_open(&s, &c.sources[i], &err) == ST_OK, "%s", err.msg);
    data_stream ds;
    CHECK(data_stream_init(&ds, s, i, c.seed, T_, 1, VOCAB, EOD, &err) == ST_OK, "%s", err.msg);
    int32_t *out = malloc((size_t)n * (T_ + 1) * 4), starts[T_ + 2];
    st_data_cursor cur = {0, 0, 0};
    for (int k = 0; k < n; k++) {
        int ns;
        CHECK(data_stream_take(&ds, &cur, out + (size_t)k * (T_ + 1), starts, &ns, &err) == ST_OK, "%s", err.msg);
    }
    data_stream_free(&ds);
    st_data_source_close(s);
    return out;
}

/* Weights change by schedule (one source off for a while), then by hand at a resume:
 * each source's rows must be exactly its own stream, in order, without gaps. */
static void test_mix_change(void) {
    enum { BG = 6, S1 = 30, S2 = 30 };
    st_data_schedule_entry sched[3] = {
        {.start_step = 0, .weights = {0.5, 0.3, 0.2}},
        {.start_step = 10, .weights = {0.1, 0.0, 0.9}},
        {.start_step = 20, .weights = {1, 1, 1}},
    };
    st_err err = {0};
    int32_t *ref[3];
    for (int i = 0; i < 3; i++) ref[i] = reference_samples(i, (S1 + S2) * BG);
    int taken[3] = {0}, bad = 0, b_in_off = 0;
    st_data_loader_config c;
    base_config(&c, BG / 2, 1, 2); /* rank 1 of 2 sees half the rows; rank 0 checks the rest */
    st_data_loader *dl[2];
    for (int r = 0; r < 2; r++) {
        base_config(&c, BG / 2, r, 2);
        c.schedule = sched;
        c.n_schedule = 3;
        CHECK(st_data_loader_open(&dl[r], &c, &err) == ST_OK, "%s", err.msg);
    }
    st_data_loader_state st;
    for (int s = 0; s < S1; s++)
        for (int r = 0; r < 2; r++) {
            st_data_batch b;
            CHECK(st_data_loader_next(dl[r], &b, &err) == ST_OK, "%s", err.msg);
            for (int row = 0; row < b.B; row++) {
                int i = b.source[row];
                if (s >= 10 && s < 20 && i == 1) b_in_off++;
                bad += memcmp(b.tokens + row * (T_ + 1), ref[i] + (size_t)taken[i]++ * (T_ + 1), (T_ + 1) * 4) != 0;
            }
        }
    st_data_loader_get_state(dl[0], &st);
    for (int r = 0; r < 2; r++) st_data_loader_close(dl[r]);
    CHECK(b_in_off == 0, "source 1 had weight 0 for steps 10-19 but gave %d rows", b_in_off);
    /* Resume with a new mix, by hand, on one rank. */
    base_config(&c, BG, 0, 1);
    c.sources[0].weight = 0.05, c.sources[1].weight = 0.9, c.sources[2].weight = 0.05;
    c.schedule_version = 2;
    st_data_loader *d1;
    CHECK(st_data_loader_open(&d1, &c, &err) == ST_OK, "%s", err.msg);
    st_log_set_level(0);
    CHECK(st_data_loader_set_state(d1, &st, &err) == ST_OK, "%s", err.msg);
    st_log_set_level(1);
    for (int s = 0; s < S2; s++) {
        st_data_batch b;
        CHECK(st_data_loader_next(d1, &b, &err) == ST_OK, "%s", err.msg);
        for (int row = 0; row < b.B; row++) {
            int i = b.source[row];
            bad += memcmp(b.tokens + row * (T_ + 1), ref[i] + (size_t)taken[i]++ * (T_ + 1), (T_ + 1) * 4) != 0;
        }
    }
    st_data_loader_state end;
    st_data_loader_get_state(d1, &end);
    CHECK(end.schedule_version == 2, "schedule version %u", end.schedule_version);
    st_data_loader_close(d1);
    CHECK(!bad, "%d rows are not the next sample of their source (repeat or skip)", bad);
    CHECK(taken[0] + taken[1] + taken[2] == (S1 + S2) * BG, "rows %d %d %d", taken[0], taken[1], taken[2]);
    for (int i = 0; i < 3; i++) free(ref[i]);
}

/* Shuffled indexed source: one epoch visits every document exactly once. */
static void test_epoch_coverage(void) {
    st_err err = {0};
    st_data_source *s;
    st_data_source_config sc = {.path = path_a};
    CHECK(st_data_source_open(&s, &sc, &err) == ST_OK, "%s", err.msg);
    data_stream ds;
    CHECK(data_stream_init(&ds, s, 0, 5, T_, 1, VOCAB, EOD, &err) == ST_OK, "%s", err.msg);
    /* Sum of tokens across one epoch of samples equals the source's total, in a
     * different order than the file. */
    uint64_t toks = 0;
    int32_t row[T_ + 1], starts[T_ + 2];
    st_data_cursor cur = {0, 0, 0};
    uint64_t h_stream = 0, h_file = 0;
    int32_t *all = malloc(s->n_tokens * 4);
    uint64_t at = 0;
    for (uint64_t d = 0; d < s->n_docs; d++) {
        uint64_t len;
        st_data_source_doc_len(s, d, &len, &err);
        st_data_source_read(s, d, 0, len, all + at, 0, &err);
        at += len;
    }
    for (uint64_t i = 0; i < s->n_tokens; i++) h_file += data_mix64((uint64_t)all[i]);
    while (cur.epoch == 0) {
        int ns;
        CHECK(data_stream_take(&ds, &cur, row, starts, &ns, &err) == ST_OK, "%s", err.msg);
        for (int t = 0; t < T_ && toks < s->n_tokens; t++, toks++) h_stream += data_mix64((uint64_t)row[t]);
    }
    CHECK(h_stream == h_file, "one shuffled epoch is not a permutation of the documents' tokens");
    free(all);
    data_stream_free(&ds);
    st_data_source_close(s);
}

/* The index lookahead (windows of entries read together, the next window read a step
 * at a time) against one lookup per document (cap 0, the reference): the same samples,
 * document starts and cursors, for window sizes from 1 to more than the source, with
 * and without shuffling, across epochs and after jumps of the cursor (resume). */
static void test_lookahead(void) {
    st_err err = {0};
    char path[600];
    snprintf(path, sizeof path, "%s/many", test_tmpdir());
    st_data_pack_writer *w;
    CHECK(st_data_pack_open(&w, path, ST_DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    st_rng r;
    st_rng_seed(&r, 11);
    int32_t doc[64];
    enum { NDOC = 3000 };
    for (int d = 0; d < NDOC; d++) {
        int n = (int)(st_rng_u64(&r) % 40);
        if (d % 53 == 7) n = 0;
        for (int i = 0; i < n; i++) doc[i] = 1 + (int32_t)((d * 7 + i) % 50000);
        CHECK(st_data_pack_add(w, doc, (size_t)n, &err) == ST_OK, "%s", err.msg);
    }
    CHECK(st_data_pack_close(w, &err) == ST_OK, "%s", err.msg);
    st_data_source_config sc = {.path = path};
    st_data_source *ref_src, *src;
    CHECK(st_data_source_open(&ref_src, &sc, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_source_open(&src, &sc, &err) == ST_OK, "%s", err.msg);
    /* Entries read together are the entries read one by one. */
    {
        enum { K = 500 };
        uint64_t keys[K];
        int32_t len[K];
        int64_t ptr[K], prev_end[K];
        for (int k = 0; k < K; k++) keys[k] = (uint64_t)(k * 6 + k % 5) << DATA_KEY_POS_BITS | (uint64_t)k;
        CHECK(data_source_doc_batch(src, keys, K, len, ptr, prev_end, &err) == ST_OK, "%s", err.msg);
        int bad = 0;
        for (int k = 0; k < K; k++) {
            uint64_t p, l, pp = 0, pl = 0, d = (uint64_t)(k * 6 + k % 5);
            CHECK(data_source_doc(ref_src, d, &p, &l, &err) == ST_OK, "%s", err.msg);
            if (d) CHECK(data_source_doc(ref_src, d - 1, &pp, &pl, &err) == ST_OK, "%s", err.msg);
            bad += p != (uint64_t)ptr[k] || l != (uint64_t)len[k] || (uint64_t)prev_end[k] != pp + 2 * pl;
        }
        CHECK(!bad, "%d batched index entries differ from single lookups", bad);
    }
    enum { TT = 48, N = 2800 }; /* about 2.3 epochs of ~58k tokens */
    const uint32_t caps[] = {1, 2, 7, 64, 1000, 2999, 5000, DATA_LOOKAHEAD_DEFAULT};
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        data_stream ref;
        CHECK(data_stream_init(&ref, ref_src, 0, 99, TT, shuffle, VOCAB, -1, &err) == ST_OK, "%s", err.msg);
        CHECK(data_stream_set_lookahead(&ref, 0, &err) == ST_OK, "%s", err.msg);
        int32_t *rows = malloc((size_t)N * (TT + 1) * 4), *st = malloc((size_t)N * (TT + 1) * 4);
        int nst[N];
        st_data_cursor curs[N + 1], c = {0, 0, 0};
        for (int k = 0; k < N; k++) {
            curs[k] = c;
            CHECK(data_stream_take(&ref, &c, rows + (size_t)k * (TT + 1), st + (size_t)k * (TT + 1), &nst[k], &err) ==
                      ST_OK, "%s", err.msg);
        }
        curs[N] = c;
        CHECK(c.epoch >= 2, "the reference covers %llu epochs", (unsigned long long)c.epoch);
        for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
            data_stream ds;
            CHECK(data_stream_init(&ds, src, 0, 99, TT, shuffle, VOCAB, -1, &err) == ST_OK, "%s", err.msg);
            CHECK(data_stream_set_lookahead(&ds, caps[ci], &err) == ST_OK, "%s", err.msg);
            int32_t row[TT + 1], starts[TT + 1];
            int bad = 0, ns;
            /* straight through, then resumed at a few cursors (forward and back) */
            const int from[] = {0, 1913, 17, 1250, 2799};
            for (size_t f = 0; f < sizeof from / sizeof from[0]; f++) {
                st_data_cursor d = curs[from[f]];
                for (int k = from[f]; k < N && k < from[f] + (f ? 120 : N); k++) {
                    CHECK(data_stream_take(&ds, &d, row, starts, &ns, &err) == ST_OK, "%s", err.msg);
                    bad += memcmp(row, rows + (size_t)k * (TT + 1), sizeof row) != 0 || ns != nst[k] ||
                           memcmp(starts, st + (size_t)k * (TT + 1), (size_t)ns * 4) != 0 ||
                           memcmp(&d, &curs[k + 1], sizeof d) != 0;
                    if (k % 3 == 0) { /* rows of other ranks: stepped over without reading */
                        st_data_cursor e = curs[k];
                        CHECK(data_stream_take(&ds, &e, NULL, starts, &ns, &err) == ST_OK, "%s", err.msg);
                        bad += memcmp(&e, &curs[k + 1], sizeof e) != 0;
                    }
                }
            }
            CHECK(!bad, "lookahead %u, shuffle %d: %d samples differ from one lookup per document", caps[ci], shuffle,
                  bad);
            data_stream_free(&ds);
        }
        data_stream_free(&ref);
        free(rows);
        free(st);
    }
    st_data_source_close(ref_src);
    st_data_source_close(src);
}

/* st_data_list_check: what the loader refuses, refused at the check, naming the key and the
 * file; a good list and "embedded" pass; st_data_list_parse cuts paths and weights. */
static void test_list_check(void) {
    st_err err = {0};
    char list[2048], junk[600], dir[600];
    snprintf(list, sizeof list, "%s:0.5,%s,%s:2", path_a, path_b, path_c);
    CHECK(st_data_list_check("data", list, T_, VOCAB, &err) == ST_OK, "a good list: %s", err.msg);
    CHECK(st_data_list_check("data", "embedded", T_, 0, &err) == ST_OK, "embedded: %s", err.msg);
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    CHECK(st_data_list_parse(&c, list, "data", &err) == ST_OK, "%s", err.msg);
    CHECK(c.n_sources == 3 && !strcmp(c.sources[0].path, path_a) && c.sources[0].weight == 0.5 &&
              !strcmp(c.sources[1].path, path_b) && c.sources[1].weight == 1.0 && c.sources[2].weight == 2.0,
          "parse: %d sources", c.n_sources);
    /* a file of no known format, a missing one, a directory, a bad weight, too short for a row */
    snprintf(junk, sizeof junk, "%s/junk.bin", test_tmpdir());
    FILE *f = fopen(junk, "wb");
    fputs("not tokens, no header!", f); /* 22 bytes: 11 uint16 tokens */
    fclose(f);
    snprintf(list, sizeof list, "%s,%s", path_a, junk);
    CHECK(st_data_list_check("val_data", list, T_, VOCAB, &err) != ST_OK && strstr(err.msg, "key 'val_data'") &&
              strstr(err.msg, "junk.bin") && strstr(err.msg, "raw16@"),
          "unknown format: %s", err.msg);
    snprintf(list, sizeof list, "%s/missing.bin", test_tmpdir());
    CHECK(st_data_list_check("data", list, T_, VOCAB, &err) == ST_ERR_IO && strstr(err.msg, "missing.bin: cannot open"),
          "missing file: %s", err.msg);
    snprintf(dir, sizeof dir, "%s", test_tmpdir());
    snprintf(list, sizeof list, "raw16@%s", dir);
    CHECK(st_data_list_check("data", list, T_, VOCAB, &err) == ST_ERR_INVALID && strstr(err.msg, "is a directory"),
          "a directory: %s", err.msg);
    snprintf(list, sizeof list, "%s:-1", path_a);
    CHECK(st_data_list_check("data", list, T_, VOCAB, &err) == ST_ERR_INVALID && strstr(err.msg, "weight '-1'"),
          "negative weight: %s", err.msg);
    snprintf(list, sizeof list, "raw16@%s", junk);
    CHECK(st_data_list_check("data", list, T_, VOCAB, &err) == ST_ERR_INVALID && strstr(err.msg, "fewer than one sample"),
          "too short for a row: %s", err.msg);
    CHECK(st_data_list_check("data", ",", T_, VOCAB, &err) == ST_ERR_INVALID && strstr(err.msg, "is empty"),
          "empty list: %s", err.msg);
    /* a sidecar saying vocab_size 600: refused under 600, taken at 600 */
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s/side", test_tmpdir());
    st_data_pack_writer *w;
    CHECK(st_data_pack_open(&w, prefix, ST_DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    int32_t doc[100];
    for (int i = 0; i < 100; i++) doc[i] = i;
    st_data_pack_meta meta = {.vocab_size = 600, .eod = 0, .tokenizer = "test"};
    CHECK(st_data_pack_add(w, doc, 100, &err) == ST_OK && st_data_pack_set_meta(w, &meta, &err) == ST_OK &&
              st_data_pack_close(w, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_list_check("data", prefix, 16, 599, &err) == ST_ERR_INVALID && strstr(err.msg, "side.json") &&
              strstr(err.msg, "600"),
          "sidecar vocab 600 with vocab_size 599: %s", err.msg);
    CHECK(st_data_list_check("data", prefix, 16, 600, &err) == ST_OK, "sidecar vocab 600: %s", err.msg);
}

int main(void) {
    make_sources();
    test_list_check();
    test_lookahead();
    test_perm();
    test_packing();
    test_determinism_ranks_resume();
    test_mix_change();
    test_epoch_coverage();
    return test_finish("data");
}

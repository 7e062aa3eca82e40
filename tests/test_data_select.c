/* test_data_select.c - score files, deduplication and views through the library: a view
 * read by the loader yields exactly its documents' tokens (each token names its document),
 * an ordered view is read in its order, views mix with weights; deduplication finds planted
 * exact and near copies pointing at the earliest original, the same on 1 and 2 threads;
 * and every bad input is refused naming the file and key, leaving no file behind: fraction
 * outside (0, 1], band low > high, empty selection, NaN scores, a score file of another
 * dataset, a base that changed (re-packed, or a token edited in place), a damaged view. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "strata/data.h"
#include "testutil.h"

#define NDOC 40

static char pb[8][600];
static const char *tp(int slot, const char *name) {
    snprintf(pb[slot], sizeof pb[slot], "%s/%s", test_tmpdir(), name);
    return pb[slot];
}
static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}
/* No "*.tmp.*" left in the test directory (the crash-safe writer's temporaries). */
static int no_temporaries(void) {
    DIR *d = opendir(test_tmpdir());
    struct dirent *e;
    int ok = 1;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) ok = 0;
    if (d) closedir(d);
    return ok;
}

/* Document d: 20 + d tokens, each d * 100 + (k % 50): its tokens name it. extra adds a
 * document (a re-packed base). */
static void pack_base(const char *prefix, int extra) {
    st_err err = {0};
    st_data_pack_writer *w;
    CHECK(st_data_pack_open(&w, prefix, ST_DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    int32_t t[200];
    for (int d = 0; d < NDOC + extra; d++) {
        for (int k = 0; k < 20 + d; k++) t[k] = d * 100 + k % 50;
        CHECK(st_data_pack_add(w, t, (size_t)(20 + d), &err) == ST_OK, "%s", err.msg);
    }
    CHECK(st_data_pack_close(w, &err) == ST_OK, "%s", err.msg);
}

/* Which documents a loader over sources yields (tokens / 100) in order of first sight. */
static int read_docs(st_data_source_config *src, int n_src, int shuffle, int *order, int *seen) {
    st_err err = {0};
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    c.n_sources = n_src;
    for (int i = 0; i < n_src; i++) c.sources[i] = src[i];
    c.T = 16, c.B = 2, c.prefetch = 0, c.no_shuffle = !shuffle, c.seed = 5;
    st_data_loader *dl;
    if (st_data_loader_open(&dl, &c, &err)) {
        fprintf(stderr, "loader: %s\n", err.msg);
        return -1;
    }
    int n = 0;
    memset(seen, 0, sizeof(int) * (NDOC + 8));
    for (int step = 0; step < 120; step++) {
        st_data_batch b;
        if (st_data_loader_next(dl, &b, &err)) {
            fprintf(stderr, "next: %s\n", err.msg);
            n = -1;
            break;
        }
        for (int i = 0; i < b.B * (b.T + 1); i++) {
            int d = b.tokens[i] / 100;
            if (d < 0 || d >= NDOC + 8) continue;
            if (!seen[d] && order) order[n] = d;
            if (!seen[d]) n++;
            seen[d]++;
        }
    }
    st_data_loader_close(dl);
    return n;
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
}

static void views(void) {
    st_err err = {0};
    const char *base = tp(0, "base");
    pack_base(base, 0);
    /* scores: even documents low (d), odd ones high (1000 - d) */
    char txt[4096];
    size_t o = 0;
    for (int d = 0; d < NDOC; d++) o += (size_t)snprintf(txt + o, sizeof txt - o, "%g\n", d % 2 ? 1000.0 - d : (double)d);
    write_text(tp(1, "scores.txt"), txt);
    st_data_scores sc;
    CHECK(st_data_scores_from_text(tp(1, "scores.txt"), base, &sc, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_scores_write(tp(2, "s.scores"), &sc, &err) == ST_OK, "%s", err.msg);
    st_data_scores_free(&sc);

    st_data_select_config c = {.dataset = base, .scores = tp(2, "s.scores"), .keep = ST_DATA_KEEP_LOWEST, .fraction = 0.5};
    st_data_view_info vi;
    CHECK(st_data_select(tp(3, "low.view"), &c, &vi, &err) == ST_OK, "%s", err.msg);
    long want_tokens = 0;
    for (int d = 0; d < NDOC; d += 2) want_tokens += 20 + d;
    CHECK(vi.n_kept == NDOC / 2 && (long)vi.kept_tokens == want_tokens, "kept %llu docs %llu tokens",
          (unsigned long long)vi.n_kept, (unsigned long long)vi.kept_tokens);
    int seen[NDOC + 8], order[NDOC + 8];
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        st_data_source_config s = {.path = tp(3, "low.view"), .weight = 1};
        int n = read_docs(&s, 1, shuffle, NULL, seen);
        int only_even = 1;
        for (int d = 0; d < NDOC + 8; d++)
            if ((d % 2 || d >= NDOC) ? seen[d] != 0 : seen[d] == 0) only_even = 0;
        CHECK(n == NDOC / 2 && only_even, "shuffle %d: the view's loader saw %d documents, not exactly the even ones",
              shuffle, n);
    }
    /* highest: the odd ones; descending order read in order (not shuffled) */
    c.keep = ST_DATA_KEEP_HIGHEST, c.order = ST_DATA_ORDER_DESCENDING;
    CHECK(st_data_select(tp(4, "high.view"), &c, &vi, &err) == ST_OK, "%s", err.msg);
    {
        st_data_source_config s = {.path = tp(4, "high.view"), .weight = 1};
        int n = read_docs(&s, 1, 1, order, seen);
        int in_order = n == NDOC / 2;
        for (int i = 0; in_order && i < n; i++) in_order = order[i] == 2 * i + 1; /* 1000-d: highest first is d=1 */
        CHECK(in_order, "descending view not read in its order (n %d, first %d %d %d)", n, order[0], order[1], order[2]);
    }
    /* two views mixed with weights: both sets, nothing else */
    {
        st_data_source_config s[2] = {{.path = tp(3, "low.view"), .weight = 0.7}, {.path = tp(4, "high.view"), .weight = 0.3}};
        int n = read_docs(s, 2, 1, NULL, seen);
        CHECK(n == NDOC, "mixing two views saw %d documents of %d", n, NDOC);
    }
    /* band: quantiles [0.25, 0.75) of the ranked scores: even docs 20..38 and odd 39..21 */
    c.keep = ST_DATA_KEEP_BAND, c.band_lo = 0.25, c.band_hi = 0.75, c.order = ST_DATA_ORDER_BASE;
    CHECK(st_data_select(tp(5, "band.view"), &c, &vi, &err) == ST_OK && vi.n_kept == NDOC / 2, "%s (kept %llu)",
          err.msg, (unsigned long long)vi.n_kept);

    /* a loader state saved on one view is refused on another of as many documents and
     * tokens: documents {0, 3} and {1, 2} hold 43 tokens each */
    {
        write_text(tp(5, "a.txt"), "0\n9\n9\n0\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n"
                                   "9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n");
        write_text(tp(6, "b.txt"), "9\n0\n0\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n"
                                   "9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n9\n");
        const char *names[2][3] = {{"a.txt", "a.scores", "a.view"}, {"b.txt", "b.scores", "b.view"}};
        st_data_loader *dl[2] = {NULL, NULL};
        for (int v = 0; v < 2; v++) {
            char t[600], sp[600], vp[600];
            snprintf(t, sizeof t, "%s", tp(7, names[v][0]));
            snprintf(sp, sizeof sp, "%s", tp(7, names[v][1]));
            snprintf(vp, sizeof vp, "%s", tp(7, names[v][2]));
            CHECK(st_data_scores_from_text(t, base, &sc, &err) == ST_OK && st_data_scores_write(sp, &sc, &err) == ST_OK,
                  "%s", err.msg);
            st_data_scores_free(&sc);
            st_data_select_config b = {.dataset = base, .scores = sp, .keep = ST_DATA_KEEP_LOWEST, .fraction = 0.05};
            CHECK(st_data_select(vp, &b, &vi, &err) == ST_OK && vi.n_kept == 2 && vi.kept_tokens == 43, "%s (%llu %llu)",
                  err.msg, (unsigned long long)vi.n_kept, (unsigned long long)vi.kept_tokens);
            st_data_loader_config lc;
            st_data_loader_config_init(&lc);
            lc.n_sources = 1, lc.sources[0] = (st_data_source_config){.path = vp, .weight = 1};
            lc.T = 8, lc.B = 1, lc.prefetch = 0;
            CHECK(st_data_loader_open(&dl[v], &lc, &err) == ST_OK, "%s", err.msg);
        }
        if (dl[0] && dl[1]) {
            st_data_batch bt;
            st_data_loader_state ls;
            CHECK(st_data_loader_next(dl[0], &bt, &err) == ST_OK, "%s", err.msg);
            st_data_loader_get_state(dl[0], &ls);
            CHECK(st_data_loader_set_state(dl[1], &ls, &err) != ST_OK && strstr(err.msg, "b.view"),
                  "a state of view a accepted by view b: %s", err.msg);
            CHECK(st_data_loader_set_state(dl[0], &ls, &err) == ST_OK, "%s", err.msg);
        }
        st_data_loader_close(dl[0]);
        st_data_loader_close(dl[1]);
    }

    /* bad input: refused naming the key, no file, no temporary */
    const double bad_fraction[] = {0, -0.25, 1.5, NAN};
    for (int i = 0; i < 4; i++) {
        st_data_select_config b = c;
        b.keep = ST_DATA_KEEP_LOWEST, b.fraction = bad_fraction[i];
        st_status rc = st_data_select(tp(6, "bad.view"), &b, &vi, &err);
        CHECK(rc != ST_OK && strstr(err.msg, "fraction") && strstr(err.msg, "bad.view") && !exists(tp(6, "bad.view")),
              "fraction %g: %s", bad_fraction[i], err.msg);
    }
    {
        st_data_select_config b = c;
        b.band_lo = 0.8, b.band_hi = 0.2;
        CHECK(st_data_select(tp(6, "bad.view"), &b, &vi, &err) != ST_OK && strstr(err.msg, "band") &&
                  strstr(err.msg, "low 0.8 > high 0.2") && !exists(tp(6, "bad.view")),
              "band low > high: %s", err.msg);
        b.band_lo = 0.5, b.band_hi = 0.5;
        CHECK(st_data_select(tp(6, "bad.view"), &b, &vi, &err) != ST_OK && strstr(err.msg, "empty") &&
                  !exists(tp(6, "bad.view")),
              "empty band: %s", err.msg);
        b.keep = ST_DATA_KEEP_LOWEST, b.fraction = 0.01; /* 0.4 of a document rounds to none */
        CHECK(st_data_select(tp(6, "bad.view"), &b, &vi, &err) != ST_OK && strstr(err.msg, "empty") &&
                  !exists(tp(6, "bad.view")),
              "empty fraction: %s", err.msg);
    }
    /* NaN: refused at import (naming the line) and in a score file (naming the document) */
    write_text(tp(6, "nan.txt"), "1\n2\nnan\n");
    CHECK(st_data_scores_from_text(tp(6, "nan.txt"), base, &sc, &err) != ST_OK && strstr(err.msg, "nan.txt") &&
              strstr(err.msg, "line 3"),
          "NaN text: %s", err.msg);
    CHECK(st_data_scores_from_text(tp(1, "scores.txt"), base, &sc, &err) == ST_OK, "%s", err.msg);
    sc.score[7] = NAN;
    CHECK(st_data_scores_write(tp(6, "nan.scores"), &sc, &err) == ST_OK, "%s", err.msg);
    st_data_scores_free(&sc);
    {
        st_data_select_config b = c;
        b.scores = tp(6, "nan.scores");
        b.keep = ST_DATA_KEEP_LOWEST, b.fraction = 0.5;
        CHECK(st_data_select(tp(7, "bad.view"), &b, &vi, &err) != ST_OK && strstr(err.msg, "nan.scores") &&
                  strstr(err.msg, "document 7") && strstr(err.msg, "NaN") && !exists(tp(7, "bad.view")),
              "NaN score: %s", err.msg);
    }
    /* a refused select leaves an existing view as it was */
    {
        size_t n0, n1;
        unsigned char *before = test_slurp(tp(3, "low.view"), &n0);
        st_data_select_config b = c;
        b.keep = ST_DATA_KEEP_LOWEST, b.fraction = 2;
        CHECK(st_data_select(tp(3, "low.view"), &b, &vi, &err) != ST_OK, "fraction 2 accepted");
        unsigned char *after = test_slurp(tp(3, "low.view"), &n1);
        CHECK(before && after && n0 == n1 && !memcmp(before, after, n0), "a refused select changed the view");
        free(before);
        free(after);
    }
    CHECK(no_temporaries(), "a temporary file was left behind");

    /* a score file for another dataset */
    const char *other = tp(7, "other");
    pack_base(other, 1);
    CHECK(st_data_scores_read(tp(2, "s.scores"), other, &sc, &err) != ST_OK && strstr(err.msg, "s.scores") &&
              strstr(err.msg, "other"),
          "score file of another dataset: %s", err.msg);
    {
        st_data_select_config b = {.dataset = other, .scores = tp(2, "s.scores"), .keep = ST_DATA_KEEP_LOWEST, .fraction = 0.5};
        CHECK(st_data_select(tp(6, "bad.view"), &b, &vi, &err) != ST_OK && strstr(err.msg, "s.scores") &&
                  strstr(err.msg, "other") && !exists(tp(6, "bad.view")),
              "select with another dataset's scores: %s", err.msg);
    }

    /* the base changes: a byte of a token edited in place, then re-packed with one more document */
    st_data_source *s;
    st_data_source_config vs = {.path = tp(3, "low.view")};
    CHECK(st_data_source_open(&s, &vs, &err) == ST_OK, "%s", err.msg);
    st_data_source_close(s);
    {
        char bin[700];
        snprintf(bin, sizeof bin, "%s.bin", base);
        FILE *f = fopen(bin, "r+b");
        fseek(f, 101, SEEK_SET);
        fputc(0x55, f);
        fclose(f);
        CHECK(st_data_source_open(&s, &vs, &err) != ST_OK && strstr(err.msg, "low.view") && strstr(err.msg, "base") &&
                  strstr(err.msg, "CRC"),
              "a token edited in the base: %s", err.msg);
        pack_base(base, 1);
        CHECK(st_data_source_open(&s, &vs, &err) != ST_OK && strstr(err.msg, "low.view") && strstr(err.msg, "base"),
              "a re-packed base: %s", err.msg);
        CHECK(st_data_view_inspect(tp(3, "low.view"), 1, &vi, &err) != ST_OK, "inspect of a changed base accepted");
        CHECK(st_data_view_inspect(tp(3, "low.view"), 0, &vi, &err) == ST_OK && vi.n_kept == NDOC / 2, "%s", err.msg);
    }
    /* a damaged view: one byte of its ids flipped; truncated */
    {
        size_t n;
        unsigned char *b = test_slurp(tp(4, "high.view"), &n);
        b[n - 8] ^= 1;
        FILE *f = fopen(tp(6, "damaged.view"), "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        st_data_source_config ds = {.path = tp(6, "damaged.view")};
        CHECK(st_data_source_open(&s, &ds, &err) != ST_OK && strstr(err.msg, "damaged.view") && strstr(err.msg, "CRC"),
              "damaged view: %s", err.msg);
        f = fopen(tp(6, "damaged.view"), "wb");
        fwrite(b, 1, n - 20, f);
        fclose(f);
        CHECK(st_data_source_open(&s, &ds, &err) != ST_OK && strstr(err.msg, "damaged.view") && strstr(err.msg, "truncated"),
              "truncated view: %s", err.msg);
        free(b);
    }
}

/* Planted duplicates: each points at the earliest original; 1 and 2 threads agree. */
static void dedup(void) {
    st_err err = {0};
    const char *ds = tp(0, "dup");
    st_data_pack_writer *w;
    CHECK(st_data_pack_open(&w, ds, ST_DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    enum { N = 30, L = 300 };
    static int32_t docs[N][L];
    uint64_t r = 12345;
    for (int d = 0; d < N; d++)
        for (int k = 0; k < L; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            docs[d][k] = (int32_t)((r >> 33) % 1000);
        }
    /* 20 = copy of 3; 22 = copy of 20 (so of 3); 24 = 5 with 3 tokens changed; 26 = 24 with 2
     * more changed (near 5); 28 = 7 with half its tokens changed (not a duplicate) */
    memcpy(docs[20], docs[3], sizeof docs[3]);
    memcpy(docs[22], docs[20], sizeof docs[3]);
    memcpy(docs[24], docs[5], sizeof docs[5]);
    docs[24][10] = 5000, docs[24][150] = 5001, docs[24][290] = 5002;
    memcpy(docs[26], docs[24], sizeof docs[5]);
    docs[26][70] = 5003, docs[26][200] = 5004;
    memcpy(docs[28], docs[7], sizeof docs[7]);
    for (int k = 0; k < L; k += 2) docs[28][k] = 6000 + k;
    for (int d = 0; d < N; d++) CHECK(st_data_pack_add(w, docs[d], L, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_pack_close(w, &err) == ST_OK, "%s", err.msg);
    st_data_dedup_config c;
    st_data_dedup_config_init(&c);
    st_data_scores a, b;
    st_data_dedup_stats st;
    c.threads = 1;
    CHECK(st_data_dedup(ds, &c, &a, &st, &err) == ST_OK, "%s", err.msg);
    c.threads = 2;
    CHECK(st_data_dedup(ds, &c, &b, &st, &err) == ST_OK, "%s", err.msg);
    if (test_failures) return;
    CHECK(a.dup[20] == ST_DATA_DUP_EXACT && a.ref[20] == 3 && a.score[20] == 1, "20: %d of %lld", a.dup[20], (long long)a.ref[20]);
    CHECK(a.dup[22] == ST_DATA_DUP_EXACT && a.ref[22] == 3, "22: %d of %lld (the earliest is 3)", a.dup[22], (long long)a.ref[22]);
    CHECK(a.dup[24] == ST_DATA_DUP_NEAR && a.ref[24] == 5 && a.score[24] > 0.8 && a.score[24] < 1, "24: %d of %lld (%g)",
          a.dup[24], (long long)a.ref[24], a.score[24]);
    CHECK(a.dup[26] == ST_DATA_DUP_NEAR && a.ref[26] == 5, "26: %d of %lld (the earliest is 5)", a.dup[26], (long long)a.ref[26]);
    int others = 0;
    for (int d = 0; d < N; d++)
        if (d != 20 && d != 22 && d != 24 && d != 26) others += a.dup[d] != 0 || a.ref[d] != -1;
    CHECK(others == 0 && st.exact == 2 && st.near == 2, "%d other documents flagged (28 is half changed); exact %llu near %llu",
          others, (unsigned long long)st.exact, (unsigned long long)st.near);
    CHECK(!memcmp(a.ref, b.ref, sizeof *a.ref * N) && !memcmp(a.dup, b.dup, N) &&
              !memcmp(a.score, b.score, sizeof *a.score * N),
          "1 and 2 threads differ");
    /* round trip through the file, and refused for another dataset */
    CHECK(st_data_scores_write(tp(1, "dup.scores"), &a, &err) == ST_OK, "%s", err.msg);
    st_data_scores_free(&b);
    CHECK(st_data_scores_read(tp(1, "dup.scores"), ds, &b, &err) == ST_OK && !memcmp(a.ref, b.ref, sizeof *a.ref * N) &&
              !strcmp(b.kind, "dedup"),
          "%s", err.msg);
    st_data_scores_free(&b);
    st_data_select_config s = {.dataset = ds, .dedup = tp(1, "dup.scores")};
    st_data_view_info vi;
    CHECK(st_data_select(tp(2, "nodup.view"), &s, &vi, &err) == ST_OK && vi.n_kept == N - 4, "%s (kept %llu)", err.msg,
          (unsigned long long)vi.n_kept);
    c.bands = 64, c.rows = 4;
    CHECK(st_data_dedup(ds, &c, &b, &st, &err) != ST_OK && strstr(err.msg, "bands"), "64 x 4 > 128 hashes: %s", err.msg);
    st_data_scores_free(&a);
}

int main(void) {
    views();
    dedup();
    return test_finish("data_select");
}

/* test_data_formats.c - the on-disk formats byte for byte (Megatron .bin/.idx with
 * every dtype code, llm.c shards v1/uint16 and v7/uint32, raw files, memory) and
 * every kind of bad input giving a clear error that names the file and offset. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data_internal.h"
#include "strata/data.h"
#include "testutil.h"

static char pbuf[512];
static const char *tmp_path(const char *name) {
    snprintf(pbuf, sizeof pbuf, "%s/%s", test_tmpdir(), name);
    return pbuf;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* A Megatron index written independently of data_pack, straight from the layout:
 * magic(9) version(u64) dtype(u8) nseq(u64) ndocidx(u64) sizes(i32[n]) pointers(i64[n]) docidx(i64[]). */
static size_t build_idx(uint8_t *out, int dtype, const int32_t *sizes, int n, uint64_t version) {
    size_t o = 0;
    memcpy(out, "MMIDIDX\0\0", 9), o = 9;
    memcpy(out + o, &version, 8), o += 8;
    out[o++] = (uint8_t)dtype;
    uint64_t nn = (uint64_t)n, nd = (uint64_t)n + 1;
    memcpy(out + o, &nn, 8), o += 8;
    memcpy(out + o, &nd, 8), o += 8;
    for (int i = 0; i < n; i++) memcpy(out + o, &sizes[i], 4), o += 4;
    int64_t p = 0;
    for (int i = 0; i < n; i++) {
        memcpy(out + o, &p, 8), o += 8;
        p += (int64_t)sizes[i] * st_data_dtype_size(dtype);
    }
    for (int64_t i = 0; i <= n; i++) memcpy(out + o, &i, 8), o += 8;
    return o;
}

static st_status open_path(const char *path, st_data_format fmt, st_data_source **s, st_err *err) {
    st_data_source_config c = {.path = path, .format = fmt};
    return st_data_source_open(s, &c, err);
}

static void test_pack_layout(void) {
    st_err err = {0};
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s", tmp_path("packed"));
    st_data_pack_writer *w;
    CHECK(st_data_pack_open(&w, prefix, ST_DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    int32_t sizes[3] = {3, 0, 5};
    int32_t toks[8] = {10, 11, 256, 20, 21, 22, 23, 256};
    CHECK(st_data_pack_add(w, toks, 3, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_pack_add(w, toks, 0, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_pack_add(w, toks + 3, 5, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_pack_close(w, &err) == ST_OK, "%s", err.msg);
    uint8_t want[256], got[256];
    size_t n = build_idx(want, ST_DATA_DTYPE_U16, sizes, 3, 1);
    char ip[700];
    snprintf(ip, sizeof ip, "%s.idx", prefix);
    FILE *f = fopen(ip, "rb");
    size_t g = fread(got, 1, sizeof got, f);
    fclose(f);
    CHECK(g == n && !memcmp(got, want, n), "packed .idx differs from the Megatron layout (%zu vs %zu bytes)", g, n);
    CHECK(n == 34 + 12 * 3 + 8 * 4, "layout size %zu", n);
    st_data_source *s;
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    st_data_source_info info;
    st_data_source_get_info(s, &info);
    CHECK(info.format == ST_DATA_FORMAT_MEGATRON && info.n_docs == 3 && info.n_tokens == 8 && info.dtype == ST_DATA_DTYPE_U16,
          "info %d %llu %llu", info.format, (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens);
    int32_t back[5];
    CHECK(st_data_source_read(s, 2, 0, 5, back, 257, &err) == ST_OK, "%s", err.msg);
    CHECK(!memcmp(back, toks + 3, 20), "document 2 read back wrong");
    /* the vocabulary check names the file and the byte offset of the bad token */
    CHECK(st_data_source_read(s, 2, 0, 5, back, 100, &err) == ST_ERR_FORMAT && strstr(err.msg, "packed.bin") &&
              strstr(err.msg, "byte offset 14") && strstr(err.msg, "token 256"),
          "vocab error: %s", err.msg);
    st_data_source_close(s);
}

static void test_all_dtypes(void) {
    st_err err = {0};
    int codes[] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t sizes[2] = {3, 2};
    int32_t vals[5] = {0, 1, 7, 100, 42};
    for (size_t k = 0; k < sizeof codes / sizeof codes[0]; k++) {
        int dt = codes[k], isz = st_data_dtype_size(dt);
        char name[64];
        snprintf(name, sizeof name, "dt%d", dt);
        char prefix[600], path[700];
        snprintf(prefix, sizeof prefix, "%s", tmp_path(name));
        uint8_t idx[256], bin[64];
        size_t n = build_idx(idx, dt, sizes, 2, 1);
        snprintf(path, sizeof path, "%s.idx", prefix);
        write_file(path, idx, n);
        for (int i = 0; i < 5; i++) {
            uint8_t *b = bin + i * isz;
            switch (dt) {
            case 1: case 2: *b = (uint8_t)vals[i]; break;
            case 3: case 8: { uint16_t v = (uint16_t)vals[i]; memcpy(b, &v, 2); break; }
            case 4: memcpy(b, &vals[i], 4); break;
            case 5: { int64_t v = vals[i]; memcpy(b, &v, 8); break; }
            case 6: { double v = vals[i]; memcpy(b, &v, 8); break; }
            case 7: { float v = (float)vals[i]; memcpy(b, &v, 4); break; }
            }
        }
        snprintf(path, sizeof path, "%s.bin", prefix);
        write_file(path, bin, (size_t)(5 * isz));
        st_data_source *s;
        CHECK(open_path(path, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "dtype %d: %s", dt, err.msg);
        if (!s) continue;
        int32_t out[3];
        CHECK(st_data_source_read(s, 1, 0, 2, out, 0, &err) == ST_OK && out[0] == 100 && out[1] == 42,
              "dtype %s: read %d %d (%s)", st_data_dtype_name(dt), out[0], out[1], err.msg);
        CHECK(st_data_source_read(s, 0, 0, 3, out, 0, &err) == ST_OK && out[2] == 7, "dtype %s", st_data_dtype_name(dt));
        st_data_source_close(s);
    }
    /* negative ids and fractional floats are refused */
    int32_t sz1[1] = {1};
    uint8_t idx[128];
    size_t n = build_idx(idx, ST_DATA_DTYPE_F32, sz1, 1, 1);
    char prefix[600], path[700];
    snprintf(prefix, sizeof prefix, "%s", tmp_path("frac"));
    snprintf(path, sizeof path, "%s.idx", prefix);
    write_file(path, idx, n);
    float fv = 2.5f;
    snprintf(path, sizeof path, "%s.bin", prefix);
    write_file(path, &fv, 4);
    st_data_source *s;
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    int32_t o1;
    CHECK(st_data_source_read(s, 0, 0, 1, &o1, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, "byte offset 0"),
          "fractional float token accepted: %s", err.msg);
    st_data_source_close(s);
    n = build_idx(idx, ST_DATA_DTYPE_I16, sz1, 1, 1);
    snprintf(prefix, sizeof prefix, "%s", tmp_path("neg"));
    snprintf(path, sizeof path, "%s.idx", prefix);
    write_file(path, idx, n);
    int16_t nv = -3;
    snprintf(path, sizeof path, "%s.bin", prefix);
    write_file(path, &nv, 2);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_source_read(s, 0, 0, 1, &o1, 1000, &err) == ST_ERR_FORMAT && strstr(err.msg, "token -3"),
          "negative token accepted: %s", err.msg);
    st_data_source_close(s);
}

static void test_llmc_raw_memory(void) {
    st_err err = {0};
    st_data_source *s;
    int32_t out[4];
    /* llm.c v1 uint16 */
    uint8_t buf[1024 + 64];
    int32_t hdr[256] = {20240520, 1, 4};
    memcpy(buf, hdr, 1024);
    uint16_t t16[4] = {5, 6, 50256, 7};
    memcpy(buf + 1024, t16, 8);
    write_file(tmp_path("shard16.bin"), buf, 1032);
    CHECK(open_path(tmp_path("shard16.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    CHECK(s && s->format == ST_DATA_FORMAT_LLMC && s->n_tokens == 4, "llm.c v1 not detected");
    CHECK(st_data_source_read(s, 0, 1, 3, out, 50257, &err) == ST_OK && out[0] == 6 && out[1] == 50256 && out[2] == 7,
          "llm.c v1 read: %s", err.msg);
    st_data_source_close(s);
    /* llm.c v7 uint32 */
    int32_t hdr7[256] = {20240801, 7, 3};
    memcpy(buf, hdr7, 1024);
    uint32_t t32[3] = {128000, 1, 128255};
    memcpy(buf + 1024, t32, 12);
    write_file(tmp_path("shard32.bin"), buf, 1036);
    CHECK(open_path(tmp_path("shard32.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_source_read(s, 0, 0, 3, out, 128256, &err) == ST_OK && out[0] == 128000 && out[2] == 128255,
          "llm.c v7 read: %s", err.msg);
    CHECK(st_data_source_read(s, 0, 0, 3, out, 128000, &err) == ST_ERR_FORMAT && strstr(err.msg, "byte offset 1024"),
          "llm.c vocab error: %s", err.msg);
    st_data_source_close(s);
    /* wrong version, wrong magic (explicit format), truncated */
    hdr[1] = 2;
    memcpy(buf, hdr, 1024);
    write_file(tmp_path("badver.bin"), buf, 1032);
    CHECK(open_path(tmp_path("badver.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT &&
              strstr(err.msg, "badver.bin") && strstr(err.msg, "offset 4"), "llm.c version: %s", err.msg);
    hdr[0] = 12345, hdr[1] = 1;
    memcpy(buf, hdr, 1024);
    write_file(tmp_path("badmagic.bin"), buf, 1032);
    CHECK(open_path(tmp_path("badmagic.bin"), ST_DATA_FORMAT_LLMC, &s, &err) == ST_ERR_FORMAT &&
              strstr(err.msg, "offset 0"), "llm.c magic: %s", err.msg);
    hdr[0] = 20240520;
    memcpy(buf, hdr, 1024);
    write_file(tmp_path("short.bin"), buf, 1030);
    CHECK(open_path(tmp_path("short.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_TRUNCATED &&
              strstr(err.msg, "short.bin") && strstr(err.msg, "1030"), "llm.c truncated: %s", err.msg);
    /* raw uint16 (said so: no header tells), raw uint32 by its documented .u32 suffix, odd size */
    write_file(tmp_path("raw.u16"), t16, 8);
    CHECK(open_path(tmp_path("raw.u16"), ST_DATA_FORMAT_RAW_U16, &s, &err) == ST_OK && s->n_tokens == 4, "%s", err.msg);
    st_data_source_close(s);
    write_file(tmp_path("raw.u32"), t32, 12);
    CHECK(open_path(tmp_path("raw.u32"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK && s->n_tokens == 3, "%s", err.msg);
    CHECK(st_data_source_read(s, 0, 2, 1, out, 0, &err) == ST_OK && out[0] == 128255, "raw u32 read");
    st_data_source_close(s);
    write_file(tmp_path("odd.u16"), t16, 7);
    CHECK(open_path(tmp_path("odd.u16"), ST_DATA_FORMAT_RAW_U16, &s, &err) == ST_ERR_TRUNCATED &&
              strstr(err.msg, "odd.u16") && strstr(err.msg, "offset 6"), "raw odd size: %s", err.msg);
    write_file(tmp_path("empty.u16"), t16, 0);
    CHECK(open_path(tmp_path("empty.u16"), ST_DATA_FORMAT_RAW_U16, &s, &err) == ST_ERR_INVALID &&
              strstr(err.msg, "empty source") && strstr(err.msg, "empty.u16"), "empty raw: %s", err.msg);
    /* memory */
    st_data_source_config mc = {.format = ST_DATA_FORMAT_MEMORY, .mem = t16, .mem_tokens = 4, .mem_itemsize = 2};
    CHECK(st_data_source_open(&s, &mc, &err) == ST_OK, "%s", err.msg);
    CHECK(st_data_source_read(s, 0, 0, 4, out, 60000, &err) == ST_OK && out[2] == 50256, "memory read");
    st_data_source_close(s);
}

static void test_bad_megatron(void) {
    st_err err = {0};
    st_data_source *s;
    int32_t sizes[3] = {4, 2, 3};
    uint8_t idx[256], bin[64] = {0};
    char prefix[600], ip[700], bp[700];
    snprintf(prefix, sizeof prefix, "%s", tmp_path("bad"));
    snprintf(ip, sizeof ip, "%s.idx", prefix);
    snprintf(bp, sizeof bp, "%s.bin", prefix);
    size_t n = build_idx(idx, ST_DATA_DTYPE_U16, sizes, 3, 1);
    write_file(ip, idx, n);
    write_file(bp, bin, 18);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "good pair refused: %s", err.msg);
    st_data_source_close(s);
    /* truncated .bin */
    write_file(bp, bin, 16);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_TRUNCATED && strstr(err.msg, "bad.bin") &&
              strstr(err.msg, "byte 16") && strstr(err.msg, "byte 18"), "truncated bin: %s", err.msg);
    /* .idx disagrees with .bin (bin longer) */
    write_file(bp, bin, 24);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT && strstr(err.msg, "disagrees") &&
              strstr(err.msg, "bad.idx"), "idx/bin mismatch: %s", err.msg);
    write_file(bp, bin, 18);
    /* wrong magic */
    uint8_t b2[256];
    memcpy(b2, idx, n);
    b2[3] = 'X';
    write_file(ip, b2, n);
    CHECK(open_path(prefix, ST_DATA_FORMAT_MEGATRON, &s, &err) == ST_ERR_FORMAT && strstr(err.msg, "offset 0") &&
              strstr(err.msg, "bad.idx"), "magic: %s", err.msg);
    /* wrong version */
    n = build_idx(b2, ST_DATA_DTYPE_U16, sizes, 3, 2);
    write_file(ip, b2, n);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT && strstr(err.msg, "offset 9") &&
              strstr(err.msg, "version 2"), "version: %s", err.msg);
    /* unknown dtype */
    n = build_idx(b2, ST_DATA_DTYPE_U16, sizes, 3, 1);
    b2[17] = 9;
    write_file(ip, b2, n);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT && strstr(err.msg, "offset 17"),
          "dtype: %s", err.msg);
    /* truncated .idx */
    n = build_idx(b2, ST_DATA_DTYPE_U16, sizes, 3, 1);
    write_file(ip, b2, n - 5);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_TRUNCATED && strstr(err.msg, "bad.idx"),
          "truncated idx: %s", err.msg);
    write_file(ip, b2, 20);
    CHECK(open_path(prefix, ST_DATA_FORMAT_MEGATRON, &s, &err) == ST_ERR_TRUNCATED, "short header: %s", err.msg);
    /* a middle pointer that runs off the .bin: found when the document is read, with its .idx offset */
    n = build_idx(b2, ST_DATA_DTYPE_U16, sizes, 3, 1);
    int64_t badp = 40;
    size_t po = 34 + 12 + 8; /* pointer of sequence 1 */
    memcpy(b2 + po, &badp, 8);
    write_file(ip, b2, n);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    int32_t out[4];
    char want[64];
    snprintf(want, sizeof want, "pointer at offset %zu", po);
    CHECK(st_data_source_read(s, 1, 0, 2, out, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, want),
          "bad pointer: %s", err.msg);
    st_data_source_close(s);
    {
        /* the same through a loader, whose stream reads index entries a window at a time */
        st_data_loader_config lc;
        st_data_loader_config_init(&lc);
        lc.n_sources = 1;
        lc.sources[0].path = prefix;
        lc.T = 2;
        lc.no_shuffle = 1;
        st_data_loader *ld;
        st_data_batch lb;
        CHECK(st_data_loader_open(&ld, &lc, &err) == ST_OK, "%s", err.msg);
        st_status lrc = ST_OK;
        for (int i = 0; i < 4 && !lrc; i++) lrc = st_data_loader_next(ld, &lb, &err);
        CHECK(lrc == ST_ERR_FORMAT && strstr(err.msg, want), "bad pointer through the loader: %s", err.msg);
        st_data_loader_close(ld);
    }
    /* empty source: zero sequences */
    n = build_idx(b2, ST_DATA_DTYPE_U16, sizes, 0, 1);
    write_file(ip, b2, n);
    write_file(bp, bin, 0);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_INVALID && strstr(err.msg, "empty source"),
          "empty: %s", err.msg);
    /* a loader over a bad source reports it at open; a bad token at next */
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    c.n_sources = 1;
    c.sources[0].path = prefix;
    c.T = 4;
    st_data_loader *dl;
    CHECK(st_data_loader_open(&dl, &c, &err) == ST_ERR_INVALID && strstr(err.msg, "bad.idx"), "loader open: %s", err.msg);
    uint16_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 60000};
    n = build_idx(b2, ST_DATA_DTYPE_U16, sizes, 3, 1);
    write_file(ip, b2, n);
    write_file(bp, toks, 18);
    c.vocab_size = 50000;
    c.no_shuffle = 1;
    CHECK(st_data_loader_open(&dl, &c, &err) == ST_OK, "%s", err.msg);
    st_data_batch b;
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) rc = st_data_loader_next(dl, &b, &err);
    CHECK(rc == ST_ERR_FORMAT && strstr(err.msg, "token 60000") && strstr(err.msg, "byte offset 16"),
          "bad token through the loader: %s", err.msg);
    CHECK(st_data_loader_next(dl, &b, &err) == ST_ERR_FORMAT, "error not sticky");
    st_data_loader_close(dl);
}

/* No silent guess: a file's format comes from its header (a Megatron .idx beside it,
 * the llm.c magic) or from the data list (FORMAT@PATH); anything else is refused with
 * the bytes found at offset 0 and the two ways to say what the file is. */
static void test_no_guess(void) {
    st_err err = {0};
    st_data_source *s = NULL;
    uint16_t t16[4] = {5, 6, 50256, 7};
    write_file(tmp_path("plain.u16"), t16, 8);
    CHECK(open_path(tmp_path("plain.u16"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT && strstr(err.msg, "plain.u16") &&
              strstr(err.msg, "offset 0") && strstr(err.msg, "05 00 06 00 50 c4 07 00") && strstr(err.msg, "raw16@") &&
              strstr(err.msg, ".idx"),
          "a headerless file read as uint16 without a word: %s", err.msg);
    st_data_source_close(s), s = NULL;
    /* the same file, said to be raw uint16 in the list syntax or the config */
    char spec[700];
    snprintf(spec, sizeof spec, "raw16@%s", tmp_path("plain.u16"));
    CHECK(open_path(spec, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK && s->n_tokens == 4 && s->format == ST_DATA_FORMAT_RAW_U16,
          "raw16@: %s", err.msg);
    st_data_source_close(s), s = NULL;
    CHECK(open_path(tmp_path("plain.u16"), ST_DATA_FORMAT_RAW_U16, &s, &err) == ST_OK, "%s", err.msg);
    st_data_source_close(s), s = NULL;
    snprintf(spec, sizeof spec, "raw32@%s", tmp_path("plain.u16"));
    CHECK(open_path(spec, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK && s->n_tokens == 2 && s->dtype == ST_DATA_DTYPE_U32,
          "raw32@: %s", err.msg);
    st_data_source_close(s), s = NULL;
    snprintf(spec, sizeof spec, "bogus@%s", tmp_path("plain.u16"));
    CHECK(open_path(spec, ST_DATA_FORMAT_AUTO, &s, &err) != ST_OK && strstr(err.msg, "bogus") && strstr(err.msg, "raw16"),
          "unknown format name: %s", err.msg);
    st_data_source_close(s), s = NULL;
    /* PREFIX.bin whose .idx is missing: an int32 Megatron dataset must not train as uint16 */
    int32_t t32[4] = {1, 2, 3, 4};
    write_file(tmp_path("orphan.bin"), t32, 16);
    CHECK(open_path(tmp_path("orphan.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT &&
              strstr(err.msg, "orphan.bin") && strstr(err.msg, "orphan.idx") && strstr(err.msg, "01 00 00 00 02 00") &&
              strstr(err.msg, "raw16@"),
          "a .bin without its .idx read as raw tokens: %s", err.msg);
    st_data_source_close(s), s = NULL;
    /* an llm.c shard whose magic is zeroed or wrong is refused, not read with its header */
    uint8_t buf[1024 + 8];
    int32_t hdr[256] = {0, 1, 4};
    memcpy(buf, hdr, 1024);
    memcpy(buf + 1024, t16, 8);
    write_file(tmp_path("zeromagic.bin"), buf, sizeof buf);
    CHECK(open_path(tmp_path("zeromagic.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT &&
              strstr(err.msg, "zeromagic.bin") && strstr(err.msg, "00 00 00 00 01 00 00 00") &&
              strstr(err.msg, "20240520"),
          "an llm.c shard with a zeroed magic read as raw tokens: %s", err.msg);
    st_data_source_close(s), s = NULL;
    hdr[0] = 20240519;
    memcpy(buf, hdr, 1024);
    write_file(tmp_path("offmagic.bin"), buf, sizeof buf);
    CHECK(open_path(tmp_path("offmagic.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT &&
              strstr(err.msg, "offmagic.bin") && strstr(err.msg, "offset 0"),
          "an llm.c shard with a wrong magic read as raw tokens: %s", err.msg);
    st_data_source_close(s), s = NULL;
    /* a loader refuses it at open too, and takes the explicit form */
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    c.n_sources = 1;
    c.T = 2;
    c.sources[0].path = tmp_path("zeromagic.bin");
    st_data_loader *dl = NULL;
    CHECK(st_data_loader_open(&dl, &c, &err) == ST_ERR_FORMAT && strstr(err.msg, "zeromagic.bin"), "loader: %s", err.msg);
    st_data_loader_close(dl), dl = NULL;
    snprintf(spec, sizeof spec, "raw16@%s", tmp_path("plain.u16"));
    c.sources[0].path = spec;
    CHECK(st_data_loader_open(&dl, &c, &err) == ST_OK, "loader with raw16@: %s", err.msg);
    st_data_loader_close(dl);
    /* explicit llmc@ and megatron@ name what the header says */
    hdr[0] = 20240520;
    memcpy(buf, hdr, 1024);
    write_file(tmp_path("good16.bin"), buf, sizeof buf);
    snprintf(spec, sizeof spec, "llmc@%s", tmp_path("good16.bin"));
    CHECK(open_path(spec, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK && s->format == ST_DATA_FORMAT_LLMC, "llmc@: %s", err.msg);
    st_data_source_close(s), s = NULL;
    snprintf(spec, sizeof spec, "llmc@%s", tmp_path("zeromagic.bin"));
    CHECK(open_path(spec, ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_FORMAT && strstr(err.msg, "offset 0") &&
              strstr(err.msg, "raw16@"),
          "llmc@ on a damaged shard: %s", err.msg);
    st_data_source_close(s), s = NULL;
    /* a missing file is named as missing, not as an unknown format */
    CHECK(open_path(tmp_path("nowhere.bin"), ST_DATA_FORMAT_AUTO, &s, &err) == ST_ERR_IO && strstr(err.msg, "nowhere.bin"),
          "missing file: %s", err.msg);
    st_data_source_close(s);
}

/* Megatron writes sequences back to back: sequence d starts where d-1 ends. */
static void test_consecutive(void) {
    st_err err = {0};
    st_data_source *s = NULL;
    int32_t sizes[4] = {2, 2, 2, 2};
    uint16_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t idx[256];
    char prefix[600], ip[700], bp[700];
    snprintf(prefix, sizeof prefix, "%s", tmp_path("order"));
    snprintf(ip, sizeof ip, "%s.idx", prefix);
    snprintf(bp, sizeof bp, "%s.bin", prefix);
    write_file(bp, toks, 16);
    size_t n = build_idx(idx, ST_DATA_DTYPE_U16, sizes, 4, 1);
    const size_t po = 34 + 4 * 4; /* pointers */
    int64_t p;
    /* swapped: sequence 1 at byte 8 and 2 at byte 4 (each inside the file) */
    p = 8, memcpy(idx + po + 8, &p, 8);
    p = 4, memcpy(idx + po + 16, &p, 8);
    write_file(ip, idx, n);
    int32_t out[2];
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    if (s) {
        CHECK(st_data_source_read(s, 1, 0, 2, out, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, "order.idx") &&
                  strstr(err.msg, "sequence 1") && strstr(err.msg, "byte 8") && strstr(err.msg, "byte 4") &&
                  strstr(err.msg, "offset 58"),
              "swapped sequences accepted: %s", err.msg);
        CHECK(st_data_source_read(s, 2, 0, 2, out, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, "sequence 2"),
              "a sequence pointing back accepted: %s", err.msg);
        CHECK(st_data_source_read(s, 0, 0, 2, out, 0, &err) == ST_OK && out[1] == 2, "sequence 0 is fine: %s", err.msg);
    }
    st_data_source_close(s), s = NULL;
    /* the same through a loader (index entries read in windows) */
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    c.n_sources = 1;
    c.sources[0].path = prefix;
    c.T = 1;
    c.no_shuffle = 1;
    st_data_loader *dl = NULL;
    st_data_batch b;
    CHECK(st_data_loader_open(&dl, &c, &err) == ST_OK, "%s", err.msg);
    st_status rc = ST_OK;
    for (int i = 0; i < 6 && !rc && dl; i++) rc = st_data_loader_next(dl, &b, &err);
    CHECK(rc == ST_ERR_FORMAT && strstr(err.msg, "order.idx") && strstr(err.msg, "sequence 1"),
          "swapped sequences through the loader: %s", err.msg);
    st_data_loader_close(dl), dl = NULL;
    /* overlapping: sequence 1 starts inside sequence 0 (and the gap is left after it) */
    n = build_idx(idx, ST_DATA_DTYPE_U16, sizes, 4, 1);
    p = 2, memcpy(idx + po + 8, &p, 8);
    write_file(ip, idx, n);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    if (s)
        CHECK(st_data_source_read(s, 1, 0, 2, out, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, "sequence 1") &&
                  strstr(err.msg, "overlap"),
              "an overlapping sequence accepted: %s", err.msg);
    st_data_source_close(s), s = NULL;
    /* ...unless the source says its sequences are not in order */
    st_data_source_config sc = {.path = prefix, .unordered = 1};
    CHECK(st_data_source_open(&s, &sc, &err) == ST_OK, "%s", err.msg);
    if (s) CHECK(st_data_source_read(s, 1, 0, 2, out, 0, &err) == ST_OK && out[0] == 2 && out[1] == 3, "unordered: %s", err.msg);
    st_data_source_close(s), s = NULL;
    char spec[700];
    snprintf(spec, sizeof spec, "megatron-unordered@%s", prefix);
    CHECK(open_path(spec, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    if (s) CHECK(st_data_source_read(s, 1, 0, 2, out, 0, &err) == ST_OK && out[0] == 2, "megatron-unordered@: %s", err.msg);
    st_data_source_close(s), s = NULL;
    /* a misaligned pointer inside the file is reported as misaligned, with the token size */
    n = build_idx(idx, ST_DATA_DTYPE_U16, sizes, 4, 1);
    p = 5, memcpy(idx + po + 8, &p, 8);
    write_file(ip, idx, n);
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    if (s)
        CHECK(st_data_source_read(s, 1, 0, 1, out, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, "misaligned") &&
                  strstr(err.msg, "2-byte") && !strstr(err.msg, "outside"),
              "misaligned pointer: %s", err.msg);
    st_data_source_close(s);
}

/* Token values: a float that is not a whole number, an id past the vocabulary. */
static void test_token_messages(void) {
    st_err err = {0};
    st_data_source *s = NULL;
    int32_t sz1[2] = {1, 1};
    uint8_t idx[128];
    char prefix[600], path[700];
    size_t n = build_idx(idx, ST_DATA_DTYPE_F32, sz1, 2, 1);
    snprintf(prefix, sizeof prefix, "%s", tmp_path("f32"));
    snprintf(path, sizeof path, "%s.idx", prefix);
    write_file(path, idx, n);
    float fv[2] = {1.5f, 70000.0f};
    snprintf(path, sizeof path, "%s.bin", prefix);
    write_file(path, fv, 8);
    int32_t o;
    CHECK(open_path(prefix, ST_DATA_FORMAT_AUTO, &s, &err) == ST_OK, "%s", err.msg);
    if (s) {
        CHECK(st_data_source_read(s, 0, 0, 1, &o, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, "1.5") &&
                  strstr(err.msg, "not an integer token id") && !strstr(err.msg, "2147483648"),
              "float 1.5: %s", err.msg);
        CHECK(st_data_source_read(s, 0, 0, 1, &o, 50257, &err) == ST_ERR_FORMAT && strstr(err.msg, "not an integer token id"),
              "float 1.5 with a vocabulary: %s", err.msg);
        CHECK(st_data_source_read(s, 1, 0, 1, &o, 50257, &err) == ST_ERR_FORMAT && strstr(err.msg, "70000") &&
                  strstr(err.msg, "50257") && strstr(err.msg, "byte offset 4"),
              "float id past the vocabulary: %s", err.msg);
        CHECK(st_data_source_read(s, 1, 0, 1, &o, 0, &err) == ST_OK && o == 70000, "whole float read: %s", err.msg);
    }
    st_data_source_close(s), s = NULL;
    /* with no vocabulary given, an id that int32 cannot hold says so, not "vocabulary [0, 2^31)" */
    uint32_t big[2] = {3, 3000000000u};
    write_file(tmp_path("big.u32"), big, 8);
    CHECK(open_path(tmp_path("big.u32"), ST_DATA_FORMAT_RAW_U32, &s, &err) == ST_OK, "%s", err.msg);
    int32_t o2[2];
    if (s)
        CHECK(st_data_source_read(s, 0, 0, 2, o2, 0, &err) == ST_ERR_FORMAT && strstr(err.msg, "3000000000") &&
                  !strstr(err.msg, "vocabulary") && strstr(err.msg, "int32"),
              "id past int32: %s", err.msg);
    st_data_source_close(s);
}

int main(void) {
    test_pack_layout();
    test_all_dtypes();
    test_llmc_raw_memory();
    test_bad_megatron();
    test_no_guess();
    test_consecutive();
    test_token_messages();
    return test_finish("data_formats");
}

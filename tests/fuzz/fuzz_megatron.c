/* fuzz_megatron.c - a Megatron indexed dataset (PREFIX.idx + PREFIX.bin) opened as a
 * data source, then its documents' lengths and tokens read.
 *
 * Input: byte 0 flags (bit 0: unordered, bit 1: check tokens against a vocabulary of
 * 1000), bytes 1..2 the .idx length L (little-endian), then L bytes of .idx, then the
 * .bin. */
#include "fuzz_common.h"
#include "strata/data.h"

/* Read a few tokens of the first documents and the last, as the loader would. */
static int fuzz_read_docs(st_data_source *src, int64_t vocab) {
    st_data_source_info info;
    st_data_source_get_info(src, &info);
    int32_t out[64];
    uint64_t docs = info.n_docs ? info.n_docs : 1;
    for (uint64_t k = 0; k < 6 && k < docs + 1; k++) {
        uint64_t dd = k < 4 ? k : docs - 1 - (k - 4); /* 0..3, then the last two */
        if (k == 5 && docs > 4) dd = docs; /* one past the end: refused cleanly */
        uint64_t len = 0, want;
        st_err err = {0};
        st_status s;
        if (info.n_docs) {
            s = st_data_source_doc_len(src, dd, &len, &err);
            if (s) {
                if (fuzz_check_refusal(s, &err, "data_source_doc_len")) return 1;
                continue;
            }
        } else {
            if (dd) continue;
            len = info.n_tokens;
        }
        want = len < 64 ? len : 64;
        s = st_data_source_read(src, info.n_docs ? dd : 0, 0, want, out, vocab, &err);
        if (fuzz_check_refusal(s, &err, "data_source_read")) return 1;
        if (len > 3) { /* a window from the middle, and one that runs past the end */
            s = st_data_source_read(src, info.n_docs ? dd : 0, len / 2, len - len / 2 < 64 ? len - len / 2 : 64, out,
                                 vocab, &err);
            if (fuzz_check_refusal(s, &err, "data_source_read")) return 1;
            s = st_data_source_read(src, info.n_docs ? dd : 0, len - 1, 2, out, vocab, &err);
            if (s == ST_OK) {
                fprintf(stderr, "fuzz: a read past the end of document %llu was accepted\n", (unsigned long long)dd);
                return 1;
            }
            if (fuzz_check_refusal(s, &err, "data_source_read")) return 1;
        }
    }
    return 0;
}

int fuzz_megatron(const uint8_t *d, size_t n) {
    if (n < 3) return 0;
    size_t il = (size_t)d[1] | (size_t)d[2] << 8;
    if (il > n - 3) il = n - 3;
    fuzz_file("ds.idx", d + 3, il);
    fuzz_file("ds.bin", d + 3 + il, n - 3 - il);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s/ds", fuzz_dir());
    st_data_source_config cfg = {.path = prefix, .weight = 1, .format = ST_DATA_FORMAT_MEGATRON, .unordered = d[0] & 1};
    st_data_source *src = NULL;
    st_err err = {0};
    st_status s = st_data_source_open(&src, &cfg, &err);
    if (s) return fuzz_check_refusal(s, &err, "data_source_open (megatron)");
    int bad = fuzz_read_docs(src, d[0] & 2 ? 1000 : 0);
    st_data_source_close(src);
    return bad;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_megatron(d, n)) abort();
    return 0;
}
#endif

/* fuzz_llmc.c - an llm.c shard (1024-byte header: magic, version, token count; uint16
 * or uint32 tokens) opened as a data source and read; the same bytes also opened with
 * the format left to the file (ST_DATA_FORMAT_AUTO), which must say what it found. */
#include "fuzz_common.h"
#include "strata/data.h"

/* Read the start, the middle and the end of the token stream. */
static int fuzz_read_stream(st_data_source *src) {
    st_data_source_info info;
    st_data_source_get_info(src, &info);
    int32_t out[64];
    uint64_t t = info.n_tokens, starts[3] = {0, t / 2, t > 64 ? t - 64 : 0};
    for (int i = 0; i < 3; i++) {
        st_err err = {0};
        uint64_t want = t - starts[i] < 64 ? t - starts[i] : 64;
        st_status s = st_data_source_read(src, 0, starts[i], want, out, i == 1 ? 50257 : 0, &err);
        if (fuzz_check_refusal(s, &err, "data_source_read")) return 1;
    }
    st_err err = {0};
    st_status s = st_data_source_read(src, 0, t, 1, out, 0, &err); /* past the end */
    if (s == ST_OK) {
        fprintf(stderr, "fuzz: a read past the last token was accepted\n");
        return 1;
    }
    return fuzz_check_refusal(s, &err, "data_source_read");
}

int fuzz_llmc(const uint8_t *d, size_t n) {
    const char *path = fuzz_file("shard.bin", d, n);
    st_data_format fmts[2] = {ST_DATA_FORMAT_LLMC, ST_DATA_FORMAT_AUTO};
    for (int i = 0; i < 2; i++) {
        st_data_source_config cfg = {.path = path, .weight = 1, .format = fmts[i]};
        st_data_source *src = NULL;
        st_err err = {0};
        st_status s = st_data_source_open(&src, &cfg, &err);
        if (s) {
            if (fuzz_check_refusal(s, &err, "data_source_open (llm.c)")) return 1;
            continue;
        }
        int bad = fuzz_read_stream(src);
        st_data_source_close(src);
        if (bad) return 1;
    }
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_llmc(d, n)) abort();
    return 0;
}
#endif

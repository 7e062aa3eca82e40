/* fuzz_tokenizer.c - a tokenizer file (st_tokenizer_load, which reads the format from the
 * content: a Hugging Face tokenizer.json or a tiktoken rank file); what loads then encodes a
 * fixed text and the input's own first bytes, and decodes the ids it gave. */
#include "fuzz_common.h"
#include "strata/tokenizer.h"

int fuzz_tokenizer(const uint8_t *d, size_t n) {
    st_tokenizer *tok = NULL;
    st_err err = {0};
    st_status s = st_tokenizer_load(&tok, fuzz_file("tokenizer.json", d, n), &err);
    if (s) return fuzz_check_refusal(s, &err, "st_tokenizer_load");
    static const char fixed[] =
        "Hello world! It's 2026: caf\xc3\xa9, \xe4\xb8\xad\xe6\x96\x87, <|endoftext|>\n\t  x <s>\xe2\x96\x81 <0x41>\xff";
    const char *texts[2] = {fixed, (const char *)d};
    size_t lens[2] = {sizeof fixed - 1, n < 256 ? n : 256};
    int bad = 0;
    for (int t = 0; t < 2 && !bad; t++) {
        int32_t ids[1024];
        size_t k = 0, len = 0;
        st_err e2 = {0};
        s = st_tokenizer_encode(tok, texts[t], lens[t], ids, 1024, &k, &e2);
        if (s) {
            bad = fuzz_check_refusal(s, &e2, "st_tokenizer_encode");
            continue;
        }
        for (size_t i = 0; i < k && !bad; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= st_tokenizer_vocab_size(tok)) {
                fprintf(stderr, "fuzz: encode gave id %d outside the vocabulary of %zu\n", ids[i],
                        st_tokenizer_vocab_size(tok));
                bad = 1;
            }
        char out[8192];
        s = st_tokenizer_decode(tok, ids, k, out, sizeof out, &len, &e2);
        if (!bad) bad = fuzz_check_refusal(s, &e2, "st_tokenizer_decode");
    }
    st_tokenizer_free(tok);
    return bad;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_tokenizer(d, n)) abort();
    return 0;
}
#endif

/* fuzz_hf_config.c - a Hugging Face config.json (st_hf_config_parse, from memory); what it
 * accepts must be written back (st_hf_config_to_json, as --save_hf does) as JSON that reads
 * back to the same model. */
#include "fuzz_common.h"
#include "strata/llama.h"

int fuzz_hf_config(const uint8_t *d, size_t n) {
    char *text = malloc(n + 1);
    if (!text) return 0;
    memcpy(text, d, n);
    text[n] = 0;
    st_err err = {0};
    st_llama_config c, back;
    st_status s = st_hf_config_parse(text, "fuzz/config.json", &c, &err);
    free(text);
    if (s) return fuzz_check_refusal(s, &err, "hf_config_parse");
    char *out = st_hf_config_to_json(&c, "float32");
    if (!out) {
        fprintf(stderr, "fuzz: an accepted config.json cannot be written back\n");
        return 1;
    }
    s = st_hf_config_parse(out, "fuzz/written.json", &back, &err);
    int bad = s != ST_OK || back.vocab_size != c.vocab_size || back.hidden_size != c.hidden_size ||
              back.n_layer != c.n_layer || back.n_head != c.n_head || back.n_kv_head != c.n_kv_head ||
              back.head_dim != c.head_dim || back.max_seq != c.max_seq || back.rms_norm_eps != c.rms_norm_eps ||
              back.rope_theta != c.rope_theta || back.rope_llama3 != c.rope_llama3 ||
              back.tie_word_embeddings != c.tie_word_embeddings || back.qkv_bias != c.qkv_bias;
    if (bad) fprintf(stderr, "fuzz: config.json written back differs or is refused: %s\n%s\n", s ? err.msg : "", out);
    free(out);
    return bad;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_hf_config(d, n)) abort();
    return 0;
}
#endif

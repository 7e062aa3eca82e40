/* test_tokenizer.c - tokenizer.json byte-level BPE against Hugging Face `tokenizers`.
 *
 * The fixtures (tools/gen_tokenizer_fixtures.py) are two tokenizers trained with the
 * `tokenizers` library, one with GPT-2's ByteLevel pre-tokenizer and "a b" merges, one with
 * a Llama-3 Split regex, ignore_merges and [a, b] merges, each with the ids `tokenizers`
 * gives for a set of texts (special tokens, unicode, digits, whitespace runs,
 * contractions). Every id must match and decoding must give the text back byte for byte.
 * Three more are sentencepiece-style BPE over characters: Llama-2's form (Prepend/Replace
 * normalizer, byte fallback, the Replace/ByteFallback/Fuse/Strip decoder), Mistral's newer
 * form (Metaspace pre-tokenizer) and an older one without byte fallback (unk, Metaspace
 * decoder). A tiktoken rank file made from the Llama-3 one must give PyPI tiktoken's ids
 * with the Llama-3 and the GPT-2 pattern; model directories give tokenizer_config.json's
 * BOS/EOS/pad and chat template. Files the reader must refuse (Unigram, WordPiece, an unknown normalizer,
 * pre-tokenizer or decoder, malformed JSON) must name the field or the file.
 */
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/tokenizer.h"
#include "testutil.h"

/* round_trip: decode(encode(text)) is the text (not so with add_prefix_space, nor where a
 * sentencepiece-style decoder strips the space it assumes was prepended); special: a special
 * token of the file; junk: text with invalid UTF-8 that must come back byte for byte (NULL:
 * the model maps invalid bytes to unk) */
static void check_files(const char *name, const char *file, const char *expected, const st_tokenizer_opts *opts,
                        int round_trip, const char *special, const char *junk) {
    char rel[128];
    st_tokenizer *tok = NULL;
    st_err err = {0};
    st_status s = st_tokenizer_load_ex(&tok, test_source_path(file), opts, &err);
    CHECK(s == ST_OK, "%s: %s", file, err.msg);
    if (s != ST_OK) return;
    CHECK(st_tokenizer_vocab_size(tok) > 256, "%s: vocab %zu", name, st_tokenizer_vocab_size(tok));
    CHECK(st_tokenizer_token_id(tok, special) >= 0, "%s: special token id", name);
    CHECK(st_tokenizer_id_token(tok, st_tokenizer_token_id(tok, special)) != NULL, "%s: id -> token", name);

    snprintf(rel, sizeof rel, "%s", expected);
    json_object *rows = json_object_from_file(test_source_path(rel));
    CHECK(rows && json_object_is_type(rows, json_type_array), "%s: cannot read", rel);
    size_t nrows = rows ? json_object_array_length(rows) : 0;
    CHECK(nrows >= 10, "%s: %zu rows", rel, nrows);
    size_t total_ids = 0;
    for (size_t r = 0; r < nrows; r++) {
        json_object *row = json_object_array_get_idx(rows, r), *jt, *ji, *jd;
        json_object_object_get_ex(row, "text", &jt);
        json_object_object_get_ex(row, "ids", &ji);
        json_object_object_get_ex(row, "decoded", &jd);
        const char *text = json_object_get_string(jt), *dec = json_object_get_string(jd);
        size_t tlen = (size_t)json_object_get_string_len(jt), nexp = json_object_array_length(ji);
        size_t dlen = (size_t)json_object_get_string_len(jd);
        int32_t ids[1024];
        size_t n = 0;
        s = st_tokenizer_encode(tok, text, tlen, ids, 1024, &n, &err);
        CHECK(s == ST_OK, "%s row %zu: %s", name, r, err.msg);
        int same = s == ST_OK && n == nexp;
        for (size_t i = 0; same && i < n; i++) same = ids[i] == json_object_get_int(json_object_array_get_idx(ji, i));
        CHECK(same, "%s row %zu (\"%s\"): %zu ids, tokenizers gives %zu; ids %s", name, r, text, n, nexp,
              json_object_to_json_string(ji));
        if (!same) {
            fprintf(stderr, "  strata:");
            for (size_t i = 0; i < n && i < 1024; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        total_ids += n;
        char back[4096];
        size_t blen = 0;
        s = st_tokenizer_decode(tok, ids, n, back, sizeof back, &blen, &err);
        CHECK(s == ST_OK && blen == dlen && memcmp(back, dec, dlen) == 0, "%s row %zu: decode gives \"%.*s\"",
              name, r, (int)blen, back);
        CHECK(!round_trip || (dlen == tlen && memcmp(dec, text, tlen) == 0), "%s row %zu: round trip", name, r);
        if (n > 1) { /* a short buffer reports the size it needs */
            size_t need = 0;
            s = st_tokenizer_encode(tok, text, tlen, ids, 1, &need, &err);
            CHECK(s == ST_ERR_INVALID && need == n, "%s row %zu: cap 1 gives %d, need %zu", name, r, (int)s, need);
        }
    }
    CHECK(total_ids > 100, "%s: only %zu ids in all", name, total_ids);
    /* an id with no token is refused, naming its index */
    int32_t bad[2] = {1, (int32_t)st_tokenizer_vocab_size(tok)};
    char out[64];
    size_t olen;
    s = st_tokenizer_decode(tok, bad, 2, out, sizeof out, &olen, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, "ids[1]"), "%s: bad id: %s", name, err.msg);
    /* invalid UTF-8 still round-trips byte for byte */
    if (junk) {
        size_t jl = strlen(junk);
        int32_t ids[128];
        size_t n;
        s = st_tokenizer_encode(tok, junk, jl, ids, 128, &n, &err);
        CHECK(s == ST_OK, "%s: invalid utf-8: %s", name, err.msg);
        s = st_tokenizer_decode(tok, ids, n, out, sizeof out, &olen, &err);
        CHECK(s == ST_OK && olen == jl && memcmp(out, junk, olen) == 0, "%s: invalid utf-8 round trip: \"%.*s\"",
              name, (int)olen, out);
    }
    json_object_put(rows);
    st_tokenizer_free(tok);
}

static void check_fixture(const char *name, int round_trip, const char *special, const char *junk) {
    char file[128], expected[128];
    snprintf(file, sizeof file, "tests/fixtures/tok_%s.json", name);
    snprintf(expected, sizeof expected, "tests/fixtures/tok_%s_expected.json", name);
    check_files(name, file, expected, NULL, round_trip, special, junk);
}

/* Write text to a file in the test's temporary directory and load it: it must fail with
 * code, and the message must contain want. */
static void check_refused(const char *fname, const char *text, st_status code, const char *want) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), fname);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    st_tokenizer *tok = NULL;
    st_err err = {0};
    st_status s = st_tokenizer_load(&tok, path, &err);
    CHECK(s == code && tok == NULL, "%s: status %s, want %s (%s)", fname, st_status_name(s), st_status_name(code),
          err.msg);
    CHECK(strstr(err.msg, want) != NULL, "%s: message \"%s\" lacks \"%s\"", fname, err.msg, want);
    CHECK(strstr(err.msg, path) != NULL, "%s: message \"%s\" lacks the path", fname, err.msg);
    st_tokenizer_free(tok);
}

/* Llama-2's form: <0xNN> runs decode to their bytes, whatever they form (tokenizers writes
 * U+FFFD where they are not UTF-8; strata keeps the bytes), Replace/Strip apply around them. */
static void check_byte_fallback(void) {
    st_tokenizer *tok = NULL;
    st_err err = {0};
    st_status s = st_tokenizer_load(&tok, test_source_path("tests/fixtures/tok_llama2.json"), &err);
    CHECK(s == ST_OK, "llama2: %s", err.msg);
    if (s != ST_OK) return;
    int32_t ids[6] = {st_tokenizer_token_id(tok, "<0x20>"), st_tokenizer_token_id(tok, "<0xFF>"),
                      st_tokenizer_token_id(tok, "\xe2\x96\x81"), st_tokenizer_token_id(tok, "<0xE4>"),
                      st_tokenizer_token_id(tok, "<0xB8>"), st_tokenizer_token_id(tok, "<0xAD>")};
    CHECK(ids[0] == 3 + 0x20 && ids[1] == 3 + 0xFF && ids[2] >= 0, "llama2: byte token ids %d %d %d", ids[0], ids[1],
          ids[2]);
    char out[32];
    size_t len = 0;
    /* " \xff" + "▁"->" " + "中" from three bytes; Fuse then Strip takes the leading space */
    s = st_tokenizer_decode(tok, ids, 6, out, sizeof out, &len, &err);
    CHECK(s == ST_OK && len == 5 && memcmp(out, "\xff \xe4\xb8\xad", 5) == 0, "llama2: decode gives %zu bytes \"%.*s\"",
          len, (int)len, out);
    /* the same through a short buffer: the size it needs */
    s = st_tokenizer_decode(tok, ids, 6, out, 2, &len, &err);
    CHECK(s == ST_ERR_INVALID && len == 5, "llama2: cap 2 gives %s, need %zu", st_status_name(s), len);
    st_tokenizer_free(tok);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n, "short write %s", path);
    fclose(f);
}

/* A model directory: tokenizer.json (the llama2 fixture) and tokenizer_config.json. */
static char *make_model_dir(const char *name, const char *config) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    mkdir(dir, 0755);
    size_t n = 0;
    unsigned char *json = test_slurp(test_source_path("tests/fixtures/tok_llama2.json"), &n);
    CHECK(json != NULL, "cannot read tok_llama2.json");
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (json) write_file(path, json, n);
    free(json);
    if (config) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        write_file(path, config, strlen(config));
    }
    return dir;
}

/* tokenizer_config.json: BOS/EOS/pad as strings or {"content"}, add_bos_token, the template
 * as a string, a list, or chat_template.jinja; a token the tokenizer lacks is refused. */
static void check_model_dir(void) {
    st_tokenizer *tok = NULL, *file_tok = NULL;
    st_err err = {0};
    const char *tpl = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}";
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": \"<s>\", \"eos_token\": "
             "{\"__type\": \"AddedToken\", \"content\": \"</s>\", \"lstrip\": false, \"normalized\": false}, "
             "\"pad_token\": null, \"unk_token\": \"<unk>\", \"chat_template\": \"%s\", \"model_max_length\": 4096}",
             "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\\n{% endfor %}");
    const char *dir = make_model_dir("llama2_dir", cfg);
    st_status s = st_tokenizer_load(&tok, dir, &err);
    CHECK(s == ST_OK, "model dir: %s", err.msg);
    s = st_tokenizer_load(&file_tok, test_source_path("tests/fixtures/tok_llama2.json"), &err);
    CHECK(s == ST_OK, "llama2: %s", err.msg);
    if (tok && file_tok) {
        CHECK(st_tokenizer_bos_id(tok) == 1 && st_tokenizer_eos_id(tok) == 2 && st_tokenizer_pad_id(tok) == -1,
              "model dir: bos %d eos %d pad %d", st_tokenizer_bos_id(tok), st_tokenizer_eos_id(tok),
              st_tokenizer_pad_id(tok));
        CHECK(st_tokenizer_add_bos(tok) == 1, "model dir: add_bos %d", st_tokenizer_add_bos(tok));
        const char *got = st_tokenizer_chat_template(tok);
        CHECK(got && strcmp(got, tpl) == 0, "model dir: chat template \"%s\"", got ? got : "(null)");
        /* the file alone has none of that, and encodes the same */
        CHECK(st_tokenizer_bos_id(file_tok) == -1 && st_tokenizer_eos_id(file_tok) == -1 &&
                  st_tokenizer_add_bos(file_tok) == -1 && st_tokenizer_chat_template(file_tok) == NULL,
              "file: config values without a config");
        const char text[] = "<s>The model reads 中文 🙂 text</s>";
        int32_t a[64], b[64];
        size_t na = 0, nb = 0;
        st_tokenizer_encode(tok, text, sizeof text - 1, a, 64, &na, &err);
        st_tokenizer_encode(file_tok, text, sizeof text - 1, b, 64, &nb, &err);
        CHECK(na == nb && na > 5 && memcmp(a, b, na * sizeof *a) == 0 && a[0] == 1, "model dir: %zu vs %zu ids", na,
              nb);
    }
    st_tokenizer_free(tok);
    st_tokenizer_free(file_tok);
    tok = NULL;

    /* a list of templates: the default one; no add_bos_token: -1; pad as {"content"} */
    dir = make_model_dir("list_dir", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                                     "{\"name\": \"default\", \"template\": \"D\"}], \"pad_token\": "
                                     "{\"content\": \"<unk>\"}}");
    s = st_tokenizer_load(&tok, dir, &err);
    CHECK(s == ST_OK && tok, "list dir: %s", err.msg);
    if (tok) {
        const char *got = st_tokenizer_chat_template(tok);
        CHECK(got && strcmp(got, "D") == 0, "list dir: template %s", got ? got : "(null)");
        CHECK(st_tokenizer_add_bos(tok) == -1 && st_tokenizer_bos_id(tok) == -1 && st_tokenizer_pad_id(tok) == 0,
              "list dir: add_bos %d bos %d pad %d", st_tokenizer_add_bos(tok), st_tokenizer_bos_id(tok),
              st_tokenizer_pad_id(tok));
    }
    st_tokenizer_free(tok);
    tok = NULL;

    /* no template in the config: chat_template.jinja beside it */
    dir = make_model_dir("jinja_dir", "{\"eos_token\": \"</s>\"}");
    char path[600];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    write_file(path, "J{{ x }}\n", 9);
    s = st_tokenizer_load(&tok, dir, &err);
    CHECK(s == ST_OK && tok && st_tokenizer_chat_template(tok) &&
              strcmp(st_tokenizer_chat_template(tok), "J{{ x }}\n") == 0 && st_tokenizer_eos_id(tok) == 2,
          "jinja dir: %s", err.msg);
    st_tokenizer_free(tok);
    tok = NULL;

    /* no config at all: the tokenizer alone */
    dir = make_model_dir("bare_dir", NULL);
    s = st_tokenizer_load(&tok, dir, &err);
    CHECK(s == ST_OK && tok && st_tokenizer_bos_id(tok) == -1, "bare dir: %s", err.msg);
    st_tokenizer_free(tok);
    tok = NULL;

    /* refused: a BOS the tokenizer lacks, a malformed config, a directory with no tokenizer */
    dir = make_model_dir("badbos_dir", "{\"bos_token\": \"<|begin_of_text|>\"}");
    s = st_tokenizer_load(&tok, dir, &err);
    CHECK(s == ST_ERR_FORMAT && !tok && strstr(err.msg, "bos_token '<|begin_of_text|>'") &&
              strstr(err.msg, "tokenizer_config.json"),
          "bad bos: %s", err.msg);
    dir = make_model_dir("badcfg_dir", "{\"bos_token\": ");
    s = st_tokenizer_load(&tok, dir, &err);
    CHECK(s == ST_ERR_FORMAT && !tok && strstr(err.msg, "tokenizer_config.json: malformed JSON"), "bad config: %s",
          err.msg);
    dir = make_model_dir("badtype_dir", "{\"eos_token\": 7}");
    s = st_tokenizer_load(&tok, dir, &err);
    CHECK(s == ST_ERR_FORMAT && !tok && strstr(err.msg, "eos_token is neither"), "eos 7: %s", err.msg);
    snprintf(path, sizeof path, "%s/empty_dir", test_tmpdir());
    mkdir(path, 0755);
    s = st_tokenizer_load(&tok, path, &err);
    CHECK(s == ST_ERR_IO && !tok && strstr(err.msg, path) && strstr(err.msg, "neither tokenizer.json"),
          "empty dir: %s", err.msg);
}

static void copy_fixture(const char *rel, const char *path) {
    size_t n = 0;
    unsigned char *b = test_slurp(test_source_path(rel), &n);
    CHECK(b != NULL, "cannot read %s", rel);
    if (b) write_file(path, b, n);
    free(b);
}

static size_t encode_all(const st_tokenizer *tok, const char *text, int32_t *ids, size_t cap) {
    size_t n = 0;
    st_err err = {0};
    st_status s = st_tokenizer_encode(tok, text, strlen(text), ids, cap, &n, &err);
    CHECK(s == ST_OK, "encode: %s", err.msg);
    return s == ST_OK ? n : 0;
}

static const char *const RANK_SPECIALS[] = {"<|endoftext|>", "<|im_start|>"};

/* Invalid UTF-8 in a byte-level model: tiktoken's bytes API (Encoding._encode_bytes) on each
 * piece between special tokens. The ids, for tok_ranks.tiktoken (Llama-3 pattern) and for
 * tok_llama3.json (the same model, its own ids), came from (in the repository root, with
 * tokenizers and tiktoken installed):
 *   python3 -c 'import base64,sys; sys.path.insert(0,"tools"); import tiktoken, gen_tokenizer_fixtures as g;
 *     from tokenizers import Tokenizer
 *     r={base64.b64decode(l.split()[0]):int(l.split()[1]) for l in open("tests/fixtures/tok_ranks.tiktoken","rb")}
 *     e=tiktoken.Encoding(name="x",pat_str=g.LLAMA3_PATTERN,mergeable_ranks=r,
 *       special_tokens={t:len(r)+i for i,t in enumerate(g.RANK_SPECIALS)})
 *     j=g.json_ids(Tokenizer.from_file("tests/fixtures/tok_llama3.json"),r)
 *     for b in [b"\xffhello  world",b"hello  \xe4\xb8  world",b"hello world  \xc3",b"\x80  \xfe\xff",
 *               b"ab  \xff<|endoftext|>  cd\xfe  x  y"]:
 *       i=g.encode_bytes(e,b); print(i,[j[x] for x in i])'
 * All but the third and fourth differ from encoding each run of valid UTF-8 as text: after the
 * first invalid byte "  world" is one piece ("  " then " world" by the regex). */
static void check_bytes_rule(void) {
    static const struct {
        const char *text;
        int32_t ranks[12], json[12];
        size_t n;
    } CASES[] = {
        {"\xffhello  world", {255, 353, 256, 555}, {188, 354, 257, 556}, 4},
        {"hello  \xe4\xb8  world", {353, 256, 228, 184, 256, 555}, {354, 257, 161, 117, 257, 556}, 6},
        {"hello world  \xc3", {353, 528, 256, 195}, {354, 529, 257, 128}, 4},
        {"\x80  \xfe\xff", {128, 256, 254, 255}, {223, 257, 187, 188}, 4},
        {"ab  \xff<|endoftext|>  cd\xfe  x  y", {323, 256, 255, 599, 256, 99, 100, 254, 256, 120, 256, 121},
         {324, 257, 188, 0, 257, 67, 68, 187, 257, 88, 257, 89}, 12},
    };
    st_tokenizer_opts ro = {.pattern = "llama3", .special = RANK_SPECIALS, .n_special = 2};
    for (int json = 0; json < 2; json++) {
        st_tokenizer *tok = NULL;
        st_err err = {0};
        const char *file = json ? "tests/fixtures/tok_llama3.json" : "tests/fixtures/tok_ranks.tiktoken";
        st_status s = st_tokenizer_load_ex(&tok, test_source_path(file), json ? NULL : &ro, &err);
        CHECK(s == ST_OK, "%s: %s", file, err.msg);
        if (s != ST_OK) continue;
        for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
            const int32_t *want = json ? CASES[k].json : CASES[k].ranks;
            int32_t ids[32];
            size_t n = encode_all(tok, CASES[k].text, ids, 32);
            size_t d = 0; /* the first id that differs */
            while (d < n && d < CASES[k].n && ids[d] == want[d]) d++;
            CHECK(n == CASES[k].n && d == n, "%s: bytes rule case %zu: %zu ids, tiktoken's %zu; ids[%zu] = %d, not %d",
                  file, k, n, CASES[k].n, d, d < n ? ids[d] : -1, d < CASES[k].n ? want[d] : -1);
            char out[64];
            size_t ol = 0;
            s = st_tokenizer_decode(tok, ids, n, out, sizeof out, &ol, &err);
            CHECK(s == ST_OK && ol == strlen(CASES[k].text) && memcmp(out, CASES[k].text, ol) == 0,
                  "%s: bytes rule case %zu does not decode to its bytes", file, k);
        }
        st_tokenizer_free(tok);
    }
}

/* A rank file is known by its content, under any name and as a directory's tokenizer.model;
 * a JSON file named .tiktoken is read as JSON. */
static void check_rank_files(void) {
    const char *text = "Hello world<|endoftext|> 中文 🙂 x<|im_start|>  42\n";
    st_tokenizer_opts ro = {.pattern = "llama3", .special = RANK_SPECIALS, .n_special = 2, .eos_token = "<|endoftext|>"};
    st_tokenizer *ref = NULL, *tok = NULL;
    st_err err = {0};
    st_status s = st_tokenizer_load_ex(&ref, test_source_path("tests/fixtures/tok_ranks.tiktoken"), &ro, &err);
    CHECK(s == ST_OK, "ranks: %s", err.msg);
    if (!ref) return;
    CHECK(st_tokenizer_vocab_size(ref) == 601 && st_tokenizer_token_id(ref, "<|im_start|>") == 600 &&
              st_tokenizer_eos_id(ref) == 599 && st_tokenizer_bos_id(ref) == -1,
          "ranks: vocab %zu, <|im_start|> %d, eos %d", st_tokenizer_vocab_size(ref),
          st_tokenizer_token_id(ref, "<|im_start|>"), st_tokenizer_eos_id(ref));
    int32_t want[64], got[64];
    size_t nw = encode_all(ref, text, want, 64);
    CHECK(nw > 10, "ranks: %zu ids", nw);
    char path[600];
    snprintf(path, sizeof path, "%s/renamed.json", test_tmpdir());
    copy_fixture("tests/fixtures/tok_ranks.tiktoken", path);
    s = st_tokenizer_load_ex(&tok, path, &ro, &err);
    CHECK(s == ST_OK && tok && encode_all(tok, text, got, 64) == nw && memcmp(got, want, nw * sizeof *got) == 0,
          "ranks named .json: %s", err.msg);
    st_tokenizer_free(tok);
    tok = NULL;
    snprintf(path, sizeof path, "%s/llama3_original", test_tmpdir());
    mkdir(path, 0755);
    strcat(path, "/tokenizer.model");
    copy_fixture("tests/fixtures/tok_ranks.tiktoken", path);
    path[strlen(path) - strlen("/tokenizer.model")] = 0;
    s = st_tokenizer_load_ex(&tok, path, &ro, &err);
    CHECK(s == ST_OK && tok && encode_all(tok, text, got, 64) == nw && memcmp(got, want, nw * sizeof *got) == 0 &&
              st_tokenizer_eos_id(tok) == 599,
          "ranks as a directory's tokenizer.model: %s", err.msg);
    st_tokenizer_free(tok);
    tok = NULL;
    snprintf(path, sizeof path, "%s/gpt2.tiktoken", test_tmpdir());
    copy_fixture("tests/fixtures/tok_gpt2.json", path);
    s = st_tokenizer_load(&tok, path, &err);
    CHECK(s == ST_OK && tok && st_tokenizer_token_id(tok, "<|endoftext|>") >= 0, "json named .tiktoken: %s",
          err.msg);
    st_tokenizer_free(tok);
    tok = NULL;
    /* options that cannot be: a regex that does not compile, a special id a rank has, an
     * eos that is no token */
    st_tokenizer_opts bad = {.pattern = "(unclosed"};
    s = st_tokenizer_load_ex(&tok, test_source_path("tests/fixtures/tok_ranks.tiktoken"), &bad, &err);
    CHECK(s == ST_ERR_UNSUPPORTED && !tok && strstr(err.msg, "pattern: regex '(unclosed'"), "bad pattern: %s",
          err.msg);
    static const int32_t taken[] = {5};
    st_tokenizer_opts bad2 = {.pattern = "llama3", .special = RANK_SPECIALS, .special_ids = taken, .n_special = 1};
    s = st_tokenizer_load_ex(&tok, test_source_path("tests/fixtures/tok_ranks.tiktoken"), &bad2, &err);
    CHECK(s == ST_ERR_INVALID && !tok && strstr(err.msg, "'<|endoftext|>' has id 5"), "taken id: %s", err.msg);
    st_tokenizer_opts bad3 = {.pattern = "llama3", .eos_token = "<|eot_id|>"};
    s = st_tokenizer_load_ex(&tok, test_source_path("tests/fixtures/tok_ranks.tiktoken"), &bad3, &err);
    CHECK(s == ST_ERR_FORMAT && !tok && strstr(err.msg, "eos_token '<|eot_id|>'"), "eos not a token: %s", err.msg);
    st_tokenizer_free(ref);
}

/* A rank file's pre-tokenizer pattern is said, never guessed. tok_ranks_digits.tiktoken and the
 * ids PyPI tiktoken gives with each known pattern (its publisher's regex: tiktoken's own for
 * gpt2, cl100k, o200k; Meta's for llama3; Qwen's for qwen2), special tokens after the ranks as
 * Qwen's, come from tools/gen_rank_pattern_fixtures.py. Each pattern, by its name and by its
 * regex, must give those ids; Qwen's single digits and Llama-3's \p{N}{1,3} give other ids on
 * the fullwidth digits of "第１０章：２０２０年..."; with no pattern said the file is refused,
 * naming the file and --pattern; a known file name (qwen.tiktoken) or a tokenizer_config.json
 * beside the file (tokenizer_class QWenTokenizer, pat_str; added_tokens_decoder for the
 * special tokens, eos_token) says it. */
static int ids_equal(const st_tokenizer *tok, const char *text, size_t len, json_object *want) {
    int32_t ids[512];
    size_t n = 0;
    st_err err = {0};
    if (st_tokenizer_encode(tok, text, len, ids, 512, &n, &err) != ST_OK || n != json_object_array_length(want))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] != json_object_get_int(json_object_array_get_idx(want, i))) return 0;
    return 1;
}

static void check_named_patterns(void) {
    const char *rank_rel = "tests/fixtures/tok_ranks_digits.tiktoken";
    json_object *fx = json_object_from_file(test_source_path("tests/fixtures/tok_ranks_patterns_expected.json"));
    json_object *texts = NULL, *pats = NULL, *spec = NULL, *nr = NULL;
    CHECK(fx && json_object_object_get_ex(fx, "texts", &texts) && json_object_object_get_ex(fx, "patterns", &pats) &&
              json_object_object_get_ex(fx, "special_tokens", &spec) && json_object_object_get_ex(fx, "n_ranks", &nr),
          "tok_ranks_patterns_expected.json: cannot read");
    if (!texts || !pats || !spec || !nr) {
        json_object_put(fx);
        return;
    }
    int n_ranks = json_object_get_int(nr);
    const char *sp[8];
    int32_t sp_ids[8];
    size_t n_sp = 0;
    json_object_object_foreach(spec, sk, sv) {
        if (n_sp < 8) sp[n_sp] = sk, sp_ids[n_sp++] = json_object_get_int(sv);
    }
    size_t n_texts = json_object_array_length(texts);
    CHECK(n_texts >= 10 && json_object_object_length(pats) == 5 && n_sp == 3, "fixture: %zu texts, %d patterns",
          n_texts, json_object_object_length(pats));
    int32_t digits[2][64];
    size_t n_digits[2] = {0, 0};
    json_object_object_foreach(pats, name, pv) {
        json_object *jr, *jids;
        json_object_object_get_ex(pv, "regex", &jr);
        json_object_object_get_ex(pv, "ids", &jids);
        for (int form = 0; form < 2; form++) { /* by name, then by regex */
            st_tokenizer_opts o = {.pattern = form ? json_object_get_string(jr) : name, .special = sp,
                                   .special_ids = sp_ids, .n_special = n_sp};
            st_tokenizer *tok = NULL;
            st_err err = {0};
            st_status s = st_tokenizer_load_ex(&tok, test_source_path(rank_rel), &o, &err);
            CHECK(s == ST_OK, "pattern %s (%s): %s", name, form ? "regex" : "name", err.msg);
            if (s != ST_OK) continue;
            const char *nm = NULL, *from = NULL, *re = st_tokenizer_pattern(tok, &nm, &from);
            CHECK(re && !strcmp(re, json_object_get_string(jr)) && (form || (nm && !strcmp(nm, name))) &&
                      from && !strcmp(from, "the load options"),
                  "pattern %s: st_tokenizer_pattern gives '%s' (%s, from %s)", name, re ? re : "(null)",
                  nm ? nm : "no name", from ? from : "?");
            for (size_t k = 0; k < n_texts; k++) {
                json_object *jt = json_object_array_get_idx(texts, k);
                CHECK(ids_equal(tok, json_object_get_string(jt), (size_t)json_object_get_string_len(jt),
                                json_object_array_get_idx(jids, k)),
                      "pattern %s (%s): text %zu (\"%s\") is not tiktoken's ids", name, form ? "regex" : "name", k,
                      json_object_get_string(jt));
            }
            int which = !strcmp(name, "qwen2") ? 0 : !strcmp(name, "llama3") ? 1 : -1;
            if (which >= 0 && form == 0) {
                json_object *jt = json_object_array_get_idx(texts, 0);
                s = st_tokenizer_encode(tok, json_object_get_string(jt), (size_t)json_object_get_string_len(jt),
                                        digits[which], 64, &n_digits[which], &err);
                CHECK(s == ST_OK, "%s: %s", name, err.msg);
            }
            st_tokenizer_free(tok);
        }
    }
    /* strata's own ids: the two patterns split the fullwidth digits apart */
    CHECK(n_digits[0] > 0 && n_digits[1] > 0 &&
              (n_digits[0] != n_digits[1] || memcmp(digits[0], digits[1], n_digits[0] * sizeof(int32_t))),
          "qwen2 and llama3 give the same %zu ids on the fullwidth digits", n_digits[0]);
    json_object *q_ids = NULL, *l_ids = NULL, *q;
    if (json_object_object_get_ex(pats, "qwen2", &q)) json_object_object_get_ex(q, "ids", &q_ids);
    if (json_object_object_get_ex(pats, "llama3", &q)) json_object_object_get_ex(q, "ids", &l_ids);
    json_object *t0 = json_object_array_get_idx(texts, 0);
    const char *t0s = json_object_get_string(t0);
    size_t t0n = (size_t)json_object_get_string_len(t0);

    /* nothing says the pattern: refused, naming the file and the option */
    st_tokenizer *tok = NULL;
    st_err err = {0};
    st_tokenizer_opts none = {.special = sp, .special_ids = sp_ids, .n_special = n_sp};
    st_status s = st_tokenizer_load_ex(&tok, test_source_path(rank_rel), &none, &err);
    CHECK(s == ST_ERR_INVALID && !tok && strstr(err.msg, "tok_ranks_digits.tiktoken") &&
              strstr(err.msg, "--pattern NAME|REGEX") && strstr(err.msg, "qwen2"),
          "a rank file with no pattern: %d %s", (int)s, err.msg);
    st_tokenizer_free(tok);
    tok = NULL;
    /* a known file name says it */
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/qwen_named", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/qwen.tiktoken", dir);
    copy_fixture(rank_rel, path);
    s = st_tokenizer_load_ex(&tok, path, &none, &err);
    const char *nm = NULL, *from = NULL;
    CHECK(s == ST_OK && tok && st_tokenizer_pattern(tok, &nm, &from) && nm && !strcmp(nm, "qwen2") &&
              !strcmp(from, "the file's name") && q_ids && ids_equal(tok, t0s, t0n, json_object_array_get_idx(q_ids, 0)),
          "qwen.tiktoken: %s (pattern %s from %s)", s ? err.msg : "loaded", nm ? nm : "?", from ? from : "?");
    st_tokenizer_free(tok);
    tok = NULL;
    /* a tokenizer_config.json beside the file: Qwen's class, its special tokens and eos */
    snprintf(dir, sizeof dir, "%s/qwen_config", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char cfg[1024];
    int cl = snprintf(cfg, sizeof cfg,
                      "{\"tokenizer_class\": \"QWenTokenizer\", \"eos_token\": \"<|endoftext|>\", "
                      "\"added_tokens_decoder\": {\"%d\": {\"content\": \"<|endoftext|>\", \"special\": true}, "
                      "\"%d\": {\"content\": \"<|im_start|>\", \"special\": true}, "
                      "\"%d\": {\"content\": \"<|im_end|>\", \"special\": true}}}",
                      n_ranks, n_ranks + 1, n_ranks + 2);
    write_file(path, cfg, (size_t)cl);
    snprintf(path, sizeof path, "%s/ranks.tiktoken", dir);
    copy_fixture(rank_rel, path);
    s = st_tokenizer_load(&tok, path, &err);
    int all = s == ST_OK && q_ids;
    for (size_t k = 0; all && k < n_texts; k++) {
        json_object *jt = json_object_array_get_idx(texts, k);
        all = ids_equal(tok, json_object_get_string(jt), (size_t)json_object_get_string_len(jt),
                        json_object_array_get_idx(q_ids, k));
    }
    CHECK(all && st_tokenizer_eos_id(tok) == n_ranks && st_tokenizer_vocab_size(tok) == (size_t)n_ranks + 3 &&
              st_tokenizer_pattern(tok, &nm, &from) && !strcmp(nm, "qwen2") &&
              !strcmp(from, "tokenizer_config.json's tokenizer_class QWenTokenizer"),
          "ranks with Qwen's tokenizer_config.json beside: %s (eos %d, vocab %zu)", s ? err.msg : "ids differ",
          tok ? st_tokenizer_eos_id(tok) : -1, tok ? st_tokenizer_vocab_size(tok) : 0);
    st_tokenizer_free(tok);
    tok = NULL;
    /* pat_str names the pattern; the options win over the config */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, "{\"pat_str\": \"llama3\"}", 21);
    snprintf(path, sizeof path, "%s/ranks.tiktoken", dir);
    s = st_tokenizer_load_ex(&tok, path, &none, &err);
    CHECK(s == ST_OK && st_tokenizer_pattern(tok, &nm, &from) && !strcmp(nm, "llama3") &&
              !strcmp(from, "tokenizer_config.json's pat_str") && l_ids &&
              ids_equal(tok, t0s, t0n, json_object_array_get_idx(l_ids, 0)),
          "pat_str llama3: %s", s ? err.msg : "other ids");
    st_tokenizer_free(tok);
    tok = NULL;
    st_tokenizer_opts qwen = none;
    qwen.pattern = "qwen2";
    s = st_tokenizer_load_ex(&tok, path, &qwen, &err);
    CHECK(s == ST_OK && q_ids && ids_equal(tok, t0s, t0n, json_object_array_get_idx(q_ids, 0)),
          "--pattern over pat_str: %s", s ? err.msg : "other ids");
    st_tokenizer_free(tok);
    json_object_put(fx);
}

/* Encode and decode share nothing mutable: four threads on one tokenizer each get the
 * ids and text one thread gets alone. */
typedef struct thread_job {
    const st_tokenizer *tok;
    const char *text;
    size_t len, n;
    int32_t *ids;
    int ok;
} thread_job;

static void *encode_job(void *arg) {
    thread_job *j = arg;
    st_err err = {0};
    char *back = malloc(j->len + 1);
    j->ok = back != NULL;
    for (int rep = 0; rep < 20 && j->ok; rep++) {
        size_t n = 0, blen = 0;
        j->ok = st_tokenizer_encode(j->tok, j->text, j->len, j->ids, j->len + 1, &n, &err) == ST_OK &&
                (rep == 0 || n == j->n) &&
                st_tokenizer_decode(j->tok, j->ids, n, back, j->len + 1, &blen, &err) == ST_OK && blen == j->len &&
                memcmp(back, j->text, blen) == 0;
        j->n = n;
    }
    free(back);
    return NULL;
}

static void check_threads(const char *file) {
    st_tokenizer *tok = NULL;
    st_err err = {0};
    if (st_tokenizer_load(&tok, test_source_path(file), &err) != ST_OK) {
        CHECK(0, "threads: %s", err.msg);
        return;
    }
    static const char unit[] = "The model reads 中文文本 🙂 and code: def f(x):\n\treturn x**2  # 12345\n";
    size_t len = 64 * (sizeof unit - 1);
    char *text = malloc(len);
    int32_t *ref = malloc((len + 1) * sizeof *ref);
    thread_job jobs[4];
    pthread_t th[4];
    if (text && ref) {
        for (size_t i = 0; i < len; i++) text[i] = unit[i % (sizeof unit - 1)];
        size_t nref = 0;
        st_tokenizer_encode(tok, text, len, ref, len + 1, &nref, &err);
        int started = 0;
        for (int i = 0; i < 4; i++) {
            jobs[i] = (thread_job){tok, text, len, 0, malloc((len + 1) * sizeof(int32_t)), 0};
            if (jobs[i].ids && pthread_create(&th[i], NULL, encode_job, &jobs[i]) == 0) started |= 1 << i;
        }
        for (int i = 0; i < 4; i++) {
            if (started & (1 << i)) pthread_join(th[i], NULL);
            CHECK((started & (1 << i)) && jobs[i].ok && jobs[i].n == nref &&
                      memcmp(jobs[i].ids, ref, nref * sizeof *ref) == 0,
                  "%s: thread %d: %zu ids, alone %zu", file, i, jobs[i].n, nref);
            free(jobs[i].ids);
        }
    }
    free(text);
    free(ref);
    st_tokenizer_free(tok);
}

#define BL_PRE "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
#define BL_DEC "\"decoder\":{\"type\":\"ByteLevel\"},"
#define TINY_BPE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

int main(void) {
    /* a leading space: no prefix space is added, and none is stripped */
    static const char junk_space[] = " ok \xff\xfe bad \xc3 tail \xe4\xb8 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf";
    check_fixture("gpt2", 1, "<|endoftext|>", junk_space);
    check_fixture("llama3", 1, "<|endoftext|>", junk_space);
    check_fixture("gpt2_prefix", 0, "<|endoftext|>", junk_space);
    /* byte fallback: invalid bytes become <0xNN> and decode to themselves */
    check_fixture("llama2", 0, "</s>", junk_space);
    check_fixture("mistral", 0, "<|im_start|>", junk_space + 1);
    check_fixture("spm_old", 0, "<s>", NULL);
    check_byte_fallback();
    check_model_dir();
    /* tiktoken rank file: the ids of PyPI tiktoken with the Llama-3 and GPT-2 patterns */
    st_tokenizer_opts ro = {.pattern = "llama3", .special = RANK_SPECIALS, .n_special = 2};
    check_files("ranks_llama3", "tests/fixtures/tok_ranks.tiktoken", "tests/fixtures/tok_ranks_llama3_expected.json",
                &ro, 1, "<|endoftext|>", junk_space);
    ro.pattern = "gpt2";
    check_files("ranks_gpt2", "tests/fixtures/tok_ranks.tiktoken", "tests/fixtures/tok_ranks_gpt2_expected.json", &ro,
                1, "<|im_start|>", junk_space);
    /* tokens merges cannot reach: tiktoken takes a piece that is itself a token */
    ro.pattern = "llama3";
    check_files("ranks_small", "tests/fixtures/tok_ranks_small.tiktoken",
                "tests/fixtures/tok_ranks_small_expected.json", &ro, 1, "<|im_start|>", junk_space);
    check_rank_files();
    check_named_patterns();
    check_bytes_rule();
    check_threads("tests/fixtures/tok_llama3.json");
    check_threads("tests/fixtures/tok_llama2.json");

    /* a minimal file loads, and merges "a b" */
    {
        char path[512];
        snprintf(path, sizeof path, "%s/tiny.json", test_tmpdir());
        FILE *f = fopen(path, "w");
        if (f) {
            fputs("{\"normalizer\":null," BL_PRE BL_DEC TINY_BPE "}", f);
            fclose(f);
        }
        st_tokenizer *tok = NULL;
        st_err err = {0};
        CHECK(st_tokenizer_load(&tok, path, &err) == ST_OK, "tiny: %s", err.msg);
        int32_t ids[8];
        size_t n = 0;
        if (tok) CHECK(st_tokenizer_encode(tok, "abab", 4, ids, 8, &n, &err) == ST_OK && n == 2 && ids[0] == 2,
                       "tiny: abab gives %zu ids", n);
        st_tokenizer_free(tok);
    }
    /* ignore_merges: a word that is itself in the vocabulary is one id, whatever the merges
     * would make of it (ids from tokenizers: [5] with it, [3, 2] without) */
    for (int ig = 0; ig < 2; ig++) {
        char path[512];
        snprintf(path, sizeof path, "%s/ignore%d.json", test_tmpdir(), ig);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "{\"normalizer\":null," BL_PRE BL_DEC "\"model\":{\"type\":\"BPE\",\"ignore_merges\":%s,"
                    "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5},\"merges\":[\"a b\",\"b c\"]}}",
                    ig ? "true" : "false");
            fclose(f);
        }
        st_tokenizer *tok = NULL;
        st_err err = {0};
        int32_t ids[8] = {0};
        size_t n = 0;
        CHECK(st_tokenizer_load(&tok, path, &err) == ST_OK, "ignore_merges %d: %s", ig, err.msg);
        if (tok) {
            st_status s = st_tokenizer_encode(tok, "abc", 3, ids, 8, &n, &err);
            CHECK(s == ST_OK && (ig ? n == 1 && ids[0] == 5 : n == 2 && ids[0] == 3 && ids[1] == 2),
                  "ignore_merges %d: %zu ids, first %d", ig, n, ids[0]);
        }
        st_tokenizer_free(tok);
    }
    /* a pattern that backtracks deeply on a 200 KB word needs more than JIT's default stack */
    {
        char path[512];
        snprintf(path, sizeof path, "%s/deep.json", test_tmpdir());
        FILE *f = fopen(path, "w");
        if (f) {
            fputs("{\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                  "\"Split\",\"pattern\":{\"Regex\":\"(?:a|ab)+c|\\\\s+|[^\\\\s]\"},\"behavior\":\"Isolated\","
                  "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                  BL_DEC "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"c\":3},"
                  "\"merges\":[\"a b\"]}}", f);
            fclose(f);
        }
        size_t pairs = 100000, len = 2 * pairs + 1, n = 0;
        char *text = malloc(len);
        int32_t *ids = malloc((pairs + 1) * sizeof *ids);
        st_tokenizer *tok = NULL;
        st_err err = {0};
        CHECK(st_tokenizer_load(&tok, path, &err) == ST_OK, "deep: %s", err.msg);
        if (tok && text && ids) {
            for (size_t i = 0; i < pairs; i++) memcpy(text + 2 * i, "ab", 2);
            text[len - 1] = 'c';
            st_status s = st_tokenizer_encode(tok, text, len, ids, pairs + 1, &n, &err);
            int ok = s == ST_OK && n == pairs + 1 && ids[pairs] == 3;
            for (size_t i = 0; ok && i < pairs; i++) ok = ids[i] == 2;
            CHECK(ok, "deep: status %s, %zu ids: %s", st_status_name(s), n, err.msg);
        }
        free(text);
        free(ids);
        st_tokenizer_free(tok);
    }
    check_refused("unigram.json",
                  "{\"normalizer\":null," BL_PRE BL_DEC "\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}",
                  ST_ERR_UNSUPPORTED, "model.type 'Unigram'");
    check_refused("wordpiece.json",
                  "{\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"decoder\":{\"type\":"
                  "\"WordPiece\"},\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}",
                  ST_ERR_UNSUPPORTED, "model.type 'WordPiece'");
    check_refused("nfc.json", "{\"normalizer\":{\"type\":\"NFC\"}," BL_PRE BL_DEC TINY_BPE "}", ST_ERR_UNSUPPORTED,
                  "normalizer.type 'NFC'");
    check_refused("whitespace.json",
                  "{\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                  "\"Whitespace\"}]}," BL_DEC TINY_BPE "}",
                  ST_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].type 'Whitespace'");
    check_refused("decoder.json",
                  "{\"normalizer\":null," BL_PRE "\"decoder\":{\"type\":\"WordPiece\"}," TINY_BPE "}",
                  ST_ERR_UNSUPPORTED, "decoder.type 'WordPiece'");
    check_refused("decoder_seq.json",
                  "{\"normalizer\":null," BL_PRE "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":"
                  "\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"CTC\"}]}," TINY_BPE "}",
                  ST_ERR_UNSUPPORTED, "decoder.decoders[2].type 'CTC'");
    check_refused("norm_seq.json",
                  "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
                  "\"_\"},{\"type\":\"NFKC\"}]}," BL_PRE BL_DEC TINY_BPE "}",
                  ST_ERR_UNSUPPORTED, "normalizer.normalizers[1].type 'NFKC'");
    check_refused("norm_regex.json",
                  "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},\"content\":\"_\"},"
                  BL_PRE BL_DEC TINY_BPE "}",
                  ST_ERR_UNSUPPORTED, "normalizer.pattern.Regex");
    check_refused("metaspace_scheme.json",
                  "{\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\","
                  "\"prepend_scheme\":\"sometimes\"}," BL_DEC TINY_BPE "}",
                  ST_ERR_FORMAT, "pre_tokenizer.prepend_scheme 'sometimes'");
    check_refused("badmerge.json",
                  "{\"normalizer\":null," BL_PRE BL_DEC
                  "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}}",
                  ST_ERR_FORMAT, "model.merges[0]");
    check_refused("bad.tiktoken", "AA== 0\nAQ== 1\n\nnot base64! 2\n", ST_ERR_FORMAT,
                  "neither JSON nor a tiktoken rank file: line 4 is not 'base64token rank': 'not base64! 2'");
    check_refused("sentencepiece.model", "\x0a\x0b\x08<unk>\x15\x01\x02", ST_ERR_FORMAT,
                  "line 2 is not 'base64token rank'");
    check_refused("norank.tiktoken", "AA== 0\nAQ==\n", ST_ERR_FORMAT, "line 2 is not");
    check_refused("badpad.tiktoken", "AA== 0\nA=Q= 1\n", ST_ERR_FORMAT, "line 2 is not");
    check_refused("duprank.tiktoken", "AA== 0\nAQ== 0\n", ST_ERR_FORMAT, "line 2: rank 0 is already taken");
    check_refused("duptoken.tiktoken", "AA== 0\nAA== 1\n", ST_ERR_FORMAT,
                  "line 2: the token of rank 0 is already taken");
    check_refused("nobyte.tiktoken", "AA== 0\nAQ== 1\n", ST_ERR_FORMAT, "no line gives byte 0x02 a rank");
    check_refused("empty.tiktoken", "\n\n", ST_ERR_FORMAT, "empty: neither JSON nor a tiktoken rank file");
    check_refused("malformed.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}", ST_ERR_FORMAT,
                  "malformed JSON");
    check_refused("truncated.json", "{\"model\": {\"type\": \"BPE\"", ST_ERR_FORMAT, "malformed JSON");
    {
        st_tokenizer *tok = NULL;
        st_err err = {0};
        st_status s = st_tokenizer_load(&tok, "/nonexistent/tokenizer.json", &err);
        CHECK(s == ST_ERR_IO && strstr(err.msg, "/nonexistent/tokenizer.json"), "missing file: %s", err.msg);
    }
    return test_finish("tokenizer");
}

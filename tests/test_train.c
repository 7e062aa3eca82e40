/* test_train.c - the training loop's promises:
 *  - resume is bit-exact: 6 steps in one run == 3 steps, stop, resume, 3 more
 *    (weights and optimizer state compared bit for bit), with gradient accumulation
 *    and active clipping so every part of the step is exercised;
 *  - the loss falls;
 *  - bad configuration and bad checkpoints are clear errors naming the key, file or
 *    offset, and a failed resume leaves the checkpoint it read untouched. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/train.h"
#include "testutil.h"

static void small_config(st_train_config *c, const char *run_dir) {
    st_train_config_defaults(c);
    st_err err;
    const char *kv[][2] = {{"model", "gpt2-mini"}, {"n_layer", "2"}, {"n_embd", "64"}, {"n_head", "2"},
                           {"batch", "4"},         {"seq", "32"},    {"grad_accum", "2"}, {"steps", "6"},
                           {"warmup_steps", "2"},  {"lr", "0.003"},  {"grad_clip", "0.5"}, {"quiet", "1"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (st_train_config_set(c, kv[i][0], kv[i][1], &err)) fprintf(stderr, "config: %s\n", err.msg);
    snprintf(c->run_dir, sizeof c->run_dir, "%s", run_dir);
}

static void expect_set_error(const char *key, const char *value, const char *needle) {
    st_train_config c;
    st_train_config_defaults(&c);
    st_err err = {0};
    st_status s = st_train_config_set(&c, key, value, &err);
    CHECK(s == ST_ERR_INVALID && strstr(err.msg, needle), "set %s=%s: %s", key, value, err.msg);
}

int main(void) {
    char a[512], b[512], p1[700], p2[700];
    snprintf(a, sizeof a, "%s/full", test_tmpdir());
    snprintf(b, sizeof b, "%s/split", test_tmpdir());
    st_err err = {0};
    st_train_config c;
    st_train_result r;

    /* one run of 6 steps */
    small_config(&c, a);
    CHECK(st_train_run(&c, &r, &err) == ST_OK, "full run: %s", err.msg);
    CHECK(r.steps_done == 6, "full run did %ld steps", r.steps_done);
    /* 3 steps (the schedule still spans 6), then resume for the rest */
    small_config(&c, b);
    c.stop_at = 3;
    CHECK(st_train_run(&c, &r, &err) == ST_OK, "first half: %s", err.msg);
    CHECK(r.steps_done == 3, "first half did %ld steps", r.steps_done);
    small_config(&c, b);
    snprintf(c.resume, sizeof c.resume, "%s", b);
    CHECK(st_train_run(&c, &r, &err) == ST_OK, "resume: %s", err.msg);
    CHECK(r.steps_done == 6, "resumed run ended at %ld", r.steps_done);
    snprintf(p1, sizeof p1, "%s/checkpoints/step_00000006/model.safetensors", a);
    snprintf(p2, sizeof p2, "%s/checkpoints/step_00000006/model.safetensors", b);
    CHECK(test_same_file(p1, p2), "weights after 6 steps differ between one run and 3 + resume + 3");
    snprintf(p1, sizeof p1, "%s/checkpoints/step_00000006/train_state.bin", a);
    snprintf(p2, sizeof p2, "%s/checkpoints/step_00000006/train_state.bin", b);
    CHECK(test_same_file(p1, p2), "optimizer state after 6 steps differs between one run and 3 + resume + 3");

    /* metrics.jsonl: one line per step; the loss falls */
    snprintf(p1, sizeof p1, "%s/metrics.jsonl", a);
    FILE *f = fopen(p1, "r");
    char line[1024];
    int lines = 0;
    double first = 0, last = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\":");
        if (l) { last = atof(l + 7); if (!lines) first = last; }
        lines++;
    }
    if (f) fclose(f);
    CHECK(lines == 6, "metrics.jsonl has %d lines, want 6", lines);
    CHECK(last < first - 0.3, "loss did not fall: %.4f -> %.4f", first, last);

    /* layer streaming through strata train: with the activations recomputed (2.4 MB
     * budget) or kept (2.8 MB) the weights after 6 steps equal the in-memory run's bit
     * for bit (same arithmetic, other placement), and a streamed run resumes bit-exactly */
    const char *budgets[] = {"2400000", "2800000"};
    for (int k = 0; k < 2; k++) {
        char sd[600];
        snprintf(sd, sizeof sd, "%s/stream%d", test_tmpdir(), k);
        small_config(&c, sd);
        c.grad_accum = 1;
        st_train_config_set(&c, "device_budget", budgets[k], &err);
        CHECK(st_train_run(&c, &r, &err) == ST_OK, "streamed run (budget %s): %s", budgets[k], err.msg);
        char ref[600];
        snprintf(ref, sizeof ref, "%s/noaccum", test_tmpdir());
        if (k == 0) {
            small_config(&c, ref);
            c.grad_accum = 1;
            CHECK(st_train_run(&c, &r, &err) == ST_OK, "in-memory run: %s", err.msg);
        }
        snprintf(p1, sizeof p1, "%s/checkpoints/step_00000006/model.safetensors", ref);
        snprintf(p2, sizeof p2, "%s/checkpoints/step_00000006/model.safetensors", sd);
        CHECK(test_same_file(p1, p2), "streamed weights (budget %s) differ from the in-memory run", budgets[k]);
    }
    {
        char sa[600], sb[600];
        snprintf(sa, sizeof sa, "%s/stream0", test_tmpdir());
        snprintf(sb, sizeof sb, "%s/streamsplit", test_tmpdir());
        small_config(&c, sb);
        c.grad_accum = 1;
        c.stop_at = 3;
        st_train_config_set(&c, "device_budget", "2400000", &err);
        CHECK(st_train_run(&c, &r, &err) == ST_OK, "streamed first half: %s", err.msg);
        small_config(&c, sb);
        c.grad_accum = 1;
        st_train_config_set(&c, "device_budget", "2400000", &err);
        snprintf(c.resume, sizeof c.resume, "%s", sb);
        CHECK(st_train_run(&c, &r, &err) == ST_OK, "streamed resume: %s", err.msg);
        snprintf(p1, sizeof p1, "%s/checkpoints/step_00000006/train_state.bin", sa);
        snprintf(p2, sizeof p2, "%s/checkpoints/step_00000006/train_state.bin", sb);
        CHECK(test_same_file(p1, p2), "streamed 3 + resume + 3 differs from 6 streamed steps");
        small_config(&c, sb);
        st_train_config_set(&c, "device_budget", "400000", &err);
        c.grad_accum = 1;
        c.steps = 7;
        snprintf(c.resume, sizeof c.resume, "%s", sb);
        CHECK(st_train_run(&c, &r, &err) == ST_ERR_NOMEM && strstr(err.msg, "device_budget") && strstr(err.msg, "missing"),
              "a device budget too small names the bytes missing: %s", err.msg);
    }

    /* configuration errors name the key */
    expect_set_error("bogus_key", "1", "unknown configuration key 'bogus_key'");
    expect_set_error("lr", "fast", "key 'lr': 'fast' is not a number");
    expect_set_error("lr", "-1", "outside");
    expect_set_error("batch", "0", "key 'batch'");
    expect_set_error("steps", "1.5", "not an integer");
    expect_set_error("seed", "-3", "non-negative");
    st_train_config_defaults(&c);
    c.seq = 4096;
    st_model_shape ms;
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "key 'seq'"), "seq > max_seq: %s",
          err.msg);
    st_train_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "gpt5");
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "gpt5"), "bad model: %s", err.msg);
    st_train_config_defaults(&c);
    c.n_embd = 100;
    c.n_head = 3;
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "n_head"), "n_head: %s", err.msg);
    st_train_config_defaults(&c);
    c.batch = 1 << 20;
    c.seq = 256;
    c.n_layer = 4096;
    c.n_embd = 65536;
    c.n_head = 1;
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "bytes"), "absurd: %s", err.msg);
    /* one resolve for every family: the same checks for a Llama preset */
    st_train_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "llama-tiny");
    c.vocab_size = 256; /* the embedded corpus's bytes */
    c.seq = 16;
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_OK && !strcmp(ms.arch, "llama") && ms.n_kv_head < ms.n_head &&
              ms.n_params > 0 && ms.act_bytes > 0 && strstr(ms.desc, "NKV="),
          "llama-tiny resolves as the Llama family: %s (%s)", err.msg, ms.desc);
    c.seq = ms.max_seq + 1;
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "key 'seq'"),
          "llama seq > max_seq: %s", err.msg);
    c.seq = 256;
    c.max_seq = 256;
    c.batch = 1 << 20;
    c.n_layer = 4096;
    c.n_embd = 65536;
    c.n_head = 16; /* head_dim 4096, the most the family takes */
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "bytes"), "llama absurd: %s",
          err.msg);
    st_train_config_defaults(&c);
    snprintf(c.save_hf_dtype, sizeof c.save_hf_dtype, "f16");
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "key 'save_hf_dtype'"),
          "gpt2 save_hf_dtype: %s", err.msg);
    /* a Llama directory fixes the shape as a GPT-2 one does: an override may only repeat it */
    snprintf(p1, sizeof p1, "%s/llama_hf", test_tmpdir());
    mkdir(p1, 0755);
    char cfg_path[sizeof p1 + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", p1);
    f = fopen(cfg_path, "w");
    fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 256, "
          "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
          "\"num_key_value_heads\": 2, \"max_position_embeddings\": 128, \"hidden_act\": \"silu\"}",
          f);
    fclose(f);
    st_train_config_defaults(&c);
    snprintf(c.init_from, sizeof c.init_from, "%s", p1);
    c.seq = 32;
    c.n_layer = 2; /* repeats the directory's */
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_OK && !strcmp(ms.arch, "llama") && ms.n_layer == 2 &&
              ms.from_dir,
          "a Llama directory resolves: %s", err.msg);
    c.n_layer = 3;
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "key 'n_layer'"),
          "a Llama directory's n_layer overridden: %s", err.msg);
    c.n_layer = 0;
    c.seq = 129;
    CHECK(st_train_config_resolve(&c, &ms, &err) == ST_ERR_INVALID && strstr(err.msg, "key 'seq'") &&
              strstr(err.msg, "init_from"),
          "seq beyond the directory's max_position_embeddings: %s", err.msg);
    /* JSON config: unknown key and wrong type */
    snprintf(p1, sizeof p1, "%s/bad.json", test_tmpdir());
    f = fopen(p1, "w");
    fputs("{\"lr\": 0.001, \"batchsize\": 8}", f);
    fclose(f);
    st_train_config_defaults(&c);
    CHECK(st_train_config_load_json(&c, p1, &err) == ST_ERR_INVALID && strstr(err.msg, "batchsize") && strstr(err.msg, p1),
          "json unknown key: %s", err.msg);
    f = fopen(p1, "w");
    fputs("{\"steps\": \"ten\"}", f);
    fclose(f);
    CHECK(st_train_config_load_json(&c, p1, &err) == ST_ERR_INVALID && strstr(err.msg, "'steps' must be an integer"),
          "json type: %s", err.msg);
    f = fopen(p1, "w");
    fputs("{\"steps\": 10,", f);
    fclose(f);
    CHECK(st_train_config_load_json(&c, p1, &err) == ST_ERR_FORMAT && strstr(err.msg, p1), "json syntax: %s", err.msg);

    /* bad checkpoints: resume must fail clearly and leave the files as they were */
    char ck[700], st_path[800], backup[900];
    snprintf(ck, sizeof ck, "%s/checkpoints/step_00000006", b);
    snprintf(st_path, sizeof st_path, "%s/train_state.bin", ck);
    size_t n;
    unsigned char *orig = test_slurp(st_path, &n);
    struct { const char *what; long off; int truncate; const char *needle; } cases[] = {
        {"wrong magic", 0, 0, "wrong magic"},
        {"wrong version", 8, 0, "version"},
        {"flipped byte", 200, 0, "checksum"},
        {"truncated", -1, 1, "truncated"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *bad = malloc(n);
        memcpy(bad, orig, n);
        size_t len = n;
        if (cases[i].truncate) len = n - 100;
        else bad[cases[i].off] ^= 0x5a;
        f = fopen(st_path, "wb");
        fwrite(bad, 1, len, f);
        fclose(f);
        snprintf(backup, sizeof backup, "%s.copy", st_path);
        f = fopen(backup, "wb");
        fwrite(bad, 1, len, f);
        fclose(f);
        small_config(&c, b);
        c.steps = 8;
        snprintf(c.resume, sizeof c.resume, "%s", ck);
        st_status s = st_train_run(&c, &r, &err);
        CHECK(s != ST_OK && strstr(err.msg, cases[i].needle) && strstr(err.msg, "train_state.bin"), "%s: %s",
              cases[i].what, err.msg);
        CHECK(test_same_file(st_path, backup), "%s: the checkpoint file changed after a failed resume", cases[i].what);
        free(bad);
    }
    f = fopen(st_path, "wb");
    fwrite(orig, 1, n, f);
    fclose(f);
    free(orig);
    /* a checkpoint of another shape */
    small_config(&c, b);
    c.n_embd = 32;
    c.steps = 8;
    snprintf(c.resume, sizeof c.resume, "%s", ck);
    CHECK(st_train_run(&c, &r, &err) == ST_ERR_SHAPE && strstr(err.msg, "model.safetensors") && strstr(err.msg, "shape"),
          "wrong shape: %s", err.msg);
    snprintf(c.resume, sizeof c.resume, "%s/nothing-here", test_tmpdir());
    CHECK(st_train_run(&c, &r, &err) != ST_OK && strstr(err.msg, "nothing-here"), "missing resume dir: %s", err.msg);
    return test_finish("train");
}

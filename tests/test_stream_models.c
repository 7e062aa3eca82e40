/* test_stream_models.c - layer streaming for every architecture, through strata train.
 *
 * For a GPT-2, a Llama (GQA, untied head, llama3 rope, biases) and a Qwen2 (multi-query,
 * q/k/v biases, tied head) of tiny width but 32 blocks, a run streamed under a device
 * budget of one eighth of its training state (16 bytes per parameter) ends with the
 * same weights, bit for bit, as the same run in memory after 20 steps: with the optimizer
 * state in RAM and with the disk state (state_paths), with grad_accum 1 and 3 (the one
 * accumulation rule: each micro-batch's gradient fresh, summed in order), with fp32 and
 * 8-bit optimizer states. The streaming executor sees the
 * models only through the block interface (block.h), so this is what proves that the
 * interface carries each architecture whole. The budgeted device refuses any allocation
 * past the budget, so a run that completes never exceeded it. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "strata/train.h"
#include "testutil.h"

/* 20 steps; 6 in a sanitized build (STRATA_TEST_SANITIZED=1, set by tests/CMakeLists.txt),
 * where each step is several times slower: every configuration still runs. */
static int STEPS = 20;

static void config(st_train_config *c, const char *model, const char *run_dir, int disk, double budget, int accum,
                   int q8) {
    st_train_config_defaults(c);
    st_err err = {0};
    const char *kv[][2] = {{"model", model}, {"n_layer", "32"}, {"vocab_size", "257"}, {"batch", "2"}, {"seq", "16"},
                           {"steps", STEPS == 20 ? "20" : "6"}, {"lr", "0.003"},   {"grad_clip", "1.0"}, {"quiet", "1"},
                           {"warmup_steps", "2"}, {"eval_every", "0"}, {"sample_every", "0"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        CHECK(st_train_config_set(c, kv[i][0], kv[i][1], &err) == ST_OK, "config %s: %s", kv[i][0], err.msg);
    if (!strncmp(model, "gpt2", 4)) {
        CHECK(st_train_config_set(c, "n_embd", "32", &err) == ST_OK, "config: %s", err.msg);
        CHECK(st_train_config_set(c, "n_head", "2", &err) == ST_OK, "config: %s", err.msg);
    }
    c->grad_accum = accum;
    snprintf(c->optim_state, sizeof c->optim_state, "%s", q8 ? "8bit" : "f32");
    snprintf(c->run_dir, sizeof c->run_dir, "%s", run_dir);
    if (disk) {
        snprintf(c->state_paths, sizeof c->state_paths, "%s/state", run_dir);
        mkdir(run_dir, 0755);
        mkdir(c->state_paths, 0755);
    }
    c->device_budget = budget;
}

/* The final weights of a run: the last checkpoint, or with the disk state RUN_DIR's. */
static void weights_path(char *out, size_t cap, const char *run_dir, int disk) {
    if (disk) snprintf(out, cap, "%s/model.safetensors", run_dir);
    else snprintf(out, cap, "%s/checkpoints/step_%08d/model.safetensors", run_dir, STEPS);
}

int main(void) {
    const char *san = getenv("STRATA_TEST_SANITIZED");
    if (san && !strcmp(san, "1")) STEPS = 6;
    const char *models[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    st_err err = {0};
    for (int mi = 0; mi < 3; mi++) {
        for (int v = 0; v < 8; v++) {
            int disk = v & 1, accum = v & 2 ? 3 : 1, q8 = (v & 4) != 0;
            char mem[600], str[600], p1[700], p2[700];
            snprintf(mem, sizeof mem, "%s/%s-%d-mem", test_tmpdir(), models[mi], v);
            snprintf(str, sizeof str, "%s/%s-%d-stream", test_tmpdir(), models[mi], v);
            st_train_config c;
            st_train_result r;
            config(&c, models[mi], mem, disk, 0, accum, q8);
            if (st_train_run(&c, &r, &err) != ST_OK) {
                CHECK(0, "%s in memory%s, grad_accum %d, %s states: %s", models[mi], disk ? " (disk state)" : "", accum, c.optim_state, err.msg);
                continue;
            }
            double state = 16.0 * (double)r.n_params, budget = state / 8;
            config(&c, models[mi], str, disk, budget, accum, q8);
            if (st_train_run(&c, &r, &err) != ST_OK) {
                CHECK(0, "%s streamed at %.0f bytes (1/8 of %.0f)%s, grad_accum %d: %s", models[mi], budget, state,
                      disk ? " (disk state)" : "", accum, err.msg);
                continue;
            }
            weights_path(p1, sizeof p1, mem, disk);
            weights_path(p2, sizeof p2, str, disk);
            CHECK(test_same_file(p1, p2), "%s%s, grad_accum %d, %s states: streamed weights after %d steps differ from the "
                  "in-memory run's", models[mi], disk ? " (disk state)" : "", accum, c.optim_state, STEPS);
            printf("  %-10s %-4s %-5s grad_accum %d: %zu params, budget %.0f bytes (1/8 of the state): %s\n",
                   models[mi], q8 ? "8bit" : "f32", disk ? "disk" : "RAM", accum, (size_t)r.n_params, budget,
                   test_same_file(p1, p2) ? "bit-identical" : "DIFFERENT");
        }
    }
    /* a budget that cannot hold one block: refused before anything is written, naming
     * the key and the bytes missing */
    {
        char d[600];
        snprintf(d, sizeof d, "%s/tiny-budget", test_tmpdir());
        st_train_config c;
        st_train_result r;
        config(&c, "llama-tiny", d, 0, 20000, 1, 0);
        st_status s = st_train_run(&c, &r, &err);
        CHECK(s == ST_ERR_NOMEM && strstr(err.msg, "device_budget") && strstr(err.msg, "missing"),
              "a budget below one block: %d %s", (int)s, err.msg);
    }
    return test_finish("stream_models");
}

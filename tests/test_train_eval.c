/* test_train_eval.c - validation during training (val_data, eval_every, eval_tokens):
 * forward only, so with an evaluation every step the training losses, the final weights
 * and the optimizer state equal a run without validation bit for bit, in memory and
 * under layer streaming (the vocabulary on the device, and in 2048-row chunks with a
 * 16384-token vocabulary); the validation loss and perplexity are logged on every step it
 * ran, the streamed loss equals the in-memory one of the same model, and it falls. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/train.h"
#include "testutil.h"

static void small_config(st_train_config *c, const char *run_dir) {
    st_train_config_defaults(c);
    st_err err;
    const char *kv[][2] = {{"model", "gpt2-mini"}, {"n_layer", "2"}, {"n_embd", "64"}, {"n_head", "2"},
                           {"batch", "4"},         {"seq", "32"},    {"steps", "6"},      {"warmup_steps", "2"},
                           {"lr", "0.003"},        {"grad_clip", "0.5"}, {"quiet", "1"}};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (st_train_config_set(c, kv[i][0], kv[i][1], &err)) fprintf(stderr, "config: %s\n", err.msg);
    snprintf(c->run_dir, sizeof c->run_dir, "%s", run_dir);
}

int main(void) {
    char p1[700], p2[700];
    st_err err = {0};
    st_train_config c;
    st_train_result r;
    {
        struct { const char *budget, *vocab; int ref; } vc[] = {
            {NULL, "0", -1}, {"2400000", "0", 0}, {NULL, "16384", -1}, {"6200000", "16384", 2}};
        double vals[4][6] = {{0}};
        for (int k = 0; k < 4; k++) {
            char on[600], off[600];
            snprintf(on, sizeof on, "%s/val-on%d", test_tmpdir(), k);
            snprintf(off, sizeof off, "%s/val-off%d", test_tmpdir(), k);
            for (int v = 0; v < 2; v++) {
                small_config(&c, v ? on : off);
                if (vc[k].budget) st_train_config_set(&c, "device_budget", vc[k].budget, &err);
                st_train_config_set(&c, "vocab_size", vc[k].vocab, &err);
                st_train_config_set(&c, "eval_every", v ? "1" : "0", &err);
                st_train_config_set(&c, "eval_tokens", "200", &err); /* two batches of 4 x 32 */
                CHECK(st_train_run(&c, &r, &err) == ST_OK, "validation run %d/%d: %s", k, v, err.msg);
            }
            const char *files[] = {"model.safetensors", "train_state.bin"};
            for (int i = 0; i < 2; i++) {
                snprintf(p1, sizeof p1, "%s/checkpoints/step_00000006/%s", on, files[i]);
                snprintf(p2, sizeof p2, "%s/checkpoints/step_00000006/%s", off, files[i]);
                CHECK(test_same_file(p1, p2), "case %d: %s differs with validation every step", k, files[i]);
            }
            char l1[2048], l2[2048];
            snprintf(p1, sizeof p1, "%s/metrics.jsonl", on);
            snprintf(p2, sizeof p2, "%s/metrics.jsonl", off);
            FILE *f1 = fopen(p1, "r"), *f2 = fopen(p2, "r");
            int n = 0;
            while (f1 && f2 && n < 6 && fgets(l1, sizeof l1, f1) && fgets(l2, sizeof l2, f2)) {
                const char *a1 = strstr(l1, "\"loss\":"), *a2 = strstr(l2, "\"loss\":"), *v1 = strstr(l1, "\"val_loss\":");
                CHECK(a1 && a2 && atof(a1 + 7) == atof(a2 + 7), "case %d step %d: training loss differs with validation",
                      k, n + 1);
                CHECK(!strstr(l2, "val_loss"), "case %d: a run without validation logs val_loss", k);
                CHECK(v1 && strstr(l1, "\"val_ppl\":"), "case %d step %d: no val_loss/val_ppl", k, n + 1);
                vals[k][n++] = v1 ? atof(v1 + 11) : 0;
            }
            if (f1) fclose(f1);
            if (f2) fclose(f2);
            CHECK(n == 6, "case %d: %d steps logged", k, n);
            CHECK(vals[k][5] < vals[k][0], "case %d: validation loss did not fall: %.4f -> %.4f", k, vals[k][0], vals[k][5]);
            for (int i = 0; vc[k].ref >= 0 && i < 6; i++)
                CHECK(fabs(vals[k][i] - vals[vc[k].ref][i]) < 1e-5 * fabs(vals[vc[k].ref][i]),
                      "streamed validation loss %.6f differs from the in-memory %.6f (step %d, budget %s)", vals[k][i],
                      vals[vc[k].ref][i], i + 1, vc[k].budget);
        }
    }

    return test_finish("train_eval");
}

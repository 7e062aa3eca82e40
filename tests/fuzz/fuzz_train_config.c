/* fuzz_train_config.c - the run configuration: a JSON file (st_train_config_load_json), or,
 * for an input that starts with "--", one "--KEY VALUE" as the command line gives it
 * (st_train_config_set). What loads must save and load back to the same configuration. */
#include "fuzz_common.h"
#include "strata/store.h"
#include "strata/train.h"

int fuzz_train_config(const uint8_t *d, size_t n) {
    st_train_config c, back;
    st_train_config_defaults(&c);
    st_err err = {0};
    st_status s;
    if (n >= 2 && d[0] == '-' && d[1] == '-') {
        char *t = malloc(n + 1);
        if (!t) return 0;
        memcpy(t, d, n);
        t[n] = 0;
        char *sp = strchr(t, ' ');
        if (sp) *sp = 0;
        s = st_train_config_set(&c, t + 2, sp ? sp + 1 : "", &err);
        free(t);
    } else {
        s = st_train_config_load_json(&c, fuzz_file("config.json", d, n), &err);
    }
    if (s) return fuzz_check_refusal(s, &err, "train_config");
    /* what train and plan do next with it: the model's shape, the schedule, the paths
     * (init_from names a directory: not read here) */
    if (!c.init_from[0]) {
        st_model_shape shape;
        st_err e2 = {0};
        if ((s = st_train_config_resolve(&c, &shape, &e2)) && fuzz_check_refusal(s, &e2, "resolve")) return 1;
        long steps[4] = {0, 1, c.warmup_steps, c.steps};
        for (int i = 0; i < 4; i++)
            if (!(st_train_lr_at(&c, steps[i]) >= 0)) {
                fprintf(stderr, "fuzz: learning rate at step %ld is %g\n", steps[i], st_train_lr_at(&c, steps[i]));
                return 1;
            }
        if (c.state_paths[0]) {
            char buf[sizeof c.state_paths];
            const char *paths[ST_STORE_MAX_PATHS];
            double weights[ST_STORE_MAX_PATHS];
            int np = 0, weighted = 0;
            c.state_profile[0] = 0; /* a file: fuzz_hw_profile's */
            s = st_train_state_paths(&c, buf, sizeof buf, paths, &np, weights, &weighted, &e2);
            if (fuzz_check_refusal(s, &e2, "train_state_paths")) return 1;
        }
    }
    char saved[600];
    snprintf(saved, sizeof saved, "%s", fuzz_file("saved.json", "", 0));
    if ((s = st_train_config_save_json(&c, saved, &err))) return fuzz_check_refusal(s, &err, "train_config_save_json");
    st_train_config_defaults(&back);
    s = st_train_config_load_json(&back, saved, &err);
    if (s) {
        fprintf(stderr, "fuzz: a saved configuration does not load back: %s\n", err.msg);
        return 1;
    }
    /* the same keys and values: saving both gives the same text */
    char again[600];
    snprintf(again, sizeof again, "%s", fuzz_file("again.json", "", 0));
    if (st_train_config_save_json(&back, again, &err)) return 0;
    FILE *f1 = fopen(saved, "rb"), *f2 = fopen(again, "rb");
    int differ = 0;
    if (f1 && f2) {
        int a, b;
        do {
            a = fgetc(f1), b = fgetc(f2);
            differ = a != b;
        } while (!differ && a != EOF);
    }
    if (f1) fclose(f1);
    if (f2) fclose(f2);
    if (differ) fprintf(stderr, "fuzz: a configuration changed on save and load (%s vs %s)\n", saved, again);
    return differ;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_train_config(d, n)) abort();
    return 0;
}
#endif

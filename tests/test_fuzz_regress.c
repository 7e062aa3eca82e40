/* test_fuzz_regress.c - replays every regression input (tests/fuzz/regress/<parser>/)
 * and every seed (tests/fuzz/corpus/<parser>/) through the fuzz harnesses' own entry
 * functions, in the ordinary build: each must be parsed or refused with a message, and
 * the harness's checks (an accepted config writes back and reads back the same, a read
 * past the end is refused, ...) must hold. Under -DSTRATA_SANITIZE=ON the same replay
 * also catches the memory errors and undefined behaviour the fuzzer found. */
#define FUZZ_NO_MAIN
#include <dirent.h>

#include "fuzz/fuzz_hf_config.c"
#include "fuzz/fuzz_hw_profile.c"
#include "fuzz/fuzz_llmc.c"
#include "fuzz/fuzz_megatron.c"
#include "fuzz/fuzz_safetensors.c"
#include "fuzz/fuzz_store_manifest.c"
#include "fuzz/fuzz_tokenizer.c"
#include "fuzz/fuzz_train_config.c"
#include "fuzz/fuzz_train_state.c"
#include "testutil.h"

static const struct {
    const char *name;
    int (*fn)(const uint8_t *, size_t);
} harnesses[] = {
    {"hf_config", fuzz_hf_config},     {"hw_profile", fuzz_hw_profile},
    {"llmc", fuzz_llmc},               {"megatron", fuzz_megatron},
    {"safetensors", fuzz_safetensors}, {"store_manifest", fuzz_store_manifest},
    {"train_config", fuzz_train_config}, {"train_state", fuzz_train_state},
    {"tokenizer", fuzz_tokenizer},
};

static int replay_dir(const char *rel, int (*fn)(const uint8_t *, size_t)) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_source_path(rel));
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort), files = 0;
    for (int i = 0; i < n; i++) {
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, ents[i]->d_name);
        struct stat sb;
        if (ents[i]->d_name[0] != '.' && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
            FILE *f = fopen(p, "rb");
            uint8_t *b = malloc(sb.st_size ? (size_t)sb.st_size : 1);
            size_t got = f && b ? fread(b, 1, (size_t)sb.st_size, f) : 0;
            if (f) fclose(f);
            CHECK(got == (size_t)sb.st_size, "cannot read %s", p);
            int r = fn(b, got);
            CHECK(r == 0, "%s: the harness reports a finding (see above)", p);
            free(b);
            files++;
        }
        free(ents[i]);
    }
    if (n > 0) free(ents);
    return files;
}

int main(void) {
    int total = 0;
    for (size_t h = 0; h < sizeof harnesses / sizeof harnesses[0]; h++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fuzz/corpus/%s", harnesses[h].name);
        int seeds = replay_dir(rel, harnesses[h].fn);
        CHECK(seeds > 0, "no seeds in %s", rel);
        snprintf(rel, sizeof rel, "tests/fuzz/regress/%s", harnesses[h].name);
        int reg = replay_dir(rel, harnesses[h].fn);
        printf("%-16s %3d seeds, %3d regression inputs\n", harnesses[h].name, seeds, reg);
        total += seeds + reg;
    }
    CHECK(total > 20, "only %d inputs replayed", total);
    return test_finish("fuzz_regress");
}

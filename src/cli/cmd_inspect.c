/* cmd_inspect.c - strata inspect PATH: describe a safetensors file, a checkpoint
 * directory (weights + training state) or a run directory (its latest checkpoint). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "cli/cli.h"
#include "strata/ckpt.h"
#include "strata/llama.h"
#include "strata/safetensors.h"
#include "strata/store.h"
#include "strata/train.h"

static int inspect_safetensors(const char *path) {
    st_err err = {0};
    st_safetensors *st;
    if (st_safetensors_open(&st, path, &err)) {
        fprintf(stderr, "strata inspect: %s\n", err.msg);
        return 1;
    }
    size_t total = 0, bytes = 0;
    int n = st_safetensors_count(st);
    printf("%s: %d tensors\n", path, n);
    for (int i = 0; i < n; i++) {
        const st_tensor_entry *e = st_safetensors_entry(st, i);
        char shape[128] = "";
        for (int d = 0; d < e->ndim; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "", (long long)e->shape[d]);
        printf("  %-48s %-5s [%s]\n", e->name, st_dtype_name(e->dtype), shape);
        total += e->numel;
        bytes += e->end - e->begin;
    }
    const char *keys[] = {"model", "vocab_size", "n_positions", "n_layer", "n_head", "n_embd"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *v = st_safetensors_meta(st, keys[i]);
        if (v) printf("  metadata %s = %s\n", keys[i], v);
    }
    printf("  %zu elements, %.2f MiB of data\n", total, bytes / 1048576.0);
    st_safetensors_close(st);
    return 0;
}

static int inspect_state(const char *path) {
    FILE *f = fopen(path, "rb");
    unsigned char h[64];
    if (!f || fread(h, 1, 64, f) != 64) {
        if (f) fclose(f);
        fprintf(stderr, "strata inspect: %s: cannot read the 64-byte header\n", path);
        return 1;
    }
    fclose(f);
    uint64_t v[5];
    uint32_t version, fmt;
    memcpy(&version, h + 8, 4);
    memcpy(&fmt, h + 12, 4);
    memcpy(v, h + 16, sizeof v);
    if (memcmp(h, "STRATAts", 8)) {
        fprintf(stderr, "strata inspect: %s: not a strata training state (wrong magic at offset 0)\n", path);
        return 1;
    }
    printf("%s: version %u, step %llu, adam step %llu, data state %llu bytes, %llu parameters, optimizer state %s\n", path,
           version, (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[3],
           (unsigned long long)v[4], fmt == 0 ? "f32" : "8bit");
    return 0;
}

/* A data-parallel checkpoint: its description (shards.json) and each rank's state file. */
static int inspect_shards(const char *dir) {
    char path[4400];
    snprintf(path, sizeof path, "%s/" ST_SHARDS_JSON, dir);
    json_object *root = json_object_from_file(path), *w, *b, *z;
    if (!root || !json_object_object_get_ex(root, "world", &w) || !json_object_object_get_ex(root, "bounds", &b) ||
        !json_object_is_type(b, json_type_array) || (int)json_object_array_length(b) != json_object_get_int(w) + 1) {
        fprintf(stderr, "strata inspect: %s: not a strata shard description (keys world and bounds)\n", path);
        json_object_put(root);
        return 1;
    }
    int world = json_object_get_int(w), rc = 0;
    printf("%s: %d ranks, ZeRO %d, each rank's shard of the optimizer state:\n", path, world,
           json_object_object_get_ex(root, "zero", &z) ? json_object_get_int(z) : -1);
    for (int r = 0; r < world; r++) {
        printf("  rank %d: elements [%llu, %llu)\n", r,
               (unsigned long long)json_object_get_uint64(json_object_array_get_idx(b, (size_t)r)),
               (unsigned long long)json_object_get_uint64(json_object_array_get_idx(b, (size_t)r + 1)));
        snprintf(path, sizeof path, "%s/train_state.rank%05d.bin", dir, r);
        rc |= inspect_state(path);
    }
    json_object_put(root);
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs("usage: strata inspect PATH [--batch B] [--seq T] [--optim-state f32|8bit]\n"
              "  PATH: a .safetensors file, a checkpoint directory, a run directory, a Hugging Face\n"
              "  model directory (config.json + safetensors: architecture, parameters, and the memory a\n"
              "  training run at batch B x seq T would need per class of state), or a disk state store\n"
              "  (its .manifest, or the first of its state_paths)\n",
              argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *p = argv[1];
    struct stat sb;
    if (stat(p, &sb) != 0) {
        fprintf(stderr, "strata inspect: %s: no such file or directory\n", p);
        return 1;
    }
    {   /* a disk state store: its manifest, or the directory that holds it */
        char man[4200];
        size_t pl = strlen(p);
        if (pl > 9 && !strcmp(p + pl - 9, ".manifest")) snprintf(man, sizeof man, "%s", p);
        else snprintf(man, sizeof man, "%s/strata-state.manifest", p);
        if (access(man, R_OK) == 0) {
            st_err err = {0};
            if (st_store_inspect(man, stdout, &err)) {
                fprintf(stderr, "strata inspect: %s\n", err.msg);
                return 1;
            }
            return 0;
        }
    }
    if (!S_ISDIR(sb.st_mode)) return inspect_safetensors(p);
    char path[8300], dir[4200];
    char probe1[4300], probe2[4300];
    st_run_path(probe1, sizeof probe1, p, ST_RUN_LATEST);
    snprintf(probe2, sizeof probe2, "%s/train_state.bin", p);
    snprintf(path, sizeof path, "%s/" ST_SHARDS_JSON, p);
    int sharded_ckpt = access(path, R_OK) == 0;
    st_run_path(path, sizeof path, p, ST_RUN_CONFIG);
    /* a run or checkpoint directory has a config.json too (strata's own), so those first */
    if (access(probe1, R_OK) != 0 && access(probe2, R_OK) != 0 && !sharded_ckpt && access(path, R_OK) == 0) {
        int B = 1, T = 2048;
        double state = 8.0; /* AdamW fp32 moments per parameter; --optim-state 8bit: ~2.03 */
        for (int i = 2; i + 1 < argc; i++) {
            if (!strcmp(argv[i], "--batch")) B = atoi(argv[++i]);
            else if (!strcmp(argv[i], "--seq")) T = atoi(argv[++i]);
            else if (!strcmp(argv[i], "--optim-state") && !strcmp(argv[++i], "8bit")) state = 2.03;
        }
        st_err err = {0};
        if (st_hf_inspect(p, B, T, state, stdout, &err)) {
            fprintf(stderr, "strata inspect: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    snprintf(dir, sizeof dir, "%s", p);
    st_run_path(path, sizeof path, p, ST_RUN_LATEST);
    FILE *f = fopen(path, "r");
    if (f) {
        char name[256] = "";
        if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = 0;
        fclose(f);
        snprintf(dir, sizeof dir, "%s/checkpoints/%s", p, name);
        printf("run %s: latest checkpoint %s\n", p, name);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int rc = inspect_safetensors(path);
    snprintf(path, sizeof path, "%s/" ST_SHARDS_JSON, dir);
    if (access(path, R_OK) == 0) return rc | inspect_shards(dir);
    snprintf(path, sizeof path, "%s/train_state.bin", dir);
    return rc | inspect_state(path);
}

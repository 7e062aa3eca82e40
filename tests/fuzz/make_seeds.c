/* make_seeds.c - writes the binary seed corpora of tests/fuzz/corpus/ with strata's own
 * writers (st_safetensors_write, data_pack, st_train_state_save, st_store_create), so that the
 * seeds are files strata itself produces; the JSON seeds are hand-written files beside
 * them. Run from the repository root after a build with -DSTRATA_FUZZ=ON:
 *     build-fuzz/fuzz/make_seeds tests/fuzz/corpus */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileutil.h"
#include "strata/ckpt.h"
#include "strata/data.h"
#include "strata/safetensors.h"
#include "strata/store.h"

static const char *out_dir;
static char tmp[256];

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n ? *n : 1);
    if (b && fread(b, 1, *n, f) != *n) { free(b); b = NULL; }
    fclose(f);
    return b;
}

static void put(const char *parser, const char *name, const void *a, size_t na, const void *b, size_t nb) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", out_dir, parser);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/%s", out_dir, parser, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb)) {
        fprintf(stderr, "make_seeds: cannot write %s\n", p);
        exit(1);
    }
    fclose(f);
    printf("%s (%zu bytes)\n", p, na + nb);
}

static void check(st_status s, const st_err *err) {
    if (s) {
        fprintf(stderr, "make_seeds: %s\n", err->msg);
        exit(1);
    }
}

static void safetensors_seeds(void) {
    float f32[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    uint16_t bf16[4] = {0x3f80, 0xbf80, 0x0000, 0x7f80}, f16[4] = {0x3c00, 0xbc00, 0x0001, 0x7bff};
    int32_t i32[3] = {1, -1, 65536};
    double f64[1] = {0.25};
    uint8_t u8[5] = {1, 2, 3, 4, 5};
    st_tensor_out t[] = {
        {.name = "a.weight", .dtype = ST_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "b.bf16", .dtype = ST_BF16, .ndim = 1, .shape = {4}, .data = bf16},
        {.name = "c.f16", .dtype = ST_F16, .ndim = 2, .shape = {2, 2}, .data = f16},
        {.name = "d.ids", .dtype = ST_I32, .ndim = 1, .shape = {3}, .data = i32},
        {.name = "e.scalar", .dtype = ST_F64, .ndim = 0, .data = f64},
        {.name = "f.bytes", .dtype = ST_U8, .ndim = 1, .shape = {5}, .data = u8},
    };
    const char *meta[] = {"format", "pt", "step", "3"};
    char p[512];
    snprintf(p, sizeof p, "%s/s.safetensors", tmp);
    st_err err = {0};
    check(st_safetensors_write(p, t, 6, meta, 2, &err), &err);
    size_t n;
    unsigned char *b = slurp(p, &n);
    put("safetensors", "six_dtypes.safetensors", b, n, NULL, 0);
    free(b);
    check(st_safetensors_write(p, t, 1, NULL, 0, &err), &err);
    b = slurp(p, &n);
    put("safetensors", "one_tensor.safetensors", b, n, NULL, 0);
    free(b);
    /* the fixture's real header (a tiny Llama), its data cut off: offsets point past the end */
    b = slurp("tests/fixtures/llama_tiny.safetensors", &n);
    if (b && n > 8) {
        uint64_t h;
        memcpy(&h, b, 8);
        if (h < n - 8) put("safetensors", "llama_tiny_header.safetensors", b, 8 + h, NULL, 0);
    }
    free(b);
}

static void megatron_seeds(void) {
    int dtypes[2] = {ST_DATA_DTYPE_U16, ST_DATA_DTYPE_I32};
    const char *names[2] = {"u16_3docs", "i32_2docs"};
    for (int k = 0; k < 2; k++) {
        char prefix[512], p[600];
        snprintf(prefix, sizeof prefix, "%s/m%d", tmp, k);
        st_data_pack_writer *w;
        st_err err = {0};
        check(st_data_pack_open(&w, prefix, dtypes[k], &err), &err);
        int32_t docs[3][5] = {{1, 2, 3, 4, 5}, {9, 8, 7, 0, 0}, {42, 0, 0, 0, 0}};
        int lens[3] = {5, 3, 1};
        for (int d = 0; d < 3 - k; d++) check(st_data_pack_add(w, docs[d], (size_t)lens[d], &err), &err);
        check(st_data_pack_close(w, &err), &err);
        size_t ni, nb;
        snprintf(p, sizeof p, "%s.idx", prefix);
        unsigned char *idx = slurp(p, &ni);
        snprintf(p, sizeof p, "%s.bin", prefix);
        unsigned char *bin = slurp(p, &nb);
        /* the harness's layout: flags, u16 .idx length, .idx, .bin */
        unsigned char *all = malloc(3 + ni + nb);
        all[0] = (unsigned char)(k ? 2 : 0);
        all[1] = (unsigned char)(ni & 0xff), all[2] = (unsigned char)(ni >> 8);
        memcpy(all + 3, idx, ni);
        memcpy(all + 3 + ni, bin, nb);
        put("megatron", names[k], all, 3 + ni + nb, NULL, 0);
        free(all);
        free(idx);
        free(bin);
    }
}

static void llmc_seeds(void) {
    int32_t hdr[256] = {0};
    hdr[0] = 20240520, hdr[1] = 1, hdr[2] = 16;
    uint16_t t16[16];
    for (int i = 0; i < 16; i++) t16[i] = (uint16_t)(i * 977);
    put("llmc", "v1_uint16_16tokens.bin", hdr, sizeof hdr, t16, sizeof t16);
    hdr[0] = 20240801, hdr[1] = 7, hdr[2] = 8;
    uint32_t t32[8];
    for (int i = 0; i < 8; i++) t32[i] = (uint32_t)i * 20000u;
    put("llmc", "v7_uint32_8tokens.bin", hdr, sizeof hdr, t32, sizeof t32);
}

/* The same optimizer as fuzz_train_state.c and fuzz_store_manifest's store. */
static const st_optim_segment segs[2] = {{0, 48, 0.1f}, {48, 16, 0.0f}};

static void train_state_seeds(void) {
    for (int fmt = 0; fmt < 2; fmt++) {
        st_optim *o;
        st_err err = {0};
        check(st_optim_create(&o, segs, 2, (st_optim_state_format)fmt, &err), &err);
        static st_train_state_header h;
        memset(&h, 0, sizeof h);
        h.step = 12, h.adam_step = 11, h.rng = 0x1234, h.n_params = 64;
        h.data_state_bytes = 24;
        for (int i = 0; i < 24; i++) h.data_state[i] = (unsigned char)i;
        char p[512];
        snprintf(p, sizeof p, "%s/train_state.bin", tmp);
        check(st_train_state_save(p, &h, o, &err), &err);
        size_t n;
        unsigned char *b = slurp(p, &n);
        put("train_state", fmt ? "8bit.bin" : "f32.bin", b, n, NULL, 0);
        free(b);
        st_optim_free(o);
    }
}

static void store_seeds(void) {
    for (int k = 0; k < 2; k++) {
        char d0[300], d1[300];
        snprintf(d0, sizeof d0, "%s/s%d_0", tmp, k);
        snprintf(d1, sizeof d1, "%s/s%d_1", tmp, k);
        mkdir(d0, 0700);
        mkdir(d1, 0700);
        const char *paths[2] = {d0, d1};
        st_store_config cfg = {.paths = paths, .n_paths = k + 1, .segs = segs, .n_segs = 2,
                               .fmt = (st_optim_state_format)k, .host_budget = 8u << 20, .name = "seed"};
        st_store *s;
        st_err err = {0};
        check(st_store_create(&s, &cfg, NULL, NULL, &err), &err);
        st_store_close(s);
        char p[700];
        snprintf(p, sizeof p, "%s/seed.manifest", d0);
        size_t n;
        unsigned char *b = slurp(p, &n);
        put("store_manifest", k ? "8bit_2paths.manifest" : "f32_1path.manifest", b, n, NULL, 0);
        free(b);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds OUT_DIR (from the repository root)\n");
        return 2;
    }
    out_dir = argv[1];
    snprintf(tmp, sizeof tmp, "/tmp/strata-seeds-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    safetensors_seeds();
    megatron_seeds();
    llmc_seeds();
    train_state_seeds();
    store_seeds();
    st_err err = {0};
    check(st_rmtree(tmp, &err), &err);
    return 0;
}

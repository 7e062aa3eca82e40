/* test_safetensors.c - round trip, and headers that lie: each must be a clear error
 * naming the file and the problem, never a crash. */
#include <stdlib.h>
#include <string.h>

#include "strata/safetensors.h"
#include "testutil.h"

static void write_raw(const char *path, const char *header, size_t data_bytes) {
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void expect_error(const char *what, const char *header, size_t data_bytes, st_status code, const char *needle) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", test_tmpdir());
    write_raw(path, header, data_bytes);
    st_err err = {0};
    st_safetensors *st = NULL;
    st_status s = st_safetensors_open(&st, path, &err);
    CHECK(s == code, "%s: status %s, want %s (%s)", what, st_status_name(s), st_status_name(code), err.msg);
    CHECK(strstr(err.msg, path) != NULL, "%s: message names the file: %s", what, err.msg);
    CHECK(strstr(err.msg, needle) != NULL, "%s: message mentions '%s': %s", what, needle, err.msg);
    if (s == ST_OK) st_safetensors_close(st);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", test_tmpdir());
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3f80, 0x4000, 0xc040}; /* bf16 1, 2, -3 */
    st_tensor_out outs[2] = {{"zeta.weight", ST_F32, 2, {2, 3}, a}, {"alpha.bias", ST_BF16, 1, {3}, b}};
    const char *meta[] = {"format", "pt"};
    st_err err = {0};
    CHECK(st_safetensors_write(path, outs, 2, meta, 1, &err) == ST_OK, "write: %s", err.msg);
    st_safetensors *st;
    CHECK(st_safetensors_open(&st, path, &err) == ST_OK, "open: %s", err.msg);
    if (st) {
        CHECK(st_safetensors_count(st) == 2, "count");
        float got[6], gb[3];
        int64_t shape[2] = {2, 3};
        CHECK(st_safetensors_read_f32(st, "zeta.weight", got, 6, shape, 2, &err) == ST_OK, "read f32: %s", err.msg);
        CHECK(memcmp(got, a, sizeof a) == 0, "f32 round trip bit-exact");
        CHECK(st_safetensors_read_f32(st, "alpha.bias", gb, 3, NULL, 0, &err) == ST_OK, "read bf16: %s", err.msg);
        CHECK(gb[0] == 1 && gb[1] == 2 && gb[2] == -3, "bf16 converted");
        CHECK(st_safetensors_meta(st, "format") && !strcmp(st_safetensors_meta(st, "format"), "pt"), "metadata");
        /* header sorted by name: alpha first, 8-byte aligned data start */
        CHECK(st_safetensors_find(st, "alpha.bias")->begin == 0, "sorted layout");
        int64_t wrong[2] = {3, 2};
        CHECK(st_safetensors_read_f32(st, "zeta.weight", got, 6, wrong, 2, &err) == ST_ERR_SHAPE &&
                  strstr(err.msg, "[2, 3]") && strstr(err.msg, "[3, 2]"),
              "shape mismatch names both shapes: %s", err.msg);
        CHECK(st_safetensors_read_f32(st, "missing", got, 6, NULL, 0, &err) == ST_ERR_SHAPE && strstr(err.msg, "missing"),
              "missing tensor: %s", err.msg);
        st_safetensors_close(st);
    }
    expect_error("offsets out of range", "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                 ST_ERR_FORMAT, "outside");
    expect_error("overlap",
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 16, ST_ERR_FORMAT, "overlap");
    expect_error("shape vs bytes", "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, ST_ERR_FORMAT,
                 "span 8 bytes");
    expect_error("unknown dtype", "{\"t\":{\"dtype\":\"F8_E4M3\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8,
                 ST_ERR_FORMAT, "F8_E4M3");
    expect_error("not json", "{\"t\": [1, 2", 0, ST_ERR_FORMAT, "JSON");
    expect_error("negative dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, ST_ERR_FORMAT,
                 "dimension 0");
    /* header length larger than the file */
    snprintf(path, sizeof path, "%s/short.safetensors", test_tmpdir());
    FILE *f = fopen(path, "wb");
    uint64_t huge = 1000;
    fwrite(&huge, 8, 1, f);
    fputs("{}", f);
    fclose(f);
    CHECK(st_safetensors_open(&st, path, &err) == ST_ERR_TRUNCATED && strstr(err.msg, "offset 0"), "truncated: %s",
          err.msg);
    CHECK(st_safetensors_open(&st, "/nonexistent/x.safetensors", &err) == ST_ERR_IO && strstr(err.msg, "/nonexistent"),
          "missing file: %s", err.msg);
    return test_finish("safetensors");
}

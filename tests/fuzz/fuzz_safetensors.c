/* fuzz_safetensors.c - the safetensors reader (header length, JSON header, entries,
 * offsets, overlaps) and reading every tensor it accepts as f32. */
#include "fuzz_common.h"
#include "strata/safetensors.h"

int fuzz_safetensors(const uint8_t *d, size_t n) {
    st_err err = {0};
    st_safetensors *st = NULL;
    st_status s = st_safetensors_open(&st, fuzz_file("in.safetensors", d, n), &err);
    if (s) return fuzz_check_refusal(s, &err, "safetensors_open");
    (void)st_safetensors_meta(st, "format");
    for (int i = 0; i < st_safetensors_count(st); i++) {
        const st_tensor_entry *e = st_safetensors_entry(st, i);
        float *buf = malloc(e->numel ? e->numel * sizeof(float) : 1);
        if (!buf) break;
        st_err e2 = {0};
        s = st_safetensors_read_f32(st, e->name, buf, e->numel, e->shape, e->ndim, &e2);
        free(buf);
        if (fuzz_check_refusal(s, &e2, "safetensors_read_f32")) {
            st_safetensors_close(st);
            return 1;
        }
    }
    st_safetensors_close(st);
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_safetensors(d, n)) abort();
    return 0;
}
#endif

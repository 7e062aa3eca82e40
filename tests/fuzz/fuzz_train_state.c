/* fuzz_train_state.c - train_state.bin (st_train_state_load) against an optimizer of 64
 * parameters in two tensors, f32 or 8-bit (by the file's format field). Each input is
 * loaded as it is and again with its CRC-32C made right, so that the fuzzer gets past
 * the checksum to the fields behind it. */
#include "fuzz_common.h"
#include "strata/ckpt.h"

int fuzz_train_state(const uint8_t *d, size_t n) {
    static st_optim *opt[2];
    if (!opt[0]) {
        st_optim_segment segs[2] = {{.offset = 0, .n = 48, .weight_decay = 0.1f}, {.offset = 48, .n = 16, .weight_decay = 0.0f}};
        st_err err = {0};
        if (st_optim_create(&opt[0], segs, 2, ST_OPTIM_STATE_F32, &err) ||
            st_optim_create(&opt[1], segs, 2, ST_OPTIM_STATE_8BIT, &err)) {
            fprintf(stderr, "fuzz: optim_create: %s\n", err.msg);
            abort();
        }
    }
    uint32_t fmt = 0;
    if (n >= 16) memcpy(&fmt, d + 12, 4);
    st_optim *o = opt[fmt == (uint32_t)ST_OPTIM_STATE_8BIT];
    static st_train_state_header h;
    for (int pass = 0; pass < 2; pass++) {
        const char *path = fuzz_file("train_state.bin", d, n);
        if (pass == 1) {
            if (n < 68) break;
            uint8_t *c = malloc(n);
            if (!c) break;
            memcpy(c, d, n);
            uint32_t crc = st_crc32c(0, c, n - 4);
            memcpy(c + n - 4, &crc, 4);
            path = fuzz_file("train_state.bin", c, n);
            free(c);
        }
        st_err err = {0};
        st_status s = st_train_state_load(path, &h, o, &err);
        if (fuzz_check_refusal(s, &err, "train_state_load")) return 1;
        if (!s && h.data_state_bytes > ST_DATA_STATE_MAX) {
            fprintf(stderr, "fuzz: train_state_load accepted %llu bytes of data state\n",
                    (unsigned long long)h.data_state_bytes);
            return 1;
        }
    }
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_train_state(d, n)) abort();
    return 0;
}
#endif

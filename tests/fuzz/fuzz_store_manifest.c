/* fuzz_store_manifest.c - the state store's manifest (NAME.manifest), read by the same
 * loader as st_store_open and described by st_store_inspect (strata inspect). Each input
 * is read as it is and again with its CRC-32C made right, so that the fuzzer gets past
 * the checksum to the tables behind it. */
#include "fuzz_common.h"
#include "strata/store.h"

int fuzz_store_manifest(const uint8_t *d, size_t n) {
    static FILE *devnull;
    if (!devnull && !(devnull = fopen("/dev/null", "w"))) abort();
    for (int pass = 0; pass < 2; pass++) {
        const char *path = fuzz_file("strata-state.manifest", d, n);
        if (pass == 1) {
            if (n < 8) break;
            uint8_t *c = malloc(n);
            if (!c) break;
            memcpy(c, d, n);
            uint32_t crc = st_crc32c(0, c, n - 4);
            memcpy(c + n - 4, &crc, 4);
            path = fuzz_file("strata-state.manifest", c, n);
            free(c);
        }
        st_err err = {0};
        st_status s = st_store_inspect(path, devnull, &err);
        if (fuzz_check_refusal(s, &err, "st_store_inspect")) return 1;
    }
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_store_manifest(d, n)) abort();
    return 0;
}
#endif

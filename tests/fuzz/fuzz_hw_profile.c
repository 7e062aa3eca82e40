/* fuzz_hw_profile.c - a `strata probe -o` profile read as the state store's per-path
 * weights (st_store_weights_from_profile): accepted weights are finite and positive. */
#include <math.h>

#include "fuzz_common.h"
#include "strata/store.h"

int fuzz_hw_profile(const uint8_t *d, size_t n) {
    const char *paths[3] = {"/a", "/b", "/mnt/nvme0"};
    double w[3];
    st_err err = {0};
    st_status s = st_store_weights_from_profile(fuzz_file("profile.json", d, n), paths, 3, w, &err);
    if (s) return fuzz_check_refusal(s, &err, "st_store_weights_from_profile");
    for (int i = 0; i < 3; i++)
        if (!(w[i] > 0) || !isfinite(w[i])) {
            fprintf(stderr, "fuzz: path %d accepted with weight %g\n", i, w[i]);
            return 1;
        }
    return 0;
}

#ifndef FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (fuzz_hw_profile(d, n)) abort();
    return 0;
}
#endif

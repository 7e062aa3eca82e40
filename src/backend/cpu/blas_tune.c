/* blas_tune.c - pick OpenBLAS kernels that match the CPU when OpenBLAS cannot. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/backend.h"

static int name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (!strcasecmp(name, *list)) return 1;
    return 0;
}

const char *st_blas_fix_coretype(char **argv) {
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || getenv("STRATA_BLAS_REEXEC")) return core;
#if defined(__x86_64__) && defined(__GNUC__)
    static const char *const avx512_cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "Zen4", NULL};
    static const char *const weak_cores[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                             "Barcelona", "Sandybridge", "Unknown", NULL};
    const char *want = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && !name_in(core, avx512_cores))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && name_in(core, weak_cores))
        want = "Haswell";
    if (!want || !argv) return core;
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("STRATA_BLAS_REEXEC", "1", 1); /* never loop */
    st_log(2, "OpenBLAS chose %s kernels for this CPU; re-running with OPENBLAS_CORETYPE=%s\n", core, want);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the slow kernels, correctly */
    st_log(1, "warning: OpenBLAS uses %s kernels on this CPU (set OPENBLAS_CORETYPE=%s for ~4x faster matmuls)\n",
           core, want);
#else
    (void)argv;
    (void)name_in;
#endif
    return core;
}

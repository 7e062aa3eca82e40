/* backend.c - what every backend shares: lifetime, and a device's memory figures (through
 * the vtable and the budgeted arena, never a backend by name: test_cuda_backend_emu links
 * this beside its own build of the CUDA backend). */
#include "strata/backend.h"
#include "strata/tier.h"

void st_backend_free(st_backend *be) {
    if (be && be->ops && be->ops->free) be->ops->free(be);
}

st_status st_backend_memory(st_backend *be, size_t *used, size_t *peak, size_t *capacity, st_err *err) {
    size_t u = 0, p = 0, c = 0;
    st_arena *a = st_backend_arena(be); /* the budgeted arena copies its inner backend's ops: asked first */
    int known = a || (be && be->ops && be->ops->memory);
    if (a)
        u = st_arena_used(a), p = st_arena_peak(a), c = st_arena_budget(a);
    else if (known)
        be->ops->memory(be, &u, &p, &c);
    if (used) *used = u;
    if (peak) *peak = p;
    if (capacity) *capacity = c;
    if (!known)
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend %s: its allocations are host memory without a bound, "
                       "nothing to measure; give it a device budget (st_backend_device_create)",
                       be && be->ops && be->ops->name ? be->ops->name : "(none)");
    return ST_OK;
}

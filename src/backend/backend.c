/* backend.c - what every backend shares: lifetime, whether its memory is the host's, and a
 * device's memory figures (through the vtable, whose `memory` entry the budgeted arena
 * answers too: test_cuda_backend_emu links this beside its own build of the CUDA backend). */
#include <string.h>

#include "strata/backend.h"

void st_backend_free(st_backend *be) {
    if (be && be->ops && be->ops->free) be->ops->free(be);
}

int st_backend_host_memory(const st_backend *be) {
    const char *n = be && be->ops ? be->ops->name : NULL;
    return n && (!strcmp(n, "cpu") || !strcmp(n, "ref"));
}

st_status st_backend_memory(st_backend *be, size_t *used, size_t *peak, size_t *capacity, st_err *err) {
    size_t u = 0, p = 0, c = 0;
    int known = be && be->ops && be->ops->memory;
    if (known) be->ops->memory(be, &u, &p, &c);
    if (used) *used = u;
    if (peak) *peak = p;
    if (capacity) *capacity = c;
    if (!known)
        return st_errf(err, ST_ERR_UNSUPPORTED, "backend %s: its allocations are host memory without a bound, "
                       "nothing to measure; give it a device budget (st_backend_device_create)",
                       be && be->ops && be->ops->name ? be->ops->name : "(none)");
    return ST_OK;
}

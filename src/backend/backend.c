/* backend.c - what every backend shares: lifetime. */
#include "strata/backend.h"

void st_backend_free(st_backend *be) {
    if (be && be->ops && be->ops->free) be->ops->free(be);
}

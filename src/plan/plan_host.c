/* plan_host.c - the host tier's bytes under a stream plan: the executor's own count of what
 * st_stream_exec_create allocates in host memory (st_stream_host_bytes, from the table it
 * allocates from), so that a plan's host peak can be predicted and checked against the
 * measured one (strata bench plan). */
#include "strata/plan.h"

size_t st_plan_host_bytes(const st_arch *a, int B, int T, const st_stream_plan *p) {
    st_stream_config sc = {.arch = a, .B = B, .T = T, .state_format = ST_OPTIM_STATE_F32};
    return st_stream_host_bytes(&sc, p);
}

size_t st_plan_host_bytes_disk(const st_arch *a, int B, int T, const st_stream_plan *p) {
    st_stream_config sc = {.arch = a, .B = B, .T = T, .state_format = ST_OPTIM_STATE_F32, .external_optimizer = 1};
    return st_stream_host_bytes(&sc, p);
}

/* test_cuda_cudnn.cpp - cuDNN's fused attention as far as a machine without a GPU can
 * check it (issue 30): the build says which attention it uses, and the graphs of
 * src/backend/cuda/cudnn_attn.cu (forward and backward, causal, grouped KV heads) are
 * well formed for the libcudnn found here: every tensor and operation descriptor
 * finalizes. Whether cuDNN fuses and runs them, and agrees with the own kernels, is
 * tests/gpu/run.sh's (test_cuda_backend and the probe on a device). Skips (77) where the
 * build has no cuDNN or libcudnn.so.9 cannot be loaded. */
#include <stdio.h>

extern "C" {
#include "backend/cuda/backend_cuda.h"
#include "testutil.h"
}
#include "backend/cuda/cudnn_attn.h"

int main(void) {
    const char *built = st_backend_cuda_attention_built();
    printf("attention built: %s\n", built);
    CHECK(built && *built, "st_backend_cuda_attention_built says nothing");
    char why[256] = "";
    int nodes[2] = {0, 0};
    /* GQA (8 query heads over 2 kv heads), head 64; and GPT-2's shape (12 over 12, head 64) */
    int rc = cu_sdpa_selfcheck(2, 64, 8, 2, 64, nodes, why, sizeof why);
    if (rc < 0) {
        printf("test_cuda_cudnn: skipped: %s\n", why);
        return 77;
    }
    CHECK(rc == 0, "the GQA graphs: %s", why);
    printf("GQA 8/2 heads, head 64: forward %d operations, backward %d operations\n", nodes[0], nodes[1]);
    /* the forward: 2 matmuls, scale, 4 mask nodes, 2 reductions and 5 pointwise of the softmax */
    CHECK(nodes[0] == 14, "forward graph has %d operations, expected 14", nodes[0]);
    /* the backward: 5 matmuls, 2 scales, 4 mask nodes, 3 transposes (P, dS, K), delta's
     * product and sum, P's sub and exp, dS's sub and mul, dQ's conversion; and the 2 group
     * sums of dK, dV */
    CHECK(nodes[1] == 23, "backward graph has %d operations, expected 23", nodes[1]);
    rc = cu_sdpa_selfcheck(1, 1024, 12, 12, 64, nodes, why, sizeof why);
    CHECK(rc == 0, "the GPT-2 graphs: %s", why);
    CHECK(nodes[0] == 14 && nodes[1] == 21, "GPT-2 graphs of %d and %d operations, expected 14 and 21 (no group "
          "sums)", nodes[0], nodes[1]);
    return test_finish("test_cuda_cudnn");
}

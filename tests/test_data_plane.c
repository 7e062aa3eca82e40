/* test_data_plane.c - the shared data plane: consumer processes fed by one producer
 * through shared memory get exactly what a loader of their own rank would give. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "strata/data.h"
#include "testutil.h"

#define STEPS 25
static char path_a[512];

static void config(data_loader_config *c, int B, int rank, int world) {
    data_loader_config_init(c);
    c->n_sources = 2;
    c->sources[0] = (data_source_config){.path = path_a, .weight = 0.7};
    c->sources[1] = (data_source_config){.path = path_a, .weight = 0.3};
    c->T = 48, c->B = B, c->rank = rank, c->world = world, c->seed = 77;
    c->vocab_size = 300, c->eod_token = 256, c->mask_eod = 1, c->prefetch = 3;
}

/* Child: attach as local index i and compare every batch with a private loader. */
static int consumer(const char *name, int i, int first_rank, int world) {
    st_err err = {0};
    data_plane *p;
    if (data_plane_attach(&p, name, i, 20.0, &err)) {
        fprintf(stderr, "attach: %s\n", err.msg);
        return 1;
    }
    data_loader_config c;
    config(&c, 2, first_rank + i, world);
    data_loader *dl;
    if (data_loader_open(&dl, &c, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    int bad = 0;
    for (int s = 0; s < STEPS; s++) {
        data_batch a, b;
        if (data_plane_next(p, &a, &err) || data_loader_next(dl, &b, &err)) {
            fprintf(stderr, "next: %s\n", err.msg);
            return 1;
        }
        size_t nt = (size_t)b.B * (b.T + 1), ni = (size_t)b.B * b.T;
        bad += a.B != b.B || a.step != b.step || a.first_sample != b.first_sample || a.n_seqs != b.n_seqs ||
               a.max_seqlen != b.max_seqlen || memcmp(a.tokens, b.tokens, nt * 4) ||
               memcmp(a.positions, b.positions, ni * 4) || memcmp(a.loss_mask, b.loss_mask, ni) ||
               memcmp(a.source, b.source, (size_t)b.B) ||
               memcmp(a.cu_seqlens, b.cu_seqlens, ((size_t)b.n_seqs + 1) * 4);
    }
    data_loader_state sa, sb;
    data_plane_get_state(p, &sa);
    data_loader_get_state(dl, &sb);
    bad += memcmp(&sa, &sb, sizeof sa) != 0;
    data_loader_close(dl);
    data_plane_close(p);
    if (bad) fprintf(stderr, "consumer %d (rank %d of %d): %d mismatches\n", i, first_rank + i, world, bad);
    return bad ? 1 : 0;
}

static void run_case(int first_rank, int world) {
    char name[64];
    snprintf(name, sizeof name, "strata-test-plane-%d-%d", (int)getpid(), first_rank);
    pid_t kids[2];
    /* Fork before any thread exists; the children attach once the producer is up. */
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) _exit(consumer(name, i, first_rank, world));
    }
    data_loader_config c;
    config(&c, 2, 0, world);
    st_err err = {0};
    data_plane *p = NULL;
    CHECK(data_plane_serve(&p, name, &c, first_rank, 2, &err) == ST_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        int st = 0;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "consumer %d of ranks %d.. failed", i, first_rank);
    }
    data_plane_close(p);
}

int main(void) {
    st_err err = {0};
    snprintf(path_a, sizeof path_a, "%s/a", test_tmpdir());
    data_pack_writer *w;
    CHECK(data_pack_open(&w, path_a, DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    int32_t doc[200];
    for (int d = 0; d < 120; d++) {
        int n = 1 + (d * 37) % 150;
        for (int i = 0; i < n; i++) doc[i] = (d * 7 + i) % 256;
        doc[n] = 256;
        CHECK(data_pack_add(w, doc, (size_t)n + 1, &err) == ST_OK, "%s", err.msg);
    }
    CHECK(data_pack_close(w, &err) == ST_OK, "%s", err.msg);
    run_case(0, 2);
    run_case(2, 4);
    /* a block that is not aligned is refused */
    data_loader_config c;
    config(&c, 2, 0, 4);
    data_plane *p;
    CHECK(data_plane_serve(&p, "strata-test-plane-bad", &c, 1, 2, &err) == ST_ERR_INVALID, "misaligned block accepted");
    return test_finish("data_plane");
}

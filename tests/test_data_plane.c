/* test_data_plane.c - the shared data plane: consumer processes fed by one producer
 * through shared memory get exactly what a loader of their own rank would give; killing
 * the producer or a consumer ends the others with an error within a bounded time; a
 * segment left by a crashed producer is replaced. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "strata/data.h"
#include "testutil.h"

#define STEPS 25
static char path_a[512];

static void config(st_data_loader_config *c, int B, int rank, int world) {
    st_data_loader_config_init(c);
    c->n_sources = 2;
    c->sources[0] = (st_data_source_config){.path = path_a, .weight = 0.7};
    c->sources[1] = (st_data_source_config){.path = path_a, .weight = 0.3};
    c->T = 48, c->B = B, c->rank = rank, c->world = world, c->seed = 77;
    c->vocab_size = 300, c->eod_token = 256, c->mask_eod = 1, c->prefetch = 3;
}

/* Child: attach as local index i and compare every batch with a private loader. */
static int consumer(const char *name, int i, int first_rank, int world) {
    st_err err = {0};
    st_data_plane *p;
    if (st_data_plane_attach(&p, name, i, 20.0, &err)) {
        fprintf(stderr, "attach: %s\n", err.msg);
        return 1;
    }
    st_data_loader_config c;
    config(&c, 2, first_rank + i, world);
    st_data_loader *dl;
    if (st_data_loader_open(&dl, &c, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 1;
    }
    int bad = 0;
    for (int s = 0; s < STEPS; s++) {
        st_data_batch a, b;
        if (st_data_plane_next(p, &a, &err) || st_data_loader_next(dl, &b, &err)) {
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
    st_data_loader_state sa, sb;
    st_data_plane_get_state(p, &sa);
    st_data_loader_get_state(dl, &sb);
    bad += memcmp(&sa, &sb, sizeof sa) != 0;
    st_data_loader_close(dl);
    st_data_plane_close(p);
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
    st_data_loader_config c;
    config(&c, 2, 0, world);
    st_err err = {0};
    st_data_plane *p = NULL;
    CHECK(st_data_plane_serve(&p, name, &c, first_rank, 2, 0, &err) == ST_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        int st = 0;
        waitpid(kids[i], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "consumer %d of ranks %d.. failed", i, first_rank);
    }
    st_data_plane_close(p);
}

/* ------------------------------------------------------------------ faults */

/* How long the others may take to end after a peer is killed: the plane notices a dead
 * peer within milliseconds; the rest is scheduling on a loaded machine. */
#define END_BOUND_S 4.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Child: attach, tell the parent after a few batches, then take batches (napping nap_us
 * after each) until next() fails. Exit 0 if the error names `want`, 2 if it does not. */
static int fault_consumer(const char *name, int i, int ready_fd, int nap_us, const char *want) {
    st_err err = {0};
    st_data_plane *p;
    if (st_data_plane_attach(&p, name, i, 20.0, &err)) {
        fprintf(stderr, "consumer %d: attach: %s\n", i, err.msg);
        return 1;
    }
    for (int k = 0;; k++) {
        if (k == 3 && write(ready_fd, "x", 1) != 1) return 1;
        st_data_batch b;
        if (st_data_plane_next(p, &b, &err)) {
            int ok = strstr(err.msg, want) != NULL;
            if (!ok) fprintf(stderr, "consumer %d: the error does not name '%s': %s\n", i, want, err.msg);
            else fprintf(stderr, "consumer %d: %s\n", i, err.msg);
            st_data_plane_close(p);
            return ok ? 0 : 2;
        }
        if (nap_us) usleep((useconds_t)nap_us);
    }
}

/* Wait until n bytes came through fd (each consumer's "took a few batches"). */
static int wait_ready(int fd, int n, double limit_s) {
    double t0 = now_s();
    char c;
    while (n > 0 && now_s() - t0 < limit_s) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) == 1 && read(fd, &c, 1) == 1) n--;
    }
    return n == 0;
}

/* Wait for pid at most limit_s; kill it past that. Returns its exit code, or -1 if it
 * had to be killed (a hang) or died by a signal; *took = seconds waited. */
static int wait_bounded(pid_t pid, double limit_s, double *took) {
    double t0 = now_s();
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        *took = now_s() - t0;
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (*took > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(2000);
    }
}

/* The plane's timeout in these tests: a producer silent this long has failed. */
#define PLANE_TIMEOUT_S 1.0

static pid_t fork_producer(const char *name, int stop_self) {
    pid_t pid = fork();
    if (pid == 0) {
        st_data_loader_config c;
        config(&c, 2, 0, 2);
        st_err err = {0};
        st_data_plane *p;
        if (st_data_plane_serve(&p, name, &c, 0, 2, PLANE_TIMEOUT_S, &err)) {
            fprintf(stderr, "producer: %s\n", err.msg);
            _exit(1);
        }
        if (stop_self) raise(SIGKILL); /* a crash: no close, the segment stays */
        for (;;) pause();
    }
    return pid;
}

static void test_kill_producer(void) {
    char name[64];
    snprintf(name, sizeof name, "strata-test-plane-%d-kp", (int)getpid());
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) _exit(fault_consumer(name, i, fds[1], i ? 0 : 1000, "producer"));
    }
    pid_t prod = fork_producer(name, 0);
    CHECK(wait_ready(fds[0], 2, 30.0), "the consumers did not start");
    kill(prod, SIGKILL);
    waitpid(prod, NULL, 0);
    for (int i = 0; i < 2; i++) {
        double took;
        int rc = wait_bounded(kids[i], END_BOUND_S, &took);
        CHECK(rc == 0, "producer killed: consumer %d %s (exit %d after %.2f s)", i,
              rc == -1 ? "hung (killed by the test)" : "ended without the expected error", rc, took);
        fprintf(stderr, "producer killed: consumer %d ended %.3f s later\n", i, took);
    }
    close(fds[0]), close(fds[1]);
    char shm[80];
    snprintf(shm, sizeof shm, "/%s", name);
    shm_unlink(shm); /* the dead producer's segment */
}

static void test_kill_consumer(void) {
    char name[64];
    snprintf(name, sizeof name, "strata-test-plane-%d-kc", (int)getpid());
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t kids[2];
    for (int i = 0; i < 2; i++) { /* consumer 1 is killed; consumer 0 must end too */
        kids[i] = fork();
        if (kids[i] == 0) _exit(fault_consumer(name, i, fds[1], i ? 0 : 1000, "consumer 1"));
    }
    st_data_loader_config c;
    config(&c, 2, 0, 2);
    st_err err = {0};
    st_data_plane *p = NULL;
    CHECK(st_data_plane_serve(&p, name, &c, 0, 2, PLANE_TIMEOUT_S, &err) == ST_OK, "%s", err.msg);
    CHECK(wait_ready(fds[0], 2, 30.0), "the consumers did not start");
    CHECK(!p || st_data_plane_check(p, &err) == ST_OK, "a working plane reports: %s", err.msg);
    kill(kids[1], SIGKILL);
    waitpid(kids[1], NULL, 0);
    double t0 = now_s(), took;
    int rc = wait_bounded(kids[0], END_BOUND_S, &took);
    CHECK(rc == 0, "consumer 1 killed: consumer 0 %s (exit %d after %.2f s)",
          rc == -1 ? "hung (killed by the test)" : "ended without the expected error", rc, took);
    fprintf(stderr, "consumer 1 killed: consumer 0 ended %.3f s later\n", took);
    /* the producer's process learns it too */
    st_status prc = ST_OK;
    while (p && (prc = st_data_plane_check(p, &err)) == ST_OK && now_s() - t0 < END_BOUND_S) usleep(2000);
    CHECK(prc != ST_OK && strstr(err.msg, "consumer 1") && strstr(err.msg, "died"),
          "consumer 1 killed: the producer's check after %.2f s: %s", now_s() - t0, prc ? err.msg : "ok");
    close(fds[0]), close(fds[1]);
    st_data_plane_close(p);
}

/* A producer that stops (SIGSTOP: alive, holding its lock, doing nothing) ends its
 * consumers once it has been silent for the plane's timeout. */
static void test_stopped_producer(void) {
    char name[64];
    snprintf(name, sizeof name, "strata-test-plane-%d-sp", (int)getpid());
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) _exit(fault_consumer(name, i, fds[1], 0, "no progress"));
    }
    pid_t prod = fork_producer(name, 0);
    CHECK(wait_ready(fds[0], 2, 30.0), "the consumers did not start");
    kill(prod, SIGSTOP);
    for (int i = 0; i < 2; i++) {
        double took;
        int rc = wait_bounded(kids[i], PLANE_TIMEOUT_S + END_BOUND_S, &took);
        CHECK(rc == 0, "producer stopped: consumer %d %s (exit %d after %.2f s)", i,
              rc == -1 ? "hung (killed by the test)" : "ended without the expected error", rc, took);
        fprintf(stderr, "producer stopped: consumer %d ended %.3f s later (timeout %.1f s)\n", i, took, PLANE_TIMEOUT_S);
    }
    kill(prod, SIGKILL);
    waitpid(prod, NULL, 0);
    close(fds[0]), close(fds[1]);
    char shm[80];
    snprintf(shm, sizeof shm, "/%s", name);
    shm_unlink(shm);
}

/* A producer that crashed left its segment; the next producer of that name replaces it,
 * and a second live producer of the same name is refused. */
static void test_stale_segment(void) {
    char name[64], shm[80];
    snprintf(name, sizeof name, "strata-test-plane-%d-st", (int)getpid());
    snprintf(shm, sizeof shm, "/%s", name);
    pid_t prod = fork_producer(name, 1);
    int st = 0;
    waitpid(prod, &st, 0);
    CHECK(WIFSIGNALED(st), "the crashing producer did not crash (status %d)", st);
    int fd = shm_open(shm, O_RDONLY, 0);
    CHECK(fd >= 0, "the crashed producer left no segment to test with");
    struct stat old = {0};
    if (fd >= 0) fstat(fd, &old), close(fd);
    st_data_loader_config c;
    config(&c, 2, 0, 1);
    st_err err = {0};
    st_data_plane *p = NULL;
    /* a consumer does not attach to it: it waits for a producer, and says what it found */
    CHECK(st_data_plane_attach(&p, name, 0, 0.2, &err) != ST_OK && strstr(err.msg, "died"),
          "a consumer attached to a dead producer's segment: %s", err.msg);
    st_data_plane_close(p), p = NULL;
    CHECK(st_data_plane_serve(&p, name, &c, 0, 1, 0, &err) == ST_OK, "a stale segment was not replaced: %s", err.msg);
    fd = shm_open(shm, O_RDONLY, 0);
    struct stat now = {0};
    if (fd >= 0) fstat(fd, &now), close(fd);
    CHECK(fd >= 0 && now.st_ino != old.st_ino, "the stale segment is still in place");
    if (p) {
        /* it serves: a consumer gets what a loader of its own gives */
        st_data_plane *q = NULL;
        CHECK(st_data_plane_attach(&q, name, 0, 5.0, &err) == ST_OK, "%s", err.msg);
        st_data_loader *dl = NULL;
        st_data_loader_config lc;
        config(&lc, 2, 0, 1);
        CHECK(st_data_loader_open(&dl, &lc, &err) == ST_OK, "%s", err.msg);
        st_data_batch a, b;
        if (q && dl) {
            CHECK(st_data_plane_next(q, &a, &err) == ST_OK && st_data_loader_next(dl, &b, &err) == ST_OK, "%s", err.msg);
            CHECK(!memcmp(a.tokens, b.tokens, sizeof(int32_t) * 2 * 49), "the replaced plane serves other tokens");
        }
        st_data_loader_close(dl);
        /* a second producer of a live plane is refused, naming the holder */
        st_data_plane *p2 = NULL;
        char pid[32];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        CHECK(st_data_plane_serve(&p2, name, &c, 0, 1, 0, &err) == ST_ERR_BUSY && strstr(err.msg, pid),
              "a second producer of a live plane: %s", err.msg);
        st_data_plane_close(p2);
        st_data_plane_close(q);
    }
    st_data_plane_close(p);
}

int main(void) {
    st_err err = {0};
    snprintf(path_a, sizeof path_a, "%s/a", test_tmpdir());
    st_data_pack_writer *w;
    CHECK(st_data_pack_open(&w, path_a, ST_DATA_DTYPE_U16, &err) == ST_OK, "%s", err.msg);
    int32_t doc[200];
    for (int d = 0; d < 120; d++) {
        int n = 1 + (d * 37) % 150;
        for (int i = 0; i < n; i++) doc[i] = (d * 7 + i) % 256;
        doc[n] = 256;
        CHECK(st_data_pack_add(w, doc, (size_t)n + 1, &err) == ST_OK, "%s", err.msg);
    }
    CHECK(st_data_pack_close(w, &err) == ST_OK, "%s", err.msg);
    run_case(0, 2);
    run_case(2, 4);
    /* a block that is not aligned is refused */
    st_data_loader_config c;
    config(&c, 2, 0, 4);
    st_data_plane *p;
    CHECK(st_data_plane_serve(&p, "strata-test-plane-bad", &c, 1, 2, 0, &err) == ST_ERR_INVALID, "misaligned block accepted");
    test_kill_producer();
    test_kill_consumer();
    test_stopped_producer();
    test_stale_segment();
    return test_finish("data_plane");
}

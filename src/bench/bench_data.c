/* bench_data.c - strata bench data: the data pipeline over a synthetic three-source mix of
 * 10^10 tokens (sparse .bin files, a real .idx of ~10^7 documents) built in a temporary
 * directory and deleted afterwards: first batch, tokens/s, bytes and CPU per token, memory,
 * and the stall a consumer sees. (Moved from src/cli/cmd_data.c.) */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "strata/core.h"
#include "strata/data.h"

static const char *bench_usage =
    "usage: strata bench data [--json] [--tokens N] [--seq-len T] [--batch B] [--seconds S]\n"
    "                         [--prefetch D] [--dir DIR] [--keep]\n"
    "  Builds a synthetic mix of three Megatron sources (weights 0.5/0.3/0.2, documents of\n"
    "  log-normal length with mean 1000 tokens, N tokens in all, default 1e10) in a fresh\n"
    "  directory under DIR (default /dev/shm, else /tmp): real .idx files, sparse .bin\n"
    "  files made with ftruncate. Then one consumer reads batches of B x T (default 8 x 2048) for S seconds\n"
    "  (default 3), and the files are deleted unless --keep. Prints:\n"
    "    first_batch_s    open of all three sources to the first batch in hand\n"
    "    tokens_per_s     input tokens (B*T a batch) delivered per second, consumer not computing\n"
    "    bytes_per_token  bytes the loader reads + writes per delivered token (token bytes from\n"
    "                     the page cache and the staging copy, batch arrays, and the .idx\n"
    "                     bytes the lookahead preads: on a large index that is the whole\n"
    "                     index once per 65536 documents of a source, 12 x its documents /\n"
    "                     65536 bytes per document)\n"
    "    cpu_s_per_gtok   process CPU seconds (user + system, all threads) per 10^9 tokens\n"
    "    rss_mb           resident set after the run (VmRSS); rss_peak_mb is VmHWM\n"
    "    memcpy_gbps      memcpy of 256 MiB, counted as bytes read + written per second\n"
    "                     (the same convention as bytes_per_token), median of 5\n"
    "    stall_frac       share of time next() waited while the consumer simulated an\n"
    "                     accelerator step (sleeping) of twice the loader's per-batch time,\n"
    "                     at least 1 ms\n";

static double rss_field(const char *field) { /* MiB */
    double b = bench_proc_status_bytes(field);
    return b < 0 ? -1 : b / 1048576.0;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double memcpy_gbps(void) {
    size_t n = 256u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a), free(b);
        return -1;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double r[5];
    for (int i = 0; i < 5; i++) {
        double t0 = st_now();
        memcpy(b, a, n);
        r[i] = 2.0 * (double)n / (st_now() - t0) / 1e9;
        a[i] = b[n - 1 - i]; /* keep the copy observable */
    }
    free(a), free(b);
    qsort(r, 5, sizeof r[0], cmp_double);
    return r[2];
}

/* One synthetic Megatron source: `tokens` tokens in documents of log-normal length,
 * written as a real .idx (streamed in chunks; the sizes are drawn twice from the same
 * seed rather than kept) and a sparse .bin of the matching size. */
static int make_synth(const char *prefix, uint64_t tokens, uint64_t seed, uint64_t *docs_out, st_err *err) {
    char ip[1100], bp[1100];
    snprintf(ip, sizeof ip, "%.1090s.idx", prefix);
    snprintf(bp, sizeof bp, "%.1090s.bin", prefix);
    FILE *f = fopen(ip, "wb");
    if (!f) return st_errf(err, ST_ERR_IO, "%s: cannot create: %s", ip, strerror(errno));
    const double mu = log(1000.0) - 0.5, sigma = 1.0; /* mean exp(mu + sigma^2/2) = 1000 */
    enum { CH = 1 << 16 };
    static int32_t sz[CH];
    static int64_t pt[CH];
    uint8_t hdr[34] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    fwrite(hdr, 1, 34, f); /* counts filled in at the end */
    uint64_t n = 0, total = 0;
    st_rng r;
    st_rng_seed(&r, seed);
    while (total < tokens) {
        int k = 0;
        for (; k < CH && total < tokens; k++) {
            double len = exp(mu + sigma * st_rng_normal(&r));
            uint64_t L = len < 1 ? 1 : len > 1e6 ? 1000000 : (uint64_t)len;
            if (L > tokens - total) L = tokens - total;
            sz[k] = (int32_t)L;
            total += L;
        }
        fwrite(sz, 4, (size_t)k, f);
        n += (uint64_t)k;
    }
    st_rng_seed(&r, seed);
    uint64_t ptr = 0, t2 = 0;
    for (uint64_t done = 0; done < n;) {
        int k = 0;
        for (; k < CH && done < n; k++, done++) {
            double len = exp(mu + sigma * st_rng_normal(&r));
            uint64_t L = len < 1 ? 1 : len > 1e6 ? 1000000 : (uint64_t)len;
            if (L > tokens - t2) L = tokens - t2;
            pt[k] = (int64_t)ptr;
            ptr += 2 * L;
            t2 += L;
        }
        fwrite(pt, 8, (size_t)k, f);
    }
    for (uint64_t done = 0; done <= n;) {
        int k = 0;
        for (; k < CH && done <= n; k++, done++) pt[k] = (int64_t)done;
        fwrite(pt, 8, (size_t)k, f);
    }
    uint64_t version = 1, ndi = n + 1;
    hdr[17] = ST_DATA_DTYPE_U16;
    memcpy(hdr + 9, &version, 8);
    memcpy(hdr + 18, &n, 8);
    memcpy(hdr + 26, &ndi, 8);
    int bad = fseek(f, 0, SEEK_SET) != 0 || fwrite(hdr, 1, 34, f) != 34;
    if (fclose(f) != 0 || bad) return st_errf(err, ST_ERR_IO, "%s: write failed: %s", ip, strerror(errno));
    int fd = open(bp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)(2 * total)) != 0) {
        if (fd >= 0) close(fd);
        return st_errf(err, ST_ERR_IO, "%s: cannot create a sparse %llu-byte file: %s", bp,
                       (unsigned long long)(2 * total), strerror(errno));
    }
    close(fd);
    *docs_out = n;
    return ST_OK;
}

int bench_data(int argc, char **argv) {
    int json = 0, keep = 0, T = 2048, B = 8, prefetch = 4;
    double tokens = 1e10, seconds = 3;
    /* tmpfs by default: reading a hole there copies the zero page, while ext4 allocates
     * and zeroes a page-cache page per 4 KiB (45% of the run in kernel memset), which
     * measures the filesystem's sparse files rather than the loader. */
    struct stat sd;
    const char *dir = stat("/dev/shm", &sd) == 0 && S_ISDIR(sd.st_mode) ? "/dev/shm" : "/tmp";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--keep")) keep = 1;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = st_parse_count(argv[++i]);
        else if (!strcmp(argv[i], "--seq-len") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--prefetch") && i + 1 < argc) prefetch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(bench_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "strata bench data: unknown option '%s'\n\n%s", argv[i], bench_usage);
            return 2;
        }
    }
    if (!(tokens >= 3e4) || T < 1 || B < 1 || !(seconds > 0)) {
        fprintf(stderr, "strata bench data: need --tokens >= 3e4 (1e10, 2.5B, ...), T, B >= 1, S > 0\n");
        return 2;
    }
    char tdir[1024];
    snprintf(tdir, sizeof tdir, "%s/strata-bench-data-XXXXXX", dir);
    if (!mkdtemp(tdir)) {
        fprintf(stderr, "strata bench data: cannot create a directory under %s: %s\n", dir, strerror(errno));
        return 1;
    }
    st_err err = {0};
    const double share[3] = {0.5, 0.3, 0.2};
    char prefix[3][1100];
    uint64_t docs[3], total_docs = 0;
    int rc = 0;
    double t0 = st_now();
    for (int i = 0; i < 3 && !rc; i++) {
        snprintf(prefix[i], sizeof prefix[i], "%s/src%d", tdir, i);
        rc = make_synth(prefix[i], (uint64_t)(tokens * share[i]), 1000 + (uint64_t)i, &docs[i], &err) != ST_OK;
        total_docs += rc ? 0 : docs[i];
    }
    double gen_s = st_now() - t0;
    st_data_loader_config c;
    st_data_loader_config_init(&c);
    c.n_sources = 3;
    for (int i = 0; i < 3; i++) c.sources[i] = (st_data_source_config){.path = prefix[i], .weight = share[i]};
    c.T = T, c.B = B, c.seed = 42, c.vocab_size = 50257, c.eod_token = 50256, c.mask_eod = 1;
    c.prefetch = prefetch;
    st_data_loader *dl = NULL;
    st_data_batch b;
    double first_batch_s = 0, tok_s = 0, bpt = 0, cpu_gtok = 0, rss = 0, rss_peak = 0, stall = 0;
    st_data_loader_stats st0 = {0}, st1 = {0};
    if (!rc) {
        t0 = st_now();
        rc = st_data_loader_open(&dl, &c, &err) || st_data_loader_next(dl, &b, &err);
        first_batch_s = st_now() - t0;
    }
    if (!rc) {
        /* Phase 1: the consumer takes batches as fast as the loader makes them. */
        st_data_loader_get_stats(dl, &st0);
        double c0 = cpu_seconds(), w0 = st_now();
        while (!rc && st_now() - w0 < seconds) rc = st_data_loader_next(dl, &b, &err) != ST_OK;
        double wall = st_now() - w0, cpu = cpu_seconds() - c0;
        st_data_loader_get_stats(dl, &st1);
        double ntok = (double)(st1.tokens - st0.tokens);
        tok_s = ntok / wall;
        bpt = (double)(st1.bytes_read - st0.bytes_read + st1.bytes_written - st0.bytes_written) / ntok;
        cpu_gtok = cpu / ntok * 1e9;
        /* Phase 2: a step that takes twice the loader's per-batch time; the consumer
         * should find a batch ready every time. */
        double step_s = 2.0 * (double)B * T / tok_s, wait0 = st1.wait_s;
        if (step_s < 1e-3) step_s = 1e-3;
        if (step_s > 0.5) step_s = 0.5;
        w0 = st_now();
        int steps = 0;
        while (!rc && st_now() - w0 < seconds / 2) {
            rc = st_data_loader_next(dl, &b, &err) != ST_OK;
            /* the accelerator computes; this thread waits for it */
            struct timespec ts = {0, (long)(step_s * 1e9)};
            nanosleep(&ts, NULL);
            steps++;
        }
        st_data_loader_get_stats(dl, &st1);
        stall = (st1.wait_s - wait0) / (st_now() - w0);
        rss = rss_field("VmRSS:");
        rss_peak = rss_field("VmHWM:");
    }
    st_data_loader_close(dl);
    for (int i = 0; i < 3 && !keep; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%.1090s.idx", prefix[i]);
        unlink(p);
        snprintf(p, sizeof p, "%.1090s.bin", prefix[i]);
        unlink(p);
    }
    if (!keep) rmdir(tdir);
    if (rc) {
        fprintf(stderr, "strata bench data: %s\n", err.msg);
        return 1;
    }
    double mc = memcpy_gbps();
    double ring_mb = (double)st1.ring_bytes / 1048576.0;
    if (json) {
        printf("{\"bench\": \"data\", \"tokens_indexed\": %.0f, \"documents\": %llu, \"sources\": 3, \"seq_len\": %d, "
               "\"batch\": %d, \"prefetch\": %d, \"generate_s\": %.3f, \"first_batch_s\": %.6f, \"tokens_per_s\": %.4g, "
               "\"bytes_per_token\": %.3f, \"achieved_gbps\": %.3f, \"cpu_s_per_gtok\": %.3f, \"rss_mb\": %.1f, "
               "\"rss_peak_mb\": %.1f, \"ring_mb\": %.2f, \"memcpy_gbps\": %.3f, \"stall_frac\": %.5f}\n",
               tokens, (unsigned long long)total_docs, T, B, prefetch, gen_s, first_batch_s, tok_s, bpt,
               tok_s * bpt / 1e9, cpu_gtok, rss, rss_peak, ring_mb, mc, stall);
    } else {
        printf("data pipeline: 3 sources, %.3g tokens indexed in %llu documents (generated in %.2f s)\n", tokens,
               (unsigned long long)total_docs, gen_s);
        printf("  first_batch_s    %.6f\n  tokens_per_s     %.4g  (B=%d, T=%d, prefetch %d)\n", first_batch_s, tok_s, B,
               T, prefetch);
        printf("  bytes_per_token  %.3f  -> %.3f GB/s moved, memcpy %.3f GB/s (read+write)\n", bpt, tok_s * bpt / 1e9,
               mc);
        printf("  cpu_s_per_gtok   %.3f\n  rss_mb           %.1f (peak %.1f, ring %.2f)\n  stall_frac       %.5f\n",
               cpu_gtok, rss, rss_peak, ring_mb, stall);
    }
    return 0;
}

/* cmd_probe.c - strata probe: parse the paths, measure each one with the tier's disk
 * probe (st_io_probe, src/tier/probe.c: write, read and mixed bandwidth through the io
 * engine itself), print the figures and write them as a hardware profile (JSON). A tmpfs
 * path is memory, not a disk: it is measured and marked "memory": true. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_probe.h"
#include "strata/io.h"

#define PROBE_MAX_PATHS 64

typedef struct probe_result {
    const char *path;
    st_io_probe_result m; /* the measurement */
} probe_result;

static void probe_usage(FILE *f) {
    fputs("usage: strata probe --path DIR [--path DIR2 ...] [--bytes 1GiB] [--request 1MiB]\n"
          "                    [--depth 32] [--json] [-o profile.json]\n"
          "\n"
          "Writes a test file of --bytes in each path through the io engine (io_uring, or the\n"
          "thread pool with STRATA_IO=threads), times a sequential write (with fdatasync), a\n"
          "sequential read (page cache dropped) and a mixed pass (alternate requests read and\n"
          "write, as the optimizer streaming its state does), removes the file, and prints each\n"
          "path's bandwidth in GB/s (1e9 bytes/s). A tmpfs path is reported as memory. --json\n"
          "prints the profile, -o writes it to a file:\n"
          "  {\"paths\":[{\"path\",\"engine\",\"direct\",\"memory\",\"read_gbps\",\"write_gbps\",\n"
          "              \"mixed_gbps\",\"request_bytes\",\"depth\",\"bytes\"}]}\n",
          f);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void write_json(FILE *f, const probe_result *r, int n) {
    fputs("{\"paths\": [", f);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",\n  {\"path\": " : "\n  {\"path\": ", f);
        json_str(f, r[i].path);
        const st_io_probe_result *m = &r[i].m;
        fprintf(f,
                ", \"engine\": \"%s\", \"direct\": %s, \"memory\": %s, \"read_gbps\": %.3f, \"write_gbps\": %.3f, "
                "\"mixed_gbps\": %.3f, \"request_bytes\": %zu, \"depth\": %d, \"bytes\": %llu}",
                m->engine, m->direct ? "true" : "false", m->memory ? "true" : "false", m->read_gbps, m->write_gbps,
                m->mixed_gbps, m->request_bytes, m->depth, (unsigned long long)m->bytes);
    }
    fputs("\n]}\n", f);
}

int cmd_probe(int argc, char **argv) {
    const char *paths[PROBE_MAX_PATHS];
    int n_paths = 0, json = 0, depth = 0;
    double bytes = 1073741824.0, request = 0;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            probe_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata probe: '%s' needs a value or is unknown (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--path")) {
            if (n_paths == PROBE_MAX_PATHS) {
                fprintf(stderr, "strata probe: at most %d paths\n", PROBE_MAX_PATHS);
                return 2;
            }
            paths[n_paths++] = v;
        } else if (!strcmp(a, "--bytes") || !strcmp(a, "--request")) {
            double b = st_parse_bytes(v);
            if (b <= 0) {
                fprintf(stderr, "strata probe: %s '%s' is not a byte count (e.g. 1GiB, 64MiB)\n", a, v);
                return 2;
            }
            if (a[2] == 'b') bytes = b;
            else request = b;
        } else if (!strcmp(a, "--depth")) {
            depth = atoi(v);
        } else if (!strcmp(a, "-o")) {
            out = v;
        } else {
            fprintf(stderr, "strata probe: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (n_paths == 0) {
        fprintf(stderr, "strata probe: give at least one --path DIR\n");
        probe_usage(stderr);
        return 2;
    }
    probe_result *res = calloc((size_t)n_paths, sizeof *res);
    if (!res) {
        fprintf(stderr, "strata probe: out of memory\n");
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < n_paths; i++) {
        st_err err = {0};
        /* Paths one at a time: each figure is that path alone, not a share of a sum. */
        res[i].path = paths[i];
        if (st_io_probe(paths[i], (uint64_t)bytes, (size_t)request, depth, &res[i].m, &err) != ST_OK) {
            fprintf(stderr, "strata probe: %s\n", err.msg);
            rc = 1;
            break;
        }
        const st_io_probe_result *m = &res[i].m;
        if (!json)
            printf("%-24s %-8s %-8s write %7.3f GB/s  read %7.3f GB/s  mixed %7.3f GB/s  (%llu MiB, %zu KiB x %d)%s\n",
                   paths[i], m->engine, m->direct ? "direct" : "buffered", m->write_gbps, m->read_gbps, m->mixed_gbps,
                   (unsigned long long)(m->bytes >> 20), m->request_bytes >> 10, m->depth,
                   m->memory ? "  [tmpfs: memory, not a disk]" : "");
    }
    if (rc == 0) {
        if (json) write_json(stdout, res, n_paths);
        if (out) {
            FILE *f = fopen(out, "w");
            if (!f) {
                fprintf(stderr, "strata probe: cannot write %s\n", out);
                rc = 1;
            } else {
                write_json(f, res, n_paths);
                if (fclose(f) != 0) {
                    fprintf(stderr, "strata probe: writing %s failed\n", out);
                    rc = 1;
                }
            }
        }
    }
    free(res);
    return rc;
}

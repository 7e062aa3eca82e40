/* run_docs.c - per-document signals of a run (run_docs.h): the segments of each micro-batch
 * (the loader's), the losses of their targets (the step's row hook), records gathered over
 * the ranks in global sample order, and RUN_DIR/doc_signals.bin (strata/data.h's layout)
 * appended by rank 0 after each step, bounded by key doc_signals, cut back on a resume.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/run_docs.h"

#define DS_HDR ST_DATA_DOCSIG_HEADER_BYTES

/* The header this run writes: its sources' identities and paths. */
static st_status make_header(const run_docs *x, const st_train_config *c, st_data_loader *dl, int n_sources,
                             uint8_t *h, st_err *err) {
    memset(h, 0, DS_HDR);
    uint32_t v = ST_DATA_DOCSIG_VERSION, hb = DS_HDR, rb = sizeof(st_data_docsig), ns = (uint32_t)n_sources;
    /* the global rows of a step, not B and grad_accum: N ranks write one process's file */
    uint32_t rows = (uint32_t)x->B * (uint32_t)c->grad_accum * (uint32_t)(x->comm ? st_comm_size(x->comm) : 1);
    uint32_t T = (uint32_t)x->T, zero = 0;
    memcpy(h, ST_DATA_DOCSIG_MAGIC, 8);
    memcpy(h + 8, &v, 4), memcpy(h + 12, &hb, 4), memcpy(h + 16, &rb, 4), memcpy(h + 20, &ns, 4);
    memcpy(h + 24, &x->max_records, 8);
    memcpy(h + 32, &rows, 4), memcpy(h + 36, &T, 4), memcpy(h + 40, &zero, 4);
    for (int i = 0; i < n_sources; i++) {
        st_data_ident id;
        char path[4096];
        st_status s = st_data_loader_source_ident(dl, i, &id, path, sizeof path, err);
        if (s) return st_err_prefix(err, "key 'doc_signals': source %d", i);
        uint8_t *p = h + 64 + (size_t)i * (48 + ST_DATA_DOCSIG_PATH_BYTES);
        memcpy(p, &id, 48);
        snprintf((char *)p + 48, ST_DATA_DOCSIG_PATH_BYTES, "%.463s", path);
    }
    uint32_t crc = st_crc32c(0, h, DS_HDR);
    memcpy(h + 44, &crc, 4);
    return ST_OK;
}

/* A resume: the file's header must be this run's; records of steps after `step` are cut. */
static st_status reopen(run_docs *x, const uint8_t *want, uint64_t step, st_err *err) {
    FILE *f = fopen(x->path, "r+b");
    if (!f)
        return st_errf(err, ST_ERR_IO, "%s: cannot open (%s); a run with doc_signals resumes with the file it wrote "
                       "(set doc_signals 0 to run without it)", x->path, strerror(errno));
    uint8_t *h = malloc(DS_HDR);
    st_status s = ST_OK;
    if (!h) s = st_errf(err, ST_ERR_NOMEM, "out of memory");
    else if (fread(h, 1, DS_HDR, f) != DS_HDR || memcmp(h, want, 8))
        s = st_errf(err, ST_ERR_FORMAT, "%s: offset 0: not a doc_signals file of this strata (magic \""
                    ST_DATA_DOCSIG_MAGIC "\", %d header bytes)", x->path, DS_HDR);
    else if (memcmp(h, want, DS_HDR)) {
        size_t o = 0;
        while (o < DS_HDR && h[o] == want[o]) o++;
        s = st_errf(err, ST_ERR_INVALID, "%s: offset %zu: its header (%s) differs from this run's; the resumed run "
                    "has other sources, batch, seq, grad_accum or doc_signals bound: resume with the same keys, "
                    "or move the file away", x->path, o, o < 64 ? "the shape or bound" : "a source's identity or path");
    }
    free(h);
    if (s) {
        fclose(f);
        return s;
    }
    if (fseeko(f, 0, SEEK_END)) s = st_errf(err, ST_ERR_IO, "%s: seek: %s", x->path, strerror(errno));
    off_t size = ftello(f);
    const size_t rb = sizeof(st_data_docsig);
    if (!s && (size < DS_HDR || (size - DS_HDR) % rb))
        s = st_errf(err, ST_ERR_TRUNCATED, "%s: %lld bytes, not the %d-byte header and whole %zu-byte records; the "
                    "file is damaged: move it away", x->path, (long long)size, DS_HDR, rb);
    uint64_t n = s ? 0 : (uint64_t)(size - DS_HDR) / rb, keep = n;
    st_data_docsig r;
    while (!s && keep > 0) { /* records are in step order: cut from the end */
        if (fseeko(f, (off_t)(DS_HDR + (keep - 1) * rb), SEEK_SET) || fread(&r, rb, 1, f) != 1) {
            s = st_errf(err, ST_ERR_IO, "%s: reading record %llu: %s", x->path, (unsigned long long)(keep - 1),
                        strerror(errno));
            break;
        }
        if (r.step <= step) break;
        keep--;
    }
    if (!s && keep > 0 && r.step < step && step > 0)
        s = st_errf(err, ST_ERR_INVALID, "%s: its records end at step %llu, the run resumes at step %llu: the "
                    "records of the steps between are missing (the file was not written through before a crash, "
                    "or is another run's); move it away to record from here on", x->path,
                    (unsigned long long)r.step, (unsigned long long)step);
    if (!s && keep < n && ftruncate(fileno(f), (off_t)(DS_HDR + keep * rb)))
        s = st_errf(err, ST_ERR_IO, "%s: cutting back to step %llu: %s", x->path, (unsigned long long)step,
                    strerror(errno));
    if (!s && fseeko(f, 0, SEEK_END)) s = st_errf(err, ST_ERR_IO, "%s: seek: %s", x->path, strerror(errno));
    if (s) {
        fclose(f);
        return s;
    }
    x->f = f;
    x->written = keep;
    return ST_OK;
}

st_status run_docs_open(run_docs *x, const st_train_config *c, st_data_loader *dl, st_comm *comm, int lead,
                        uint64_t step, int resumed, run_mix *mix, st_err *err) {
    memset(x, 0, sizeof *x);
    x->mix = mix;
    if (c->doc_signals <= 0) return ST_OK;
    if (!dl) return st_errf(err, ST_ERR_INVALID, "key 'doc_signals': the run has no data loader");
    st_data_loader_config dc;
    st_data_loader_config_init(&dc);
    char list[sizeof c->data];
    snprintf(list, sizeof list, "%s", c->data);
    int n_sources = 1;
    if (!st_train_config_data_embedded(list)) {
        st_status s = st_data_list_parse(&dc, list, "data", err);
        if (s) return s;
        n_sources = dc.n_sources;
    }
    x->B = c->batch, x->T = c->seq, x->n_micro = (int)c->grad_accum, x->lead = lead, x->comm = comm;
    x->max_records = (uint64_t)c->doc_signals * (1u << 20) / sizeof(st_data_docsig);
    const size_t BT = (size_t)x->B * x->T, A = (size_t)x->n_micro;
    x->src = calloc(A * x->B, 1);
    x->cu = calloc(A * (BT + 1), sizeof *x->cu);
    x->doc = calloc(A * BT, sizeof *x->doc);
    x->visit = calloc(A * BT, sizeof *x->visit);
    x->n_seqs = calloc(A, sizeof *x->n_seqs);
    x->cap_rec = A * (size_t)x->B * 4 + 64;
    x->rec = malloc(x->cap_rec * sizeof *x->rec);
    if (!x->src || !x->cu || !x->doc || !x->visit || !x->n_seqs || !x->rec) {
        run_docs_close(x);
        return st_errf(err, ST_ERR_NOMEM, "key 'doc_signals': out of memory");
    }
    x->on = 1;
    if (!lead) return ST_OK;
    snprintf(x->path, sizeof x->path, "%s/%s", c->run_dir, ST_DATA_DOCSIG_FILE);
    uint8_t *h = malloc(DS_HDR);
    if (!h) {
        run_docs_close(x);
        return st_errf(err, ST_ERR_NOMEM, "out of memory");
    }
    st_status s = make_header(x, c, dl, n_sources, h, err);
    if (!s && resumed && access(x->path, F_OK) == 0) s = reopen(x, h, step, err);
    else if (!s && resumed && step > 0)
        s = st_errf(err, ST_ERR_INVALID, "%s: missing; the run resumes at step %llu with doc_signals on, but wrote no "
                    "records before: resume with doc_signals 0, or start the run afresh", x->path,
                    (unsigned long long)step);
    else if (!s) {
        x->f = fopen(x->path, "wb");
        if (!x->f) s = st_errf(err, ST_ERR_IO, "%s: cannot create (%s)", x->path, strerror(errno));
        else if (fwrite(h, 1, DS_HDR, x->f) != DS_HDR || fflush(x->f))
            s = st_errf(err, ST_ERR_IO, "%s: writing the header: %s", x->path, strerror(errno));
    }
    free(h);
    if (s) run_docs_close(x);
    return s;
}

void run_docs_close(run_docs *x) {
    if (x->f) fclose(x->f);
    free(x->src), free(x->cu), free(x->doc), free(x->visit), free(x->n_seqs), free(x->rec);
    run_mix *mix = x->mix;
    memset(x, 0, sizeof *x);
    x->mix = mix;
}

void run_docs_note(run_docs *x, int k, const st_data_loader *dl) {
    st_data_batch b;
    if (!x->on || k < 0 || k >= x->n_micro || !st_data_loader_last_batch(dl, &b) || b.B != x->B || b.T != x->T) return;
    const size_t BT = (size_t)x->B * x->T;
    memcpy(x->src + (size_t)k * x->B, b.source, (size_t)x->B);
    memcpy(x->cu + (size_t)k * (BT + 1), b.cu_seqlens, sizeof(int32_t) * ((size_t)b.n_seqs + 1));
    memcpy(x->doc + (size_t)k * BT, b.seg_doc, sizeof(uint64_t) * (size_t)b.n_seqs);
    memcpy(x->visit + (size_t)k * BT, b.seg_visit, sizeof(uint32_t) * (size_t)b.n_seqs);
    x->n_seqs[k] = b.n_seqs;
}

void run_docs_row_hook(void *ctx, int k, const float *losses, const int32_t *targets, size_t n) {
    run_docs *x = ctx;
    if (x->mix && x->mix->on) run_mix_row_hook(x->mix, k, losses, targets, n);
    if (!x->on || k < 0 || k >= x->n_micro || n != (size_t)x->B * x->T) return;
    const size_t BT = n;
    const int32_t *cu = x->cu + (size_t)k * (BT + 1);
    for (int i = 0; i < x->n_seqs[k]; i++) {
        uint64_t d = x->doc[(size_t)k * BT + i];
        if (d == UINT64_MAX) continue; /* a source without a document index */
        double sum = 0;
        uint32_t cnt = 0;
        for (int32_t j = cu[i]; j < cu[i + 1]; j++)
            if (targets[j] >= 0) sum += losses[j], cnt++;
        if (!cnt) continue;
        if (x->n_rec == x->cap_rec) {
            size_t cap = x->cap_rec * 2;
            st_data_docsig *r = realloc(x->rec, cap * sizeof *r);
            if (!r) continue; /* said at the step's end: records lost are counted there */
            x->rec = r, x->cap_rec = cap;
        }
        x->rec[x->n_rec++] = (st_data_docsig){.doc = d, .loss_sum = sum, .count = cnt,
                                              .visit = x->visit[(size_t)k * BT + i],
                                              .source = x->src[(size_t)k * x->B + cu[i] / x->T], .micro = (uint16_t)k};
    }
}

/* Append n records (rank 0), up to the bound. */
static st_status append(run_docs *x, const st_data_docsig *r, size_t n, st_err *err) {
    if (!x->f) return ST_OK;
    if (x->written + n > x->max_records) {
        if (!x->full_said)
            st_log(1, "doc_signals: %s holds %llu records, the bound of key doc_signals; later steps are not "
                   "recorded\n", x->path, (unsigned long long)x->written);
        x->full_said = 1;
        n = x->written < x->max_records ? (size_t)(x->max_records - x->written) : 0;
    }
    if (n && fwrite(r, sizeof *r, n, x->f) != n)
        return st_errf(err, ST_ERR_IO, "%s: appending %zu records: %s", x->path, n, strerror(errno));
    x->written += n;
    return ST_OK;
}

st_status run_docs_after_step(run_docs *x, long step, st_err *err) {
    if (!x->on) return ST_OK;
    for (size_t i = 0; i < x->n_rec; i++) x->rec[i].step = (uint64_t)step;
    st_status s = ST_OK;
    int world = x->comm ? st_comm_size(x->comm) : 1;
    if (world <= 1) {
        for (size_t i = 0; i < x->n_rec; i++) x->rec[i].micro = 0;
        s = append(x, x->rec, x->n_rec, err);
    } else {
        /* counts, then every rank's records padded to the largest; merged in sample order:
         * micro-batch k of every rank in rank order, then k + 1 */
        uint64_t mine = x->n_rec, *cnt = malloc(sizeof *cnt * (size_t)world), most = 0;
        if (!cnt) return st_errf(err, ST_ERR_NOMEM, "doc_signals: out of memory");
        s = st_comm_allgather(x->comm, &mine, sizeof mine, cnt, "doc_signals counts", err);
        for (int r = 0; !s && r < world; r++) most = cnt[r] > most ? cnt[r] : most;
        st_data_docsig *pad = NULL, *all = NULL, *out = NULL;
        if (!s) {
            pad = calloc(most ? most : 1, sizeof *pad);
            all = calloc((size_t)(most ? most : 1) * world, sizeof *all);
            out = malloc(sizeof *out * (size_t)(most ? most : 1) * world);
            if (!pad || !all || !out) s = st_errf(err, ST_ERR_NOMEM, "doc_signals: out of memory");
        }
        if (!s) {
            memcpy(pad, x->rec, sizeof *pad * x->n_rec);
            s = st_comm_allgather(x->comm, pad, sizeof *pad * (size_t)most, all, "doc_signals records", err);
        }
        if (!s && x->lead) {
            size_t n = 0;
            uint64_t *at = calloc((size_t)world, sizeof *at);
            if (!at) s = st_errf(err, ST_ERR_NOMEM, "doc_signals: out of memory");
            for (int k = 0; !s && k < x->n_micro; k++)
                for (int r = 0; r < world; r++)
                    for (; at[r] < cnt[r] && all[(size_t)r * most + at[r]].micro == k; at[r]++) {
                        out[n] = all[(size_t)r * most + at[r]];
                        out[n++].micro = 0;
                    }
            free(at);
            if (!s) s = append(x, out, n, err);
        }
        free(cnt), free(pad), free(all), free(out);
    }
    if (!s && x->f && fflush(x->f)) s = st_errf(err, ST_ERR_IO, "%s: %s", x->path, strerror(errno));
    x->n_rec = 0;
    return s;
}

/* source.c - token sources: Megatron .bin/.idx, llm.c shards, raw token files, memory.
 *
 * Opening validates every size and header field that can be checked in O(1), so a
 * source of 10^7 documents opens in about a millisecond; per-document entries are
 * checked when a document is read. The .idx is memory-mapped for those header checks,
 * but the loader's index lookups and all token bytes go through pread into small
 * buffers: documents are visited in random order, where page faults cost more than
 * syscalls, the resident set would grow with the bytes visited, and a file truncated
 * under a mapping raises SIGBUS instead of returning an error. A lookup is either one
 * document's entry (data_source_doc: two small preads) or the entries of many documents
 * sorted by index, neighbours sharing a pread (data_source_doc_runs, for a stream's
 * lookahead windows, stream.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "data/data_internal.h"

#define STAGE_BYTES (256u * 1024u)
static const char idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

const char *st_data_dtype_name(int code) {
    switch (code) {
    case ST_DATA_DTYPE_U8: return "uint8";
    case ST_DATA_DTYPE_I8: return "int8";
    case ST_DATA_DTYPE_I16: return "int16";
    case ST_DATA_DTYPE_I32: return "int32";
    case ST_DATA_DTYPE_I64: return "int64";
    case ST_DATA_DTYPE_F64: return "float64";
    case ST_DATA_DTYPE_F32: return "float32";
    case ST_DATA_DTYPE_U16: return "uint16";
    case ST_DATA_DTYPE_U32: return "uint32";
    default: return "?";
    }
}

int st_data_dtype_size(int code) {
    switch (code) {
    case ST_DATA_DTYPE_U8: case ST_DATA_DTYPE_I8: return 1;
    case ST_DATA_DTYPE_I16: case ST_DATA_DTYPE_U16: return 2;
    case ST_DATA_DTYPE_I32: case ST_DATA_DTYPE_F32: case ST_DATA_DTYPE_U32: return 4;
    case ST_DATA_DTYPE_I64: case ST_DATA_DTYPE_F64: return 8;
    default: return 0;
    }
}

static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* the .idx arrays are unaligned: never dereference a cast */
    return v;
}

/* pread for the per-batch reads, without glibc's cancellation-point bookkeeping (it
 * flips the thread's cancel state with two atomic operations around every call: 5% of
 * the producer's time in strata bench data). Nothing cancels the loader's threads. */
static ssize_t pread_hot(int fd, void *buf, size_t n, off_t off) {
#if defined(__linux__) && defined(SYS_pread64) && (defined(__x86_64__) || defined(__aarch64__))
    return syscall(SYS_pread64, fd, buf, n, off);
#else
    return pread(fd, buf, n, off);
#endif
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static st_status open_file(const char *path, int *fd, uint64_t *bytes, st_err *err) {
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return st_errf(err, ST_ERR_IO, "%s: cannot open: %s; check the path in the data source list",
                       path, strerror(errno));
    struct stat st;
    if (fstat(*fd, &st) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return st_errf(err, ST_ERR_IO, "%s: fstat failed: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) { /* opens, but its size is not tokens and every read fails */
        close(*fd);
        *fd = -1;
        return st_errf(err, ST_ERR_INVALID, "%s: is a directory, not a token file; check the path in the data source list",
                       path);
    }
    *bytes = (uint64_t)st.st_size;
    return ST_OK;
}

st_status data_source_open_megatron(st_data_source *s, const char *prefix, st_err *err) {
    snprintf(s->idx_path, sizeof s->idx_path, "%s.idx", prefix);
    snprintf(s->bin_path, sizeof s->bin_path, "%s.bin", prefix);
    int ifd;
    uint64_t isz;
    st_status rc = open_file(s->idx_path, &ifd, &isz, err);
    if (rc) return rc;
    if (isz < DATA_IDX_HEADER_BYTES) {
        close(ifd);
        return st_errf(err, ST_ERR_TRUNCATED,
                       "%s: %llu bytes, shorter than the 34-byte Megatron index header; the file is "
                       "truncated, re-run the preprocessing",
                       s->idx_path, (unsigned long long)isz);
    }
    void *m = mmap(NULL, isz, PROT_READ, MAP_SHARED, ifd, 0);
    s->idx_fd = ifd; /* kept for the per-document lookups (see data_source_doc) */
    if (m == MAP_FAILED)
        return st_errf(err, ST_ERR_IO, "%s: mmap of %llu bytes failed: %s", s->idx_path,
                       (unsigned long long)isz, strerror(errno));
    s->idx_map = m;
    s->idx_bytes = isz;
    const uint8_t *h = m;
    if (memcmp(h, idx_magic, 9) != 0)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: offset 0: magic is not \"MMIDIDX\\x00\\x00\", so this is not a Megatron "
                       "mmap index (older 'cached'/'lazy' indices are not supported); re-run "
                       "preprocess_data.py or strata data pack",
                       s->idx_path);
    uint64_t version = rd_u64(h + 9);
    if (version != 1)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: offset 9: index version %llu, only version 1 is known; re-run the "
                       "preprocessing with a matching Megatron-LM",
                       s->idx_path, (unsigned long long)version);
    s->dtype = h[17];
    s->itemsize = st_data_dtype_size(s->dtype);
    if (!s->itemsize)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: offset 17: dtype code %d is not one of Megatron's 1..8 (uint8, int8, "
                       "int16, int32, int64, float64, float32, uint16)",
                       s->idx_path, s->dtype);
    s->n_docs = rd_u64(h + 18);
    s->n_doc_idx = rd_u64(h + 26);
    if (s->n_docs > (1ull << 40) || s->n_doc_idx > (1ull << 40))
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: offset 18: sequence count %llu / document count %llu are implausible; the "
                       "header is corrupt",
                       s->idx_path, (unsigned long long)s->n_docs, (unsigned long long)s->n_doc_idx);
    uint64_t need = DATA_IDX_HEADER_BYTES + 12 * s->n_docs + 8 * s->n_doc_idx;
    if (isz < need)
        return st_errf(err, ST_ERR_TRUNCATED,
                       "%s: ends at byte %llu but its header (%llu sequences, %llu document indices) "
                       "needs %llu bytes; the index is truncated, re-run the preprocessing",
                       s->idx_path, (unsigned long long)isz, (unsigned long long)s->n_docs,
                       (unsigned long long)s->n_doc_idx, (unsigned long long)need);
    if (isz != need && isz != need + s->n_docs) /* + one int8 mode per sequence: multimodal */
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: %llu bytes, but the header's counts give %llu (or %llu with sequence "
                       "modes); trailing bytes at offset %llu",
                       s->idx_path, (unsigned long long)isz, (unsigned long long)need,
                       (unsigned long long)(need + s->n_docs), (unsigned long long)need);
    if (s->n_docs == 0)
        return st_errf(err, ST_ERR_INVALID,
                       "%s: empty source (0 sequences); remove it from the mix or re-pack it",
                       s->idx_path);
    uint64_t di_off = DATA_IDX_HEADER_BYTES + 12 * s->n_docs;
    if (s->n_doc_idx > 0) {
        uint64_t first = rd_u64(h + di_off), last = rd_u64(h + di_off + 8 * (s->n_doc_idx - 1));
        if (first != 0 || last != s->n_docs)
            return st_errf(err, ST_ERR_FORMAT,
                           "%s: offset %llu: document indices run from %llu to %llu, expected 0 to "
                           "the sequence count %llu; the index is corrupt",
                           s->idx_path, (unsigned long long)di_off, (unsigned long long)first,
                           (unsigned long long)last, (unsigned long long)s->n_docs);
    }
    /* The .bin must hold exactly what the last pointer and size say. */
    uint64_t last_ptr_off = DATA_IDX_HEADER_BYTES + 4 * s->n_docs + 8 * (s->n_docs - 1);
    uint64_t first_ptr = rd_u64(h + DATA_IDX_HEADER_BYTES + 4 * s->n_docs);
    uint64_t last_ptr = rd_u64(h + last_ptr_off);
    int32_t last_len;
    memcpy(&last_len, h + DATA_IDX_HEADER_BYTES + 4 * (s->n_docs - 1), 4);
    if (first_ptr != 0 || last_len < 0)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: offset %llu: first pointer %llu (expected 0) or last size %d is wrong; the "
                       "index is corrupt",
                       s->idx_path, (unsigned long long)(DATA_IDX_HEADER_BYTES + 4 * s->n_docs),
                       (unsigned long long)first_ptr, last_len);
    uint64_t bin_need = last_ptr + (uint64_t)last_len * s->itemsize;
    rc = open_file(s->bin_path, &s->fd, &s->bin_bytes, err);
    if (rc) return rc;
    if (s->bin_bytes < bin_need)
        return st_errf(err, ST_ERR_TRUNCATED,
                       "%s: ends at byte %llu but %s (entry at offset %llu) puts the last sequence's "
                       "end at byte %llu; the .bin is truncated or belongs to another index",
                       s->bin_path, (unsigned long long)s->bin_bytes, s->idx_path,
                       (unsigned long long)last_ptr_off, (unsigned long long)bin_need);
    if (s->bin_bytes != bin_need)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: %llu bytes but %s says its sequences end at byte %llu; the .idx disagrees "
                       "with the .bin (mismatched pair?), re-run the preprocessing",
                       s->bin_path, (unsigned long long)s->bin_bytes, s->idx_path,
                       (unsigned long long)bin_need);
    s->n_tokens = bin_need / s->itemsize;
    if (s->n_tokens == 0)
        return st_errf(err, ST_ERR_INVALID, "%s: empty source (0 tokens); remove it from the mix",
                       s->bin_path);
    return data_sidecar_read(s, prefix, err);
}

static st_status open_llmc(st_data_source *s, st_err *err) {
    int32_t hdr[256];
    st_status rc = open_file(s->bin_path, &s->fd, &s->bin_bytes, err);
    if (rc) return rc;
    if (s->bin_bytes < DATA_LLMC_HEADER_BYTES)
        return st_errf(err, ST_ERR_TRUNCATED,
                       "%s: %llu bytes, shorter than the 1024-byte llm.c shard header; truncated",
                       s->bin_path, (unsigned long long)s->bin_bytes);
    if (pread(s->fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
        return st_errf(err, ST_ERR_IO, "%s: reading the header failed: %s", s->bin_path,
                       strerror(errno));
    if (hdr[0] == DATA_LLMC_MAGIC_U16) {
        if (hdr[1] != DATA_LLMC_VERSION_U16)
            return st_errf(err, ST_ERR_FORMAT,
                           "%s: offset 4: llm.c shard version %d with the uint16 magic 20240520, "
                           "expected version 1",
                           s->bin_path, hdr[1]);
        s->dtype = ST_DATA_DTYPE_U16;
    } else if (hdr[0] == DATA_LLMC_MAGIC_U32) {
        if (hdr[1] != DATA_LLMC_VERSION_U32)
            return st_errf(err, ST_ERR_FORMAT,
                           "%s: offset 4: llm.c shard version %d with the uint32 magic 20240801, "
                           "expected version 7",
                           s->bin_path, hdr[1]);
        s->dtype = ST_DATA_DTYPE_U32;
    } else {
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: offset 0: magic %d is not an llm.c shard's (20240520 or 20240801); if "
                       "the file is headerless tokens, say so in the data list: raw16@%s (uint16) or "
                       "raw32@%s (uint32)",
                       s->bin_path, hdr[0], s->bin_path, s->bin_path);
    }
    s->itemsize = s->dtype == ST_DATA_DTYPE_U16 ? 2 : 4;
    s->data_off = DATA_LLMC_HEADER_BYTES;
    if (hdr[2] <= 0)
        return st_errf(err, hdr[2] == 0 ? ST_ERR_INVALID : ST_ERR_FORMAT,
                       "%s: offset 8: token count %d; %s", s->bin_path, hdr[2],
                       hdr[2] == 0 ? "empty source, remove it from the mix" : "the header is corrupt");
    uint64_t need = DATA_LLMC_HEADER_BYTES + (uint64_t)hdr[2] * s->itemsize;
    if (s->bin_bytes < need)
        return st_errf(err, ST_ERR_TRUNCATED,
                       "%s: ends at byte %llu but the header (offset 8) promises %d tokens ending at "
                       "byte %llu; the shard is truncated",
                       s->bin_path, (unsigned long long)s->bin_bytes, hdr[2], (unsigned long long)need);
    if (s->bin_bytes != need)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: %llu bytes but the header (offset 8) says %d tokens end at byte %llu; "
                       "trailing bytes",
                       s->bin_path, (unsigned long long)s->bin_bytes, hdr[2], (unsigned long long)need);
    s->n_tokens = (uint64_t)hdr[2];
    return ST_OK;
}

static st_status open_raw(st_data_source *s, st_err *err) {
    st_status rc = open_file(s->bin_path, &s->fd, &s->bin_bytes, err);
    if (rc) return rc;
    if (s->bin_bytes % s->itemsize)
        return st_errf(err, ST_ERR_TRUNCATED,
                       "%s: %llu bytes is not a whole number of %d-byte tokens; the file is truncated "
                       "at offset %llu, or has another token width",
                       s->bin_path, (unsigned long long)s->bin_bytes, s->itemsize,
                       (unsigned long long)(s->bin_bytes - s->bin_bytes % s->itemsize));
    s->n_tokens = s->bin_bytes / s->itemsize;
    if (!s->n_tokens)
        return st_errf(err, ST_ERR_INVALID, "%s: empty source (0 tokens); remove it from the mix",
                       s->bin_path);
    return ST_OK;
}

/* The format names of the data list ("FORMAT@PATH"), as `strata data inspect --format`
 * spells them. */
static const struct {
    const char *name;
    st_data_format format;
    int unordered;
} spec_names[] = {
    {"megatron", ST_DATA_FORMAT_MEGATRON, 0}, {"megatron-unordered", ST_DATA_FORMAT_MEGATRON, 1},
    {"llmc", ST_DATA_FORMAT_LLMC, 0},         {"raw16", ST_DATA_FORMAT_RAW_U16, 0},
    {"raw32", ST_DATA_FORMAT_RAW_U32, 0},      {"view", ST_DATA_FORMAT_VIEW, 0},
};
#define SPEC_NAMES "megatron, megatron-unordered, llmc, raw16, raw32 or view"

/* Split "FORMAT@PATH" into its format and path. A path whose text before the first '@'
 * holds a '/' or is an existing file's whole name is a plain path. */
static st_status parse_spec(const char *spec, st_data_format *fmt, int *unordered, const char **path, st_err *err) {
    *path = spec;
    const char *at = strchr(spec, '@');
    if (!at || at == spec || memchr(spec, '/', (size_t)(at - spec))) return ST_OK;
    size_t n = (size_t)(at - spec);
    for (size_t i = 0; i < sizeof spec_names / sizeof spec_names[0]; i++)
        if (strlen(spec_names[i].name) == n && !memcmp(spec, spec_names[i].name, n)) {
            *fmt = spec_names[i].format;
            *unordered = spec_names[i].unordered;
            *path = at + 1;
            return ST_OK;
        }
    if (file_exists(spec)) return ST_OK;
    return st_errf(err, ST_ERR_INVALID,
                   "data source '%s': unknown format '%.*s' before the '@'; the formats are " SPEC_NAMES
                   " (FORMAT@PATH[:WEIGHT])",
                   spec, (int)n, spec);
}

/* The first bytes of a file, as "05 00 06 00 ..." for a message. */
static void hex_bytes(const uint8_t *b, size_t n, char *out, size_t cap) {
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 4 < cap; i++) o += (size_t)snprintf(out + o, cap - o, i ? " %02x" : "%02x", b[i]);
}

/* The format of an AUTO source, from its header: a Megatron .idx beside it (PREFIX,
 * PREFIX.bin or PREFIX.idx), the llm.c magic at offset 0, or the documented .u32 name of
 * raw uint32 tokens. Anything else is refused: a headerless file cannot say whether it
 * holds uint16 or uint32 tokens, or whether a header was damaged (an llm.c shard with a
 * zeroed magic read as uint16 trains on its own header). */
static st_status detect(const char *path, char *prefix, size_t cap, st_data_format *fmt, st_err *err) {
    char idx[DATA_PATH_MAX + 8];
    snprintf(prefix, cap, "%s", path);
    size_t n = strlen(prefix);
    if (ends_with(prefix, ".idx")) {
        prefix[n - 4] = 0;
        *fmt = ST_DATA_FORMAT_MEGATRON;
        return ST_OK;
    }
    if (ends_with(prefix, ".bin")) prefix[n - 4] = 0;
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    if (file_exists(idx)) {
        *fmt = ST_DATA_FORMAT_MEGATRON;
        return ST_OK;
    }
    snprintf(prefix, cap, "%s", path);
    int fd;
    uint64_t bytes;
    st_status rc = open_file(path, &fd, &bytes, err);
    if (rc) return rc;
    uint8_t head[16];
    ssize_t r = pread(fd, head, sizeof head, 0);
    close(fd);
    if (r < 0) return st_errf(err, ST_ERR_IO, "%s: reading its first bytes failed: %s", path, strerror(errno));
    int32_t w[3] = {0, 0, 0};
    memcpy(w, head, r >= 12 ? 12 : (size_t)r);
    if (r >= 8 && !memcmp(head, ST_DATA_VIEW_MAGIC, 8)) {
        *fmt = ST_DATA_FORMAT_VIEW;
        return ST_OK;
    }
    if (r >= 4 && (w[0] == DATA_LLMC_MAGIC_U16 || w[0] == DATA_LLMC_MAGIC_U32)) {
        *fmt = ST_DATA_FORMAT_LLMC;
        return ST_OK;
    }
    if (ends_with(path, ".u32")) {
        *fmt = ST_DATA_FORMAT_RAW_U32;
        return ST_OK;
    }
    char hex[64], found[128];
    hex_bytes(head, r > 0 ? (size_t)r : 0, hex, sizeof hex);
    if (r <= 0) snprintf(found, sizeof found, "the file is empty");
    else snprintf(found, sizeof found, "offset 0 holds %s%s", hex, r == (ssize_t)sizeof head ? " ..." : " (the whole file)");
    /* A damaged llm.c magic in front of an intact header: say so. */
    int llmc_like = r >= 12 && (w[1] == DATA_LLMC_VERSION_U16 || w[1] == DATA_LLMC_VERSION_U32) && w[2] > 0 &&
                    bytes == DATA_LLMC_HEADER_BYTES + (uint64_t)w[2] * (w[1] == DATA_LLMC_VERSION_U16 ? 2u : 4u);
    return st_errf(err, ST_ERR_FORMAT,
                   "%s: cannot tell the token format: there is no Megatron index %s beside it, and %s, not an "
                   "llm.c shard's magic (int32 20240520 or 20240801)%s. Say what it is: give the format before "
                   "the path in the data list (raw16@%s for headerless uint16 tokens; or raw32@, llmc@, "
                   "megatron@), or put the matching .idx beside it",
                   path, idx, found,
                   llmc_like ? "; the words after it look like an llm.c header (version, token count), so "
                               "the magic may be damaged"
                             : "",
                   path);
}

/* A file source: the format said in the path (FORMAT@PATH) or the config, else read
 * from the header; then that format's checks. */
static st_status open_path(st_data_source *s, const st_data_source_config *cfg, st_err *err) {
    char prefix[DATA_PATH_MAX];
    const char *path = cfg->path;
    st_data_format said = ST_DATA_FORMAT_AUTO;
    st_status rc = parse_spec(cfg->path, &said, &s->unordered, &path, err);
    if (rc) return rc;
    if (said != ST_DATA_FORMAT_AUTO && s->format != ST_DATA_FORMAT_AUTO && said != s->format)
        return st_errf(err, ST_ERR_INVALID,
                       "data source '%s': the format before the '@' disagrees with the configured format %d; "
                       "give one of them", cfg->path, (int)s->format);
    if (said != ST_DATA_FORMAT_AUTO) s->format = said;
    s->unordered |= cfg->unordered;
    snprintf(s->bin_path, sizeof s->bin_path, "%s", path);
    if (s->format == ST_DATA_FORMAT_AUTO) {
        rc = detect(path, prefix, sizeof prefix, &s->format, err);
        if (rc) return rc;
    } else {
        snprintf(prefix, sizeof prefix, "%s", path);
        if (s->format == ST_DATA_FORMAT_MEGATRON && (ends_with(prefix, ".idx") || ends_with(prefix, ".bin")))
            prefix[strlen(prefix) - 4] = 0;
    }
    switch (s->format) {
    case ST_DATA_FORMAT_MEGATRON: return data_source_open_megatron(s, prefix, err);
    case ST_DATA_FORMAT_VIEW: return data_view_open(s, path, err);
    case ST_DATA_FORMAT_LLMC: return open_llmc(s, err);
    case ST_DATA_FORMAT_RAW_U16:
        s->dtype = ST_DATA_DTYPE_U16, s->itemsize = 2;
        return open_raw(s, err);
    case ST_DATA_FORMAT_RAW_U32:
        s->dtype = ST_DATA_DTYPE_U32, s->itemsize = 4;
        return open_raw(s, err);
    default: return st_errf(err, ST_ERR_INVALID, "%s: unknown data format %d", cfg->path, (int)s->format);
    }
}

st_status st_data_source_open(st_data_source **out, const st_data_source_config *cfg, st_err *err) {
    *out = NULL;
    st_data_source *s = calloc(1, sizeof *s);
    if (!s) return st_errf(err, ST_ERR_NOMEM, "data source: out of memory");
    s->fd = -1;
    s->idx_fd = -1;
    s->stage_bytes = STAGE_BYTES;
    s->stage = st_alloc(s->stage_bytes);
    if (!s->stage) {
        free(s);
        return st_errf(err, ST_ERR_NOMEM, "data source: cannot allocate the staging buffer");
    }
    st_status rc = ST_OK;
    s->format = cfg->format;
    if (s->format == ST_DATA_FORMAT_MEMORY) {
        if (!cfg->mem || !cfg->mem_tokens || (cfg->mem_itemsize != 2 && cfg->mem_itemsize != 4)) {
            rc = st_errf(err, ST_ERR_INVALID,
                         "memory data source: needs mem, mem_tokens > 0 (empty source) and "
                         "mem_itemsize 2 or 4 (got %p, %zu, %d)",
                         cfg->mem, cfg->mem_tokens, cfg->mem_itemsize);
        } else {
            s->mem = cfg->mem;
            s->n_tokens = cfg->mem_tokens;
            s->itemsize = cfg->mem_itemsize;
            s->dtype = s->itemsize == 2 ? ST_DATA_DTYPE_U16 : ST_DATA_DTYPE_U32;
            s->bin_bytes = s->n_tokens * s->itemsize;
            snprintf(s->bin_path, sizeof s->bin_path, "<memory>");
        }
    } else if (!cfg->path || !cfg->path[0]) {
        rc = st_errf(err, ST_ERR_INVALID, "data source: no path given");
    } else {
        rc = open_path(s, cfg, err);
    }
    if (rc) {
        st_data_source_close(s);
        return rc;
    }
    *out = s;
    return ST_OK;
}

void st_data_source_close(st_data_source *s) {
    if (!s) return;
    if (s->idx_map) munmap((void *)s->idx_map, s->idx_bytes);
    if (s->idx_fd >= 0) close(s->idx_fd);
    if (s->fd >= 0) close(s->fd);
    if (s->has_mask) close(s->mask_fd);
    free(s->view_docs);
    st_free(s->stage);
    free(s);
}

void st_data_source_get_info(const st_data_source *s, st_data_source_info *info) {
    info->format = s->format;
    info->dtype = s->dtype;
    info->n_docs = data_source_n_docs(s);
    info->n_tokens = s->n_tokens;
    info->bin_path = s->bin_path;
    info->sidecar_path = s->sidecar_path[0] ? s->sidecar_path : NULL;
    info->vocab_size = s->sidecar_path[0] ? s->sidecar_vocab : 0;
    info->eod = s->sidecar_path[0] ? s->sidecar_eod : -1;
}

uint64_t data_source_fingerprint(const st_data_source *s) {
    uint64_t fp = data_mix64(s->n_tokens * 0x100000001b3ull ^ data_mix64(data_source_n_docs(s) + 1) ^ (uint64_t)s->dtype);
    /* a view: also which documents, in which order (another selection of as many tokens) */
    return s->view_docs ? data_mix64(fp ^ s->view_crc) : fp;
}

/* The checks every index entry gets before it is used: sequence d says n tokens at
 * byte p of the .bin (the message names the .idx offsets of its size and pointer), and,
 * unless the source is unordered, p is where sequence d-1 ends (prev_end; 0 for d = 0):
 * Megatron writes sequences back to back, so a pointer that goes back (sequences swapped,
 * one pointing into another's bytes) or skips bytes means the index is corrupt. */
static st_status check_entry(const st_data_source *s, uint64_t d, int32_t n, uint64_t p, uint64_t prev_end, st_err *err) {
    uint64_t so = DATA_IDX_HEADER_BYTES + 4 * d, po = DATA_IDX_HEADER_BYTES + 4 * s->n_docs + 8 * d;
    if (n < 0)
        return st_errf(err, ST_ERR_FORMAT, "%s: sequence %llu (size at offset %llu) has a negative size %d; the index "
                       "is corrupt", s->idx_path, (unsigned long long)d, (unsigned long long)so, n);
    if (p % s->itemsize)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: sequence %llu (pointer at offset %llu) points at byte %llu of %s, misaligned: not a "
                       "multiple of the %d-byte %s token; the index is corrupt or its dtype is wrong",
                       s->idx_path, (unsigned long long)d, (unsigned long long)po, (unsigned long long)p, s->bin_path,
                       s->itemsize, st_data_dtype_name(s->dtype));
    if (p > s->bin_bytes || (uint64_t)n > (s->bin_bytes - p) / s->itemsize)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: sequence %llu (size at offset %llu, pointer at offset %llu) says %d tokens "
                       "at byte %llu, outside %s (%llu bytes); the .idx disagrees with the .bin",
                       s->idx_path, (unsigned long long)d, (unsigned long long)so, (unsigned long long)po, n,
                       (unsigned long long)p, s->bin_path, (unsigned long long)s->bin_bytes);
    if (!s->unordered && p != prev_end)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: sequence %llu (pointer at offset %llu) starts at byte %llu, but sequence %llu (size at "
                       "offset %llu, pointer at offset %llu) ends at byte %llu: %s. Megatron writes sequences back "
                       "to back, so the index is corrupt (re-run the preprocessing); if the sequences are meant to "
                       "be out of order, give the source as megatron-unordered@PREFIX",
                       s->idx_path, (unsigned long long)d, (unsigned long long)po, (unsigned long long)p,
                       (unsigned long long)(d - 1), (unsigned long long)(so - 4), (unsigned long long)(po - 8),
                       (unsigned long long)prev_end,
                       p < prev_end ? "it overlaps the bytes of an earlier sequence" : "it leaves a gap after it");
    return ST_OK;
}

st_status data_source_doc(st_data_source *s, uint64_t d, uint64_t *ptr, uint64_t *len, st_err *err) {
    if (!s->idx_map) return st_errf(err, ST_ERR_INVALID, "%s: has no document index", s->bin_path);
    if (s->view_docs) { /* document d of the view is document view_docs[d] of its base */
        if (d >= s->n_view)
            return st_errf(err, ST_ERR_INVALID, "%s: document %llu out of range (the view keeps %llu documents)",
                           s->view_path, (unsigned long long)d, (unsigned long long)s->n_view);
        d = s->view_docs[d];
    }
    if (d >= s->n_docs)
        return st_errf(err, ST_ERR_INVALID, "%s: document %llu out of range (%llu documents)",
                       s->idx_path, (unsigned long long)d, (unsigned long long)s->n_docs);
    uint64_t so = DATA_IDX_HEADER_BYTES + 4 * d, po = DATA_IDX_HEADER_BYTES + 4 * s->n_docs + 8 * d;
    /* The entry of d and, to check that d starts where d-1 ends, of d-1 before it. */
    const int prev = d > 0 && !s->unordered;
    int32_t n[2] = {0, 0};
    uint64_t p[2] = {0, 0};
    /* Documents are visited in random order, so every lookup through the mapping would
     * be a page fault (mapping 16 pages by fault-around, and growing the resident set
     * unless released); two small preads cost less (measured: 2.4e8 vs 1.1e8 tokens/s
     * in strata bench data) and keep nothing mapped. The loader's streams read many
     * entries at once instead (data_source_doc_runs). */
    size_t sb = prev ? 8 : 4, pb = prev ? 16 : 8;
    if (pread(s->idx_fd, n + !prev, sb, (off_t)(so - (prev ? 4 : 0))) != (ssize_t)sb ||
        pread(s->idx_fd, p + !prev, pb, (off_t)(po - (prev ? 8 : 0))) != (ssize_t)pb)
        return st_errf(err, ST_ERR_IO, "%s: reading the entry of sequence %llu at offset %llu: %s",
                       s->idx_path, (unsigned long long)d, (unsigned long long)so,
                       errno ? strerror(errno) : "short read (the file shrank after it was opened)");
    s->idx_lookups++;
    s->bytes_read += sb + pb;
    st_status rc = check_entry(s, d, n[1], p[1], p[0] + (uint64_t)(int64_t)n[0] * s->itemsize, err);
    if (rc) return rc;
    *ptr = p[1];
    *len = (uint64_t)n[1];
    return ST_OK;
}

st_status data_source_doc_entry(const st_data_source *s, uint64_t d, int32_t n, int64_t p, int64_t prev_end,
                                uint64_t *ptr, uint64_t *len, st_err *err) {
    st_status rc = check_entry(s, d, n, (uint64_t)p, (uint64_t)prev_end, err);
    if (rc) return rc;
    *ptr = (uint64_t)p;
    *len = (uint64_t)n;
    return ST_OK;
}

/* Largest hole between two wanted entries that one pread reads through rather than
 * splitting. On the 2-core VM of docs/BENCHMARKS.md a separate small pread of a random
 * index entry costs about 0.6 us, the time pread copies 2.7 KiB of page cache (4.5
 * GB/s); reading on also spares the next call its page lookup, so a page. */
#define BATCH_GAP_BYTES 4096u

st_status data_source_doc_runs(st_data_source *s, const uint64_t *keys, size_t n, size_t *i, int which,
                               int max_preads, size_t max_bytes, int32_t *len, int64_t *ptr, int64_t *prev_end,
                               st_err *err) {
    const size_t cap = s->stage_bytes;
    const unsigned elem = which ? 8 : 4;
    const uint64_t base = DATA_IDX_HEADER_BYTES + (which ? 4 * s->n_docs : 0);
    uint8_t *out = which ? (uint8_t *)ptr : (uint8_t *)len;
    if (s->unordered) prev_end = NULL; /* nothing to check against the previous sequence */
    if (!s->idx_map) return st_errf(err, ST_ERR_INVALID, "%s: has no document index", s->bin_path);
    if (s->view_docs) /* views look documents up one at a time (data_stream_set_lookahead) */
        return st_errf(err, ST_ERR_INVALID, "%s: a view has no batched index lookups", s->view_path);
    if (n && (keys[n - 1] >> DATA_KEY_POS_BITS) >= s->n_docs)
        return st_errf(err, ST_ERR_INVALID, "%s: document %llu out of range (%llu documents)", s->idx_path,
                       (unsigned long long)(keys[n - 1] >> DATA_KEY_POS_BITS), (unsigned long long)s->n_docs);
    /* With prev_end, each key's span is the entries of d-1 and d. */
#define SPAN_START(doc) (base + elem * ((doc) - (prev_end && (doc) > 0)))
    size_t done_bytes = 0;
    for (int reads = 0; *i < n && reads < max_preads && done_bytes < max_bytes; reads++) {
        size_t a = *i, b = a + 1;
        uint64_t start = SPAN_START(keys[a] >> DATA_KEY_POS_BITS);
        uint64_t end = base + elem * ((keys[a] >> DATA_KEY_POS_BITS) + 1);
        for (; b < n; b++) {
            uint64_t d = keys[b] >> DATA_KEY_POS_BITS, o = SPAN_START(d), e = base + elem * (d + 1);
            if (e - start > cap || o > end + BATCH_GAP_BYTES) break;
            if (e > end) end = e;
        }
        size_t bytes = (size_t)(end - start), got = 0;
        while (got < bytes) {
            ssize_t r = pread_hot(s->idx_fd, s->stage + got, bytes - got, (off_t)(start + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                return st_errf(err, r == 0 ? ST_ERR_TRUNCATED : ST_ERR_IO,
                               "%s: reading %zu bytes of index entries at offset %llu: %s", s->idx_path,
                               bytes - got, (unsigned long long)(start + got),
                               r == 0 ? "end of file (the file shrank after it was opened)" : strerror(errno));
            got += (size_t)r;
        }
        s->bytes_read += bytes;    /* the kernel's copy reads the page cache... */
        s->bytes_written += bytes; /* ...and writes the staging buffer */
        done_bytes += bytes;
        for (size_t k = a; k < b; k++) {
            uint64_t d = keys[k] >> DATA_KEY_POS_BITS, o = base + elem * d - start;
            size_t slot = (size_t)(keys[k] & ((1u << DATA_KEY_POS_BITS) - 1));
            memcpy(out + (size_t)elem * slot, s->stage + o, elem); /* unaligned in the file */
            if (!prev_end) continue;
            /* The size pass leaves d-1's size in prev_end[slot], the pointer pass turns
             * it into the byte where d-1 ends. */
            if (d == 0) {
                prev_end[slot] = 0;
            } else if (!which) {
                int32_t pn;
                memcpy(&pn, s->stage + o - 4, 4);
                prev_end[slot] = pn;
            } else {
                int64_t pp;
                memcpy(&pp, s->stage + o - 8, 8);
                prev_end[slot] = (int64_t)((uint64_t)pp + (uint64_t)prev_end[slot] * s->itemsize);
            }
        }
        s->bytes_read += (uint64_t)elem * (b - a) * (prev_end ? 2 : 1);    /* picked out of the buffer... */
        s->bytes_written += (uint64_t)elem * (b - a) * (prev_end ? 2 : 1); /* ...into the window */
        if (which) s->idx_lookups += b - a;
        *i = b;
    }
#undef SPAN_START
    return ST_OK;
}

st_status data_source_doc_batch(st_data_source *s, const uint64_t *keys, size_t n, int32_t *len, int64_t *ptr,
                                int64_t *prev_end, st_err *err) {
    st_status rc = ST_OK;
    for (int which = 0; which < 2 && !rc; which++)
        for (size_t i = 0; i < n && !rc;)
            rc = data_source_doc_runs(s, keys, n, &i, which, INT32_MAX, SIZE_MAX, len, ptr, prev_end, err);
    return rc;
}

st_status st_data_source_doc_len(st_data_source *s, uint64_t d, uint64_t *len, st_err *err) {
    uint64_t p;
    return data_source_doc(s, d, &p, len, err);
}

/* uint16 -> int32, returning the largest token: the common case of every batch, so
 * it is built for AVX2 too (one widening load per 8 tokens; the max taken on the
 * 16-bit values, which baseline SSE2 has no instruction for on 32-bit lanes). */
DATA_CLONES static uint16_t widen_u16(const uint16_t *restrict p, size_t n, int32_t *restrict dst) {
    uint16_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        dst[i] = p[i];
        mx = p[i] > mx ? p[i] : mx;
    }
    return mx;
}

/* One token of a Megatron dtype at b: its value in *v, or, for float dtypes (returns 1),
 * in *f. */
static int token_at(const uint8_t *b, int dtype, int64_t *v, double *f) {
    *v = 0, *f = 0;
    switch (dtype) {
    case ST_DATA_DTYPE_U8: *v = *b; return 0;
    case ST_DATA_DTYPE_I8: *v = (int8_t)*b; return 0;
    case ST_DATA_DTYPE_I16: { int16_t x; memcpy(&x, b, 2); *v = x; return 0; }
    case ST_DATA_DTYPE_U16: { uint16_t x; memcpy(&x, b, 2); *v = x; return 0; }
    case ST_DATA_DTYPE_I32: { int32_t x; memcpy(&x, b, 4); *v = x; return 0; }
    case ST_DATA_DTYPE_U32: { uint32_t x; memcpy(&x, b, 4); *v = x; return 0; }
    case ST_DATA_DTYPE_I64: { int64_t x; memcpy(&x, b, 8); *v = x; return 0; }
    case ST_DATA_DTYPE_F32: { float x; memcpy(&x, b, 4); *f = x; return 1; }
    case ST_DATA_DTYPE_F64: memcpy(f, b, 8); return 1;
    default: *v = -1; return 0;
    }
}

size_t data_convert(const void *src, int dtype, size_t n, int32_t *dst, int64_t vocab_size,
                    int64_t *bad_value) {
    /* Widen in one pass and check with a running max/min, which the compiler
     * vectorises; only on failure look for the offending token. */
    int64_t lim = vocab_size > 0 ? vocab_size : (int64_t)INT32_MAX + 1;
    size_t i;
    switch (dtype) {
    case ST_DATA_DTYPE_U16:
        if ((int64_t)widen_u16(src, n, dst) < lim) return n;
        break;
    case ST_DATA_DTYPE_U32: {
        const uint32_t *p = src;
        uint32_t mx = 0;
        for (i = 0; i < n; i++) {
            dst[i] = (int32_t)p[i];
            mx = p[i] > mx ? p[i] : mx;
        }
        if ((int64_t)mx < lim) return n;
        break;
    }
    case ST_DATA_DTYPE_I32: {
        const int32_t *p = src;
        uint32_t mx = 0; /* negative ids become large as unsigned, so one max checks both ends */
        for (i = 0; i < n; i++) {
            dst[i] = p[i];
            mx = (uint32_t)p[i] > mx ? (uint32_t)p[i] : mx;
        }
        if ((int64_t)mx < lim) return n;
        break;
    }
    default: break;
    }
    /* General path (and locating the bad token). */
    for (i = 0; i < n; i++) {
        int64_t v;
        double f;
        int is_float = token_at((const uint8_t *)src + i * (size_t)st_data_dtype_size(dtype), dtype, &v, &f);
        if (is_float) {
            /* Token ids stored as floats must be exact integers. */
            if (!(f >= 0 && f < (double)lim && f == floor(f))) {
                *bad_value = f != f ? -1 : f >= 9.2e18 ? INT64_MAX : f <= -9.2e18 ? INT64_MIN : (int64_t)f;
                return i;
            }
            v = (int64_t)f;
        }
        if (v < 0 || v >= lim) {
            *bad_value = v;
            return i;
        }
        dst[i] = (int32_t)v;
    }
    return n;
}

/* The error for the token at p (byte offset `at` of the token file) that data_convert
 * refused: a float that is not a whole number, an id past the vocabulary, or, with no
 * vocabulary given (vocab_size 0), one that no int32 token id can hold. */
static st_status bad_token(const st_data_source *s, const uint8_t *p, uint64_t at, int64_t vocab_size, st_err *err) {
    double f;
    int64_t v;
    if (token_at(p, s->dtype, &v, &f)) {
        if (!(f == floor(f)) || fabs(f) > 9.2e18) /* NaN and infinities too */
            return st_errf(err, ST_ERR_FORMAT,
                           "%s: token value %.9g at byte offset %llu is not an integer token id (the .idx says "
                           "%s, whose values must be whole numbers); the file holds something other than token "
                           "ids, or the .idx names the wrong dtype",
                           s->bin_path, f, (unsigned long long)at, st_data_dtype_name(s->dtype));
        v = (int64_t)f;
    }
    if (vocab_size > 0)
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: token %lld at byte offset %llu is outside the vocabulary [0, %lld) (vocab_size %lld); "
                       "the data was tokenized for another vocabulary, or vocab_size is too small",
                       s->bin_path, (long long)v, (unsigned long long)at, (long long)vocab_size,
                       (long long)vocab_size);
    return st_errf(err, ST_ERR_FORMAT,
                   "%s: token %lld at byte offset %llu is not a token id: ids are 0 to %d (int32); the file is "
                   "not token ids of this dtype (%s)",
                   s->bin_path, (long long)v, (unsigned long long)at, INT32_MAX, st_data_dtype_name(s->dtype));
}

st_status st_data_source_read(st_data_source *s, uint64_t d, uint64_t start, uint64_t n, int32_t *out,
                           int64_t vocab_size, st_err *err) {
    uint64_t base; /* byte offset of token `start` in the token file */
    if (s->idx_map) {
        uint64_t p = 0, len = 0;
        st_status rc = data_source_doc(s, d, &p, &len, err);
        if (rc) return rc;
        if (start + n > len)
            return st_errf(err, ST_ERR_INVALID, "%s: read of tokens [%llu, %llu) past sequence %llu's %llu",
                           s->bin_path, (unsigned long long)start, (unsigned long long)(start + n),
                           (unsigned long long)d, (unsigned long long)len);
        base = p + start * s->itemsize;
    } else {
        if (start + n > s->n_tokens)
            return st_errf(err, ST_ERR_INVALID, "%s: read of tokens [%llu, %llu) past its %llu tokens",
                           s->bin_path, (unsigned long long)start, (unsigned long long)(start + n),
                           (unsigned long long)s->n_tokens);
        base = s->data_off + start * s->itemsize;
    }
    return data_source_read_at(s, base, n, out, vocab_size, err);
}

/* The loss mask of tokens [first, first + k) (k <= the staging buffer) into the sign bit of out:
 * a token not to be trained on as a target becomes token | INT32_MIN (loader.c takes it out). */
static st_status mask_into_sign(st_data_source *s, uint64_t first, size_t k, int32_t *out, st_err *err) {
    for (size_t got = 0; got < k;) {
        ssize_t r = pread_hot(s->mask_fd, s->stage + got, k - got, (off_t)(first + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return st_errf(err, r == 0 ? ST_ERR_TRUNCATED : ST_ERR_IO, "%s: reading %zu mask bytes at offset %llu: %s",
                           s->mask_path, k - got, (unsigned long long)(first + got),
                           r == 0 ? "end of file (the file shrank after it was opened)" : strerror(errno));
        got += (size_t)r;
    }
    s->bytes_read += 2 * k;
    for (size_t j = 0; j < k; j++)
        if (!s->stage[j]) out[j] = (int32_t)((uint32_t)out[j] | 0x80000000u);
    return ST_OK;
}

st_status st_data_source_read_mask(st_data_source *s, uint64_t d, uint64_t start, uint64_t n, uint8_t *out, st_err *err) {
    if (!s->has_mask)
        return st_errf(err, ST_ERR_INVALID, "%s: has no loss mask (a sidecar naming PREFIX.mask: strata data pack "
                       "--chat)", s->bin_path);
    uint64_t p = 0, len = 0;
    st_status rc = data_source_doc(s, d, &p, &len, err);
    if (rc) return rc;
    if (start + n > len)
        return st_errf(err, ST_ERR_INVALID, "%s: mask of tokens [%llu, %llu) past sequence %llu's %llu", s->mask_path,
                       (unsigned long long)start, (unsigned long long)(start + n), (unsigned long long)d,
                       (unsigned long long)len);
    uint64_t first = p / (uint64_t)s->itemsize + start;
    for (uint64_t got = 0; got < n;) {
        ssize_t r = pread(s->mask_fd, out + got, (size_t)(n - got), (off_t)(first + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return st_errf(err, r == 0 ? ST_ERR_TRUNCATED : ST_ERR_IO, "%s: reading mask bytes at offset %llu: %s",
                           s->mask_path, (unsigned long long)(first + got),
                           r == 0 ? "end of file (the file shrank after it was opened)" : strerror(errno));
        got += (uint64_t)r;
    }
    return ST_OK;
}

st_status data_source_read_at(st_data_source *s, uint64_t base, uint64_t n, int32_t *out, int64_t vocab_size,
                              st_err *err) {
    st_status vrc = data_sidecar_check(s, vocab_size, err);
    if (vrc) return vrc;
    size_t per = s->stage_bytes / s->itemsize;
    for (uint64_t done = 0; done < n;) {
        size_t k = (size_t)(n - done < per ? n - done : per);
        size_t bytes = k * s->itemsize;
        uint64_t off = base + done * s->itemsize;
        const void *src;
        if (s->mem) {
            src = s->mem + off;
            s->bytes_read += bytes;
        } else {
            /* 4-byte tokens land straight in out and are checked in place. */
            void *dst = s->itemsize == 4 ? (void *)(out + done) : (void *)s->stage;
            size_t got = 0;
            while (got < bytes) {
                ssize_t r = pread_hot(s->fd, (uint8_t *)dst + got, bytes - got, (off_t)(off + got));
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0)
                    return st_errf(err, r == 0 ? ST_ERR_TRUNCATED : ST_ERR_IO,
                                   "%s: reading %zu bytes at offset %llu: %s", s->bin_path, bytes - got,
                                   (unsigned long long)(off + got),
                                   r == 0 ? "end of file (the file shrank after it was opened)"
                                          : strerror(errno));
                got += (size_t)r;
            }
            s->bytes_read += 2 * bytes; /* the kernel's copy reads the page cache... */
            s->bytes_written += bytes;  /* ...and writes our buffer */
            src = dst;
        }
        int64_t bad = 0;
        size_t ok = data_convert(src, s->dtype, k, out + done, vocab_size, &bad);
        s->bytes_written += 4 * k;
        if (ok != k)
            return bad_token(s, (const uint8_t *)src + ok * s->itemsize, off + ok * s->itemsize, vocab_size, err);
        if (s->has_mask && s->mask_in_sign) {
            st_status mrc = mask_into_sign(s, (off - s->data_off) / (uint64_t)s->itemsize, k, out + done, err);
            if (mrc) return mrc;
        }
        done += k;
    }
    return ST_OK;
}

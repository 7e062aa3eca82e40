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

const char *data_dtype_name(int code) {
    switch (code) {
    case DATA_DTYPE_U8: return "uint8";
    case DATA_DTYPE_I8: return "int8";
    case DATA_DTYPE_I16: return "int16";
    case DATA_DTYPE_I32: return "int32";
    case DATA_DTYPE_I64: return "int64";
    case DATA_DTYPE_F64: return "float64";
    case DATA_DTYPE_F32: return "float32";
    case DATA_DTYPE_U16: return "uint16";
    case DATA_DTYPE_U32: return "uint32";
    default: return "?";
    }
}

int data_dtype_size(int code) {
    switch (code) {
    case DATA_DTYPE_U8: case DATA_DTYPE_I8: return 1;
    case DATA_DTYPE_I16: case DATA_DTYPE_U16: return 2;
    case DATA_DTYPE_I32: case DATA_DTYPE_F32: case DATA_DTYPE_U32: return 4;
    case DATA_DTYPE_I64: case DATA_DTYPE_F64: return 8;
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
    *bytes = (uint64_t)st.st_size;
    return ST_OK;
}

static st_status open_megatron(data_source *s, const char *prefix, st_err *err) {
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
    s->itemsize = data_dtype_size(s->dtype);
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
    return ST_OK;
}

static st_status open_llmc(data_source *s, st_err *err) {
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
        s->dtype = DATA_DTYPE_U16;
    } else if (hdr[0] == DATA_LLMC_MAGIC_U32) {
        if (hdr[1] != DATA_LLMC_VERSION_U32)
            return st_errf(err, ST_ERR_FORMAT,
                           "%s: offset 4: llm.c shard version %d with the uint32 magic 20240801, "
                           "expected version 7",
                           s->bin_path, hdr[1]);
        s->dtype = DATA_DTYPE_U32;
    } else {
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: offset 0: magic %d is not an llm.c shard's (20240520 or 20240801); give "
                       "the format explicitly if this is a raw token file",
                       s->bin_path, hdr[0]);
    }
    s->itemsize = s->dtype == DATA_DTYPE_U16 ? 2 : 4;
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

static st_status open_raw(data_source *s, st_err *err) {
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

/* Decide the format of an AUTO source from names and the first bytes. */
static data_format detect(const char *path, char *prefix, size_t cap) {
    snprintf(prefix, cap, "%s", path);
    size_t n = strlen(prefix);
    if (ends_with(prefix, ".idx") || ends_with(prefix, ".bin")) {
        prefix[n - 4] = 0;
        char idx[DATA_PATH_MAX + 8];
        snprintf(idx, sizeof idx, "%s.idx", prefix);
        if (ends_with(path, ".idx") || file_exists(idx)) return DATA_FORMAT_MEGATRON;
        snprintf(prefix, cap, "%s", path);
    } else {
        char idx[DATA_PATH_MAX + 8];
        snprintf(idx, sizeof idx, "%s.idx", prefix);
        if (file_exists(idx)) return DATA_FORMAT_MEGATRON;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        int32_t magic = 0;
        ssize_t r = pread(fd, &magic, 4, 0);
        close(fd);
        if (r == 4 && (magic == DATA_LLMC_MAGIC_U16 || magic == DATA_LLMC_MAGIC_U32))
            return DATA_FORMAT_LLMC;
    }
    return ends_with(path, ".u32") ? DATA_FORMAT_RAW_U32 : DATA_FORMAT_RAW_U16;
}

st_status data_source_open(data_source **out, const data_source_config *cfg, st_err *err) {
    *out = NULL;
    data_source *s = calloc(1, sizeof *s);
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
    if (s->format == DATA_FORMAT_MEMORY) {
        if (!cfg->mem || !cfg->mem_tokens || (cfg->mem_itemsize != 2 && cfg->mem_itemsize != 4)) {
            rc = st_errf(err, ST_ERR_INVALID,
                         "memory data source: needs mem, mem_tokens > 0 (empty source) and "
                         "mem_itemsize 2 or 4 (got %p, %zu, %d)",
                         cfg->mem, cfg->mem_tokens, cfg->mem_itemsize);
        } else {
            s->mem = cfg->mem;
            s->n_tokens = cfg->mem_tokens;
            s->itemsize = cfg->mem_itemsize;
            s->dtype = s->itemsize == 2 ? DATA_DTYPE_U16 : DATA_DTYPE_U32;
            s->bin_bytes = s->n_tokens * s->itemsize;
            snprintf(s->bin_path, sizeof s->bin_path, "<memory>");
        }
    } else if (!cfg->path || !cfg->path[0]) {
        rc = st_errf(err, ST_ERR_INVALID, "data source: no path given");
    } else {
        char prefix[DATA_PATH_MAX];
        if (s->format == DATA_FORMAT_AUTO) {
            s->format = detect(cfg->path, prefix, sizeof prefix);
        } else {
            snprintf(prefix, sizeof prefix, "%s", cfg->path);
            if (s->format == DATA_FORMAT_MEGATRON && (ends_with(prefix, ".idx") || ends_with(prefix, ".bin")))
                prefix[strlen(prefix) - 4] = 0;
        }
        snprintf(s->bin_path, sizeof s->bin_path, "%s", cfg->path);
        switch (s->format) {
        case DATA_FORMAT_MEGATRON: rc = open_megatron(s, prefix, err); break;
        case DATA_FORMAT_LLMC: rc = open_llmc(s, err); break;
        case DATA_FORMAT_RAW_U16:
            s->dtype = DATA_DTYPE_U16, s->itemsize = 2;
            rc = open_raw(s, err);
            break;
        case DATA_FORMAT_RAW_U32:
            s->dtype = DATA_DTYPE_U32, s->itemsize = 4;
            rc = open_raw(s, err);
            break;
        default: rc = st_errf(err, ST_ERR_INVALID, "%s: unknown data format %d", cfg->path, (int)s->format);
        }
    }
    if (rc) {
        data_source_close(s);
        return rc;
    }
    *out = s;
    return ST_OK;
}

void data_source_close(data_source *s) {
    if (!s) return;
    if (s->idx_map) munmap((void *)s->idx_map, s->idx_bytes);
    if (s->idx_fd >= 0) close(s->idx_fd);
    if (s->fd >= 0) close(s->fd);
    st_free(s->stage);
    free(s);
}

void data_source_get_info(const data_source *s, data_source_info *info) {
    info->format = s->format;
    info->dtype = s->dtype;
    info->n_docs = s->n_docs;
    info->n_tokens = s->n_tokens;
    info->bin_path = s->bin_path;
}

uint64_t data_source_fingerprint(const data_source *s) {
    return data_mix64(s->n_tokens * 0x100000001b3ull ^ data_mix64(s->n_docs + 1) ^ (uint64_t)s->dtype);
}

/* The checks every index entry gets before it is used: sequence d says n tokens at
 * byte p of the .bin (the message names the .idx offsets of its size and pointer). */
static st_status check_entry(const data_source *s, uint64_t d, int32_t n, uint64_t p, st_err *err) {
    if (n < 0 || p % s->itemsize || p > s->bin_bytes || (uint64_t)n > (s->bin_bytes - p) / s->itemsize) {
        uint64_t so = DATA_IDX_HEADER_BYTES + 4 * d, po = DATA_IDX_HEADER_BYTES + 4 * s->n_docs + 8 * d;
        return st_errf(err, ST_ERR_FORMAT,
                       "%s: sequence %llu (size at offset %llu, pointer at offset %llu) says %d tokens "
                       "at byte %llu, outside %s (%llu bytes); the .idx disagrees with the .bin",
                       s->idx_path, (unsigned long long)d, (unsigned long long)so,
                       (unsigned long long)po, n, (unsigned long long)p, s->bin_path,
                       (unsigned long long)s->bin_bytes);
    }
    return ST_OK;
}

st_status data_source_doc(data_source *s, uint64_t d, uint64_t *ptr, uint64_t *len, st_err *err) {
    if (!s->idx_map) return st_errf(err, ST_ERR_INVALID, "%s: has no document index", s->bin_path);
    if (d >= s->n_docs)
        return st_errf(err, ST_ERR_INVALID, "%s: document %llu out of range (%llu documents)",
                       s->idx_path, (unsigned long long)d, (unsigned long long)s->n_docs);
    uint64_t so = DATA_IDX_HEADER_BYTES + 4 * d, po = DATA_IDX_HEADER_BYTES + 4 * s->n_docs + 8 * d;
    int32_t n;
    uint64_t p;
    /* Documents are visited in random order, so every lookup through the mapping would
     * be a page fault (mapping 16 pages by fault-around, and growing the resident set
     * unless released); two small preads cost less (measured: 2.4e8 vs 1.1e8 tokens/s
     * in strata bench data) and keep nothing mapped. The loader's streams read many
     * entries at once instead (data_source_doc_runs). */
    if (pread(s->idx_fd, &n, 4, (off_t)so) != 4 || pread(s->idx_fd, &p, 8, (off_t)po) != 8)
        return st_errf(err, ST_ERR_IO, "%s: reading the entry of sequence %llu at offset %llu: %s",
                       s->idx_path, (unsigned long long)d, (unsigned long long)so,
                       errno ? strerror(errno) : "short read (the file shrank after it was opened)");
    s->idx_lookups++;
    s->bytes_read += 12;
    st_status rc = check_entry(s, d, n, p, err);
    if (rc) return rc;
    *ptr = p;
    *len = (uint64_t)n;
    return ST_OK;
}

st_status data_source_doc_entry(const data_source *s, uint64_t d, int32_t n, int64_t p, uint64_t *ptr,
                                uint64_t *len, st_err *err) {
    st_status rc = check_entry(s, d, n, (uint64_t)p, err);
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

st_status data_source_doc_runs(data_source *s, const uint64_t *keys, size_t n, size_t *i, int which,
                               int max_preads, size_t max_bytes, int32_t *len, int64_t *ptr, st_err *err) {
    const size_t cap = s->stage_bytes;
    const unsigned elem = which ? 8 : 4;
    const uint64_t base = DATA_IDX_HEADER_BYTES + (which ? 4 * s->n_docs : 0);
    uint8_t *out = which ? (uint8_t *)ptr : (uint8_t *)len;
    if (!s->idx_map) return st_errf(err, ST_ERR_INVALID, "%s: has no document index", s->bin_path);
    if (n && (keys[n - 1] >> DATA_KEY_POS_BITS) >= s->n_docs)
        return st_errf(err, ST_ERR_INVALID, "%s: document %llu out of range (%llu documents)", s->idx_path,
                       (unsigned long long)(keys[n - 1] >> DATA_KEY_POS_BITS), (unsigned long long)s->n_docs);
    size_t done_bytes = 0;
    for (int reads = 0; *i < n && reads < max_preads && done_bytes < max_bytes; reads++) {
        size_t a = *i, b = a + 1;
        uint64_t start = base + elem * (keys[a] >> DATA_KEY_POS_BITS), end = start + elem;
        for (; b < n; b++) {
            uint64_t o = base + elem * (keys[b] >> DATA_KEY_POS_BITS);
            if (o + elem - start > cap || o > end + BATCH_GAP_BYTES) break;
            if (o + elem > end) end = o + elem;
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
            uint64_t o = base + elem * (keys[k] >> DATA_KEY_POS_BITS) - start;
            size_t slot = (size_t)(keys[k] & ((1u << DATA_KEY_POS_BITS) - 1));
            memcpy(out + (size_t)elem * slot, s->stage + o, elem); /* unaligned in the file */
        }
        s->bytes_read += (uint64_t)elem * (b - a);    /* picked out of the buffer... */
        s->bytes_written += (uint64_t)elem * (b - a); /* ...into the window */
        if (which) s->idx_lookups += b - a;
        *i = b;
    }
    return ST_OK;
}

st_status data_source_doc_batch(data_source *s, const uint64_t *keys, size_t n, int32_t *len, int64_t *ptr,
                                st_err *err) {
    st_status rc = ST_OK;
    for (int which = 0; which < 2 && !rc; which++)
        for (size_t i = 0; i < n && !rc;) rc = data_source_doc_runs(s, keys, n, &i, which, INT32_MAX, SIZE_MAX, len, ptr, err);
    return rc;
}

st_status data_source_doc_len(data_source *s, uint64_t d, uint64_t *len, st_err *err) {
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

size_t data_convert(const void *src, int dtype, size_t n, int32_t *dst, int64_t vocab_size,
                    int64_t *bad_value) {
    /* Widen in one pass and check with a running max/min, which the compiler
     * vectorises; only on failure look for the offending token. */
    int64_t lim = vocab_size > 0 ? vocab_size : (int64_t)INT32_MAX + 1;
    size_t i;
    switch (dtype) {
    case DATA_DTYPE_U16:
        if ((int64_t)widen_u16(src, n, dst) < lim) return n;
        break;
    case DATA_DTYPE_U32: {
        const uint32_t *p = src;
        uint32_t mx = 0;
        for (i = 0; i < n; i++) {
            dst[i] = (int32_t)p[i];
            mx = p[i] > mx ? p[i] : mx;
        }
        if ((int64_t)mx < lim) return n;
        break;
    }
    case DATA_DTYPE_I32: {
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
        double f = 0;
        int is_float = 0;
        const uint8_t *b = (const uint8_t *)src + i * (size_t)data_dtype_size(dtype);
        switch (dtype) {
        case DATA_DTYPE_U8: v = *b; break;
        case DATA_DTYPE_I8: v = (int8_t)*b; break;
        case DATA_DTYPE_I16: { int16_t x; memcpy(&x, b, 2); v = x; break; }
        case DATA_DTYPE_U16: { uint16_t x; memcpy(&x, b, 2); v = x; break; }
        case DATA_DTYPE_I32: { int32_t x; memcpy(&x, b, 4); v = x; break; }
        case DATA_DTYPE_U32: { uint32_t x; memcpy(&x, b, 4); v = x; break; }
        case DATA_DTYPE_I64: { int64_t x; memcpy(&x, b, 8); v = x; break; }
        case DATA_DTYPE_F32: { float x; memcpy(&x, b, 4); f = x; is_float = 1; v = 0; break; }
        case DATA_DTYPE_F64: { memcpy(&f, b, 8); is_float = 1; v = 0; break; }
        default: v = -1;
        }
        if (is_float) {
            /* Token ids stored as floats must be exact integers. */
            if (!(f >= 0 && f < (double)lim && f == floor(f))) {
                *bad_value = f != f ? -1 : (int64_t)f;
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

st_status data_source_read(data_source *s, uint64_t d, uint64_t start, uint64_t n, int32_t *out,
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

st_status data_source_read_at(data_source *s, uint64_t base, uint64_t n, int32_t *out, int64_t vocab_size,
                              st_err *err) {
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
        if (ok != k) {
            unsigned long long at = (unsigned long long)(off + ok * s->itemsize);
            return st_errf(err, ST_ERR_FORMAT,
                           "%s: token %lld at byte offset %llu is outside the vocabulary [0, %lld); "
                           "the data was tokenized for another vocabulary, or vocab_size is too small",
                           s->bin_path, (long long)bad, at,
                           (long long)(vocab_size > 0 ? vocab_size : (int64_t)INT32_MAX + 1));
        }
        done += k;
    }
    return ST_OK;
}

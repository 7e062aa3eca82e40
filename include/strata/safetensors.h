/* safetensors.h - read and write the safetensors format (Hugging Face).
 *
 * Layout: u64 little-endian header length H, then H bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value"}}
 * then the data; offsets are relative to the end of the header.
 *
 * The reader maps the file and validates every entry before returning: a header
 * that lies (offsets out of range, overlapping tensors, a shape that disagrees with
 * its byte length, an unknown dtype) is an error naming the file, tensor and offset.
 * The writer writes to a temporary file, fsyncs, and renames: the target is either
 * the old file or the complete new one.
 */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include "strata/core.h"
#include "strata/tensor.h"

#define ST_MAX_DIMS 8

typedef struct st_tensor_entry {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    size_t begin, end; /* byte offsets into the data section */
} st_tensor_entry;

typedef struct st_safetensors st_safetensors;

st_status st_safetensors_open(st_safetensors **out, const char *path, st_err *err);
void st_safetensors_close(st_safetensors *st);
int st_safetensors_count(const st_safetensors *st);
const st_tensor_entry *st_safetensors_entry(const st_safetensors *st, int i);
const st_tensor_entry *st_safetensors_find(const st_safetensors *st, const char *name);
const void *st_safetensors_data(const st_safetensors *st, const st_tensor_entry *e);
const char *st_safetensors_path(const st_safetensors *st);
/* The __metadata__ key under which the writer records the CRC-32C of the data section
 * (8 hex digits); the reader verifies it when present (files from elsewhere have none). */
#define ST_SAFETENSORS_CRC_KEY "strata_data_crc32c"
/* A __metadata__ value, or NULL. */
const char *st_safetensors_meta(const st_safetensors *st, const char *key);

/* Read tensor `name` into dst as f32, checking that it has exactly numel elements
 * (and, if shape != NULL, exactly that shape). Converts from F32, BF16, F16, F64. */
st_status st_safetensors_read_f32(const st_safetensors *st, const char *name, float *dst, size_t numel,
                               const int64_t *shape, int ndim, st_err *err);
/* What st_safetensors_read_f32 refuses, checked without reading: after ST_OK the read of the
 * same tensor cannot fail, so a loader that checks every tensor first never leaves a model
 * half overwritten. */
st_status st_safetensors_check_f32(const st_safetensors *st, const char *name, size_t numel, const int64_t *shape,
                                   int ndim, st_err *err);

typedef struct st_tensor_out {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* host memory, numel * dtype size bytes */
} st_tensor_out;

/* Write tensors (sorted by name in the header) and metadata pairs meta[2i] = key,
 * meta[2i+1] = value, atomically (temporary file + fsync + rename). */
st_status st_safetensors_write(const char *path, const st_tensor_out *tensors, int n, const char *const *meta,
                            int n_meta, st_err *err);

#endif

/* hf_internal.h - helpers shared by the Hugging Face directory code (hf_config.c,
 * hf_io.c, hf_inspect.c); not part of the public API. */
#ifndef STRATA_HF_INTERNAL_H
#define STRATA_HF_INTERNAL_H

#include "strata/core.h"

/* The whole of a small text file (config.json, an index), NUL-terminated, malloc'd;
 * NULL with err filled (err may be NULL) when it cannot be read or exceeds 64 MiB. */
char *hf_read_text(const char *path, st_err *err);

#endif

/* list.c - the data list of the training configuration's data and val_data keys,
 * "PATH[:WEIGHT],PATH[:WEIGHT],...": cut into a loader's sources, and checked by opening
 * them as the loader will (format, header, index, sidecar, length) before a run writes
 * anything, so that a refused list leaves no run directory behind. */
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

st_status st_data_list_parse(st_data_loader_config *cfg, char *list, const char *key, st_err *err) {
    cfg->n_sources = 0;
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (cfg->n_sources == ST_DATA_MAX_SOURCES)
            return st_errf(err, ST_ERR_INVALID, "key '%s': more than %d sources", key, ST_DATA_MAX_SOURCES);
        double w = 1.0;
        char *colon = strrchr(tok, ':');
        if (colon) {
            char *end;
            w = strtod(colon + 1, &end);
            if (end == colon + 1 || *end || !(w > 0))
                return st_errf(err, ST_ERR_INVALID, "key '%s': weight '%s' of source '%.*s' must be a positive number",
                               key, colon + 1, (int)(colon - tok), tok);
            *colon = 0;
        }
        cfg->sources[cfg->n_sources++] = (st_data_source_config){.path = tok, .weight = w};
    }
    if (!cfg->n_sources)
        return st_errf(err, ST_ERR_INVALID, "key '%s' is empty; give \"embedded\" or token files", key);
    return ST_OK;
}

st_status st_data_list_check(const char *key, const char *list, int T, int64_t vocab_size, st_err *err) {
    if (!strcmp(list, "embedded")) return ST_OK; /* the built-in corpus: nothing to read */
    char *copy = strdup(list);
    if (!copy) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    st_data_loader_config dc;
    st_data_loader_config_init(&dc);
    dc.T = T;
    dc.B = 1;         /* one row: the ring is a few KiB */
    dc.prefetch = 0;  /* no producer thread: nothing is read past the headers */
    dc.vocab_size = vocab_size;
    st_data_loader *dl = NULL;
    st_status s = st_data_list_parse(&dc, copy, key, err);
    if (!s && (s = st_data_loader_open(&dl, &dc, err))) st_err_prefix(err, "key '%s'", key);
    st_data_loader_close(dl);
    free(copy);
    return s;
}

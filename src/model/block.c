/* block.c - what every architecture's block interface shares (strata/block.h). */
#include <stdlib.h>

#include "strata/block.h"

st_status st_blocks_bind(st_blocks **out, const st_arch *a, st_backend *be, int B, int T, st_err *err) {
    *out = NULL;
    if (B < 1 || T < 1) return st_errf(err, ST_ERR_INVALID, "batch %d and seq %d must be >= 1", B, T);
    if (T > a->lay.max_seq)
        return st_errf(err, ST_ERR_INVALID, "seq %d exceeds the model's %d positions", T, a->lay.max_seq);
    st_blocks *b = calloc(1, sizeof *b);
    if (!b) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    b->arch = a;
    b->be = be;
    b->B = B;
    b->T = T;
    st_status s = a->ops->bind(b, err);
    if (s) {
        free(b);
        return s;
    }
    *out = b;
    return ST_OK;
}

void st_blocks_free(st_blocks *b) {
    if (!b) return;
    b->arch->ops->unbind(b);
    free(b);
}

st_status st_blocks_set_docs(st_blocks *b, const int32_t *positions, const int32_t *doc_start, st_err *err) {
    if (!b->arch->ops->set_docs) {
        if (!positions && !doc_start) return ST_OK;
        return st_errf(err, ST_ERR_UNSUPPORTED, "the %s blocks have no attention restricted to documents; train "
                       "with --doc_mask 0", b->arch->ops->name);
    }
    return b->arch->ops->set_docs(b, positions, doc_start, err);
}

void st_arch_free(st_arch *a) {
    if (a) a->ops->destroy(a); /* frees a too */
}

st_status st_arch_of_model(st_arch **out, const st_model *m, st_err *err) {
    *out = NULL;
    if (!m->ops->get_arch)
        return st_errf(err, ST_ERR_UNSUPPORTED, "model %s has no block interface", m->ops->arch);
    return m->ops->get_arch(m, out, err);
}

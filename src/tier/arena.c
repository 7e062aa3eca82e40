/* arena.c - the device tier's allocator: one region, a hard budget, first fit.
 *
 * Blocks are kept in an array sorted by offset (a step allocates tens of buffers, not
 * thousands, so linear scans are cheaper than any tree). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "strata/tier.h"

typedef struct block { size_t off, size; int used; } block;

struct st_arena {
    pthread_mutex_t mu;
    char *base;
    size_t bytes, used, peak;
    block *blocks;
    int n, cap;
};

st_status st_arena_create(st_arena **out, void *base, size_t bytes, st_err *err) {
    *out = NULL;
    st_arena *a = calloc(1, sizeof *a);
    if (!a) return st_errf(err, ST_ERR_NOMEM, "arena: out of memory");
    a->cap = 64;
    a->blocks = malloc(sizeof *a->blocks * (size_t)a->cap);
    if (!a->blocks) {
        free(a);
        return st_errf(err, ST_ERR_NOMEM, "arena: out of memory");
    }
    pthread_mutex_init(&a->mu, NULL);
    a->base = base;
    a->bytes = bytes & ~(size_t)(ST_ARENA_ALIGN - 1);
    a->blocks[0] = (block){0, a->bytes, 0};
    a->n = 1;
    *out = a;
    return ST_OK;
}

void st_arena_destroy(st_arena *a) {
    if (!a) return;
    pthread_mutex_destroy(&a->mu);
    free(a->blocks);
    free(a);
}

void *st_arena_alloc(st_arena *a, size_t bytes) {
    size_t need = (bytes + ST_ARENA_ALIGN - 1) & ~(size_t)(ST_ARENA_ALIGN - 1);
    if (need == 0) need = ST_ARENA_ALIGN;
    void *p = NULL;
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < a->n; i++) {
        block *b = &a->blocks[i];
        if (b->used || b->size < need) continue;
        if (b->size > need) { /* split: the remainder becomes a free block after this one */
            if (a->n == a->cap) {
                block *nb = realloc(a->blocks, sizeof *nb * (size_t)a->cap * 2);
                if (!nb) break;
                a->blocks = nb;
                a->cap *= 2;
                b = &a->blocks[i];
            }
            memmove(&a->blocks[i + 2], &a->blocks[i + 1], sizeof *b * (size_t)(a->n - i - 1));
            a->blocks[i + 1] = (block){b->off + need, b->size - need, 0};
            a->n++;
            b->size = need;
        }
        b->used = 1;
        a->used += b->size;
        if (a->used > a->peak) a->peak = a->used;
        p = a->base + b->off;
        memset(p, 0, bytes); /* like every backend allocation: zeroed */
        break;
    }
    pthread_mutex_unlock(&a->mu);
    return p;
}

void st_arena_free(st_arena *a, void *p) {
    if (!p) return;
    size_t off = (size_t)((char *)p - a->base);
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < a->n; i++) {
        if (a->blocks[i].off != off || !a->blocks[i].used) continue;
        a->blocks[i].used = 0;
        a->used -= a->blocks[i].size;
        /* coalesce with the next, then the previous free neighbour */
        if (i + 1 < a->n && !a->blocks[i + 1].used) {
            a->blocks[i].size += a->blocks[i + 1].size;
            memmove(&a->blocks[i + 1], &a->blocks[i + 2], sizeof(block) * (size_t)(a->n - i - 2));
            a->n--;
        }
        if (i > 0 && !a->blocks[i - 1].used) {
            a->blocks[i - 1].size += a->blocks[i].size;
            memmove(&a->blocks[i], &a->blocks[i + 1], sizeof(block) * (size_t)(a->n - i - 1));
            a->n--;
        }
        break;
    }
    pthread_mutex_unlock(&a->mu);
}

size_t st_arena_used(const st_arena *a) { return a->used; }
size_t st_arena_peak(const st_arena *a) { return a->peak; }
size_t st_arena_budget(const st_arena *a) { return a->bytes; }
void st_arena_reset_peak(st_arena *a) { a->peak = a->used; }

/* ------------------------------------------------------------------ budgeted backend */

typedef struct budget_backend {
    st_backend base; /* first: the ops receive &base */
    st_backend_ops ops;
    st_backend *inner;
    st_arena *arena;
    void *region;
} budget_backend;

static void *bb_alloc(st_backend *be, size_t bytes) { return st_arena_alloc(((budget_backend *)be)->arena, bytes); }
static void bb_dealloc(st_backend *be, void *p) { st_arena_free(((budget_backend *)be)->arena, p); }
static void bb_memory(st_backend *be, size_t *used, size_t *peak, size_t *capacity) {
    st_arena *a = ((budget_backend *)be)->arena;
    *used = st_arena_used(a);
    *peak = st_arena_peak(a);
    *capacity = st_arena_budget(a);
}
static void bb_free(st_backend *be) {
    budget_backend *b = (budget_backend *)be;
    st_arena_destroy(b->arena);
    b->inner->ops->dealloc(b->inner, b->region);
    free(b);
}

st_status st_backend_with_budget(st_backend **out, st_backend *inner, size_t budget, st_err *err) {
    *out = NULL;
    budget_backend *b = calloc(1, sizeof *b);
    if (!b) return st_errf(err, ST_ERR_NOMEM, "out of memory");
    b->region = inner->ops->alloc(inner, budget);
    if (!b->region) {
        free(b);
        return st_errf(err, ST_ERR_NOMEM, "cannot reserve a device budget of %zu bytes on backend %s", budget,
                       inner->ops->name);
    }
    st_status s = st_arena_create(&b->arena, b->region, budget, err);
    if (s) {
        inner->ops->dealloc(inner, b->region);
        free(b);
        return s;
    }
    b->inner = inner;
    b->ops = *inner->ops;
    b->ops.alloc = bb_alloc;
    b->ops.dealloc = bb_dealloc;
    b->ops.free = bb_free;
    b->ops.memory = bb_memory; /* the budget's figures, not the inner backend's */
    b->base.ops = &b->ops;
    b->base.ctx = inner->ctx; /* the kernels see the inner backend's context */
    *out = &b->base;
    return ST_OK;
}

st_arena *st_backend_arena(st_backend *be) {
    return be && be->ops && be->ops->alloc == bb_alloc ? ((budget_backend *)be)->arena : NULL;
}

/* loader.c - the data loader: weighted mixing of sources, per-rank slices of each
 * global batch, the batch arrays (tokens, positions, loss mask, cu_seqlens), and a
 * background producer filling a bounded ring so that the training step does not wait.
 *
 * Every rank walks the whole global batch (cheap: index lookups only for the rows of
 * other ranks) and reads tokens for its own rows, so the state it ends with is the
 * global state: identical on all ranks and valid for any world size.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"

enum { LOADER_OW_CAP = 16 };

typedef struct data_slot {
    int32_t *tokens, *positions, *cu_seqlens;
    uint8_t *mask, *source;
    uint64_t *seg_doc;                  /* [B*T] each segment's document (cu_seqlens' order) */
    uint32_t *seg_visit;                /* [B*T] its source's epoch there */
    int n_seqs, max_seqlen;
    uint64_t step, first_sample;
    uint64_t bytes_read, bytes_written; /* moved while producing this batch */
    st_data_loader_state after;            /* the loader state once this batch is consumed */
} data_slot;

struct st_data_loader {
    st_data_loader_config cfg;
    st_data_schedule_entry *schedule;
    st_data_source *src[ST_DATA_MAX_SOURCES];
    data_stream stream[ST_DATA_MAX_SOURCES];
    int32_t *starts;           /* T+1 scratch: document starts within one row */
    uint64_t *docs;            /* T+2 scratch: the row's segments' documents */
    uint32_t *visits;          /* T+2 scratch: and their epochs */
    st_data_loader_state prod;    /* producer side: the next batch to build */
    st_data_loader_state cons;    /* consumer side: after the last batch handed out */
    /* the ring: slot k % n_slots holds batch k */
    int n_slots;
    data_slot *slots;
    void *arena;
    size_t ring_bytes;
    uint64_t produced, taken, released;
    int threaded, thread_live, stop, failed;
    st_err fail;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    st_data_loader_stats stats;
    const data_slot *last;     /* the batch last handed out (st_data_loader_last_batch) */
    /* online mixing (cfg.online_mix): the weights of steps [next_step, next_step + LOADER_OW_CAP)
     * as st_data_loader_set_step_weights gives them, step q at q % LOADER_OW_CAP (under mu) */
    uint64_t next_step;        /* the step the producer builds next (under mu) */
    double ow[LOADER_OW_CAP][ST_DATA_MAX_SOURCES];
    uint64_t ow_step[LOADER_OW_CAP];
    uint8_t ow_set[LOADER_OW_CAP];
};

void st_data_loader_config_init(st_data_loader_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < ST_DATA_MAX_SOURCES; i++) cfg->sources[i].weight = 1.0;
    cfg->B = 1;
    cfg->world = 1;
    cfg->eod_token = -1;
    cfg->prefetch = 4;
}

static uint64_t ow_group(const st_data_loader *dl) {
    return dl->cfg.online_group > 1 ? (uint64_t)dl->cfg.online_group : 1;
}

static int ow_have(const st_data_loader *dl, uint64_t step) {
    int k = (int)(step % LOADER_OW_CAP);
    return dl->ow_set[k] && dl->ow_step[k] == step;
}

static const double *weights_at(const st_data_loader *dl, uint64_t step, double *base) {
    const st_data_schedule_entry *w = NULL;
    for (int i = 0; i < dl->cfg.n_schedule; i++)
        if (dl->schedule[i].start_step <= step) w = &dl->schedule[i];
    if (w) return w->weights;
    for (int i = 0; i < dl->cfg.n_sources; i++) base[i] = dl->cfg.sources[i].weight;
    return base;
}

/* The source of global sample g: a hash of (seed, g) against the cumulative weights,
 * so it depends on g and the weights only, never on the rank or on history. */
static int pick_source(const st_data_loader *dl, const double *w, uint64_t g) {
    int n = dl->cfg.n_sources;
    double total = 0;
    for (int i = 0; i < n; i++) total += w[i];
    double u = (double)(data_mix64(data_mix64(dl->cfg.seed ^ 0x6a09e667f3bcc909ull) ^ g) >> 11) *
               0x1p-53 * total;
    double cum = 0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0) continue;
        cum += w[i];
        last = i;
        if (u < cum) return i;
    }
    return last; /* rounding at the top end */
}

static void source_counters(const st_data_loader *dl, uint64_t *rd, uint64_t *wr) {
    *rd = *wr = 0;
    for (int i = 0; i < dl->cfg.n_sources; i++) {
        *rd += dl->src[i]->bytes_read;
        *wr += dl->src[i]->bytes_written;
    }
}

/* pos[t] = t - a for t in [a, b): a segment's positions (4 bytes a token, every batch). */
DATA_CLONES static void fill_positions(int32_t *pos, int a, int b) {
    for (int t = a; t < b; t++) pos[t] = t - a;
}

/* Build the next batch of this rank into slot. Runs on the producer thread only. */
static st_status produce(st_data_loader *dl, data_slot *slot, st_err *err) {
    const int T = dl->cfg.T, B = dl->cfg.B, rank = dl->cfg.rank;
    const uint64_t GB = (uint64_t)B * (uint64_t)dl->cfg.world;
    uint64_t rd0, wr0;
    source_counters(dl, &rd0, &wr0);
    double base[ST_DATA_MAX_SOURCES];
    const double *w;
    if (dl->cfg.online_mix) { /* the run's weights for this step (the producer waited for them) */
        pthread_mutex_lock(&dl->mu);
        uint64_t ws = dl->prod.step / ow_group(dl);
        int have = ow_have(dl, ws);
        if (have) memcpy(base, dl->ow[ws % LOADER_OW_CAP], sizeof base);
        pthread_mutex_unlock(&dl->mu);
        if (!have)
            return st_errf(err, ST_ERR_INVALID, "data loader: online mixing: no weights for step %llu; set them "
                           "(st_data_loader_set_step_weights) before its batch is taken",
                           (unsigned long long)ws);
        w = base;
    } else {
        w = weights_at(dl, dl->prod.step, base);
    }
    int n_seqs = 0, max_seqlen = 0;
    slot->cu_seqlens[0] = 0;
    memset(slot->mask, 1, (size_t)B * T);
    for (uint64_t i = 0; i < GB; i++) {
        uint64_t g = dl->prod.sample + i;
        int s = pick_source(dl, w, g);
        int mine = i / (uint64_t)B == (uint64_t)rank;
        int r = (int)(i - (uint64_t)rank * B);
        int32_t *row = mine ? slot->tokens + (size_t)r * (T + 1) : NULL;
        int ns = 0;
        st_status rc = data_stream_take_docs(&dl->stream[s], &dl->prod.cursor[s], row, dl->starts, &ns,
                                             mine ? dl->docs : NULL, mine ? dl->visits : NULL, err);
        if (rc) return st_err_prefix(err, "data loader, global sample %llu", (unsigned long long)g);
        if (!mine) continue;
        slot->source[r] = (uint8_t)s;
        if (dl->src[s]->has_mask) /* masked tokens come with the sign bit set (mask_into_sign) */
            for (int t = 0; t <= T; t++)
                if (row[t] < 0) {
                    row[t] &= INT32_MAX;
                    if (t > 0) slot->mask[(size_t)r * T + t - 1] = 0;
                }
        /* Segments of the row's T inputs end at each document start and at T. */
        int32_t *pos = slot->positions + (size_t)r * T;
        uint8_t *mask = slot->mask + (size_t)r * T;
        int a = 0;
        for (int k = 0; k <= ns; k++) {
            int b = k < ns ? dl->starts[k] : T;
            if (k < ns && dl->cfg.mask_eod) mask[b - 1] = 0; /* target is a new document's first token */
            if (b > T) b = T;
            if (b <= a) continue;
            fill_positions(pos, a, b);
            slot->seg_doc[n_seqs] = dl->docs[k];
            slot->seg_visit[n_seqs] = dl->visits[k];
            slot->cu_seqlens[n_seqs + 1] = r * T + b;
            n_seqs++;
            if (b - a > max_seqlen) max_seqlen = b - a;
            a = b;
        }
    }
    slot->n_seqs = n_seqs;
    slot->max_seqlen = max_seqlen;
    slot->step = dl->prod.step;
    slot->first_sample = dl->prod.sample + (uint64_t)rank * B;
    dl->prod.sample += GB;
    dl->prod.step++;
    slot->after = dl->prod;
    uint64_t rd1, wr1;
    source_counters(dl, &rd1, &wr1);
    slot->bytes_read = rd1 - rd0;
    /* the arrays this batch hands out (mask counted once: the memset and the zeros) */
    slot->bytes_written = wr1 - wr0 + (uint64_t)B * T * (4 + 1) + (uint64_t)(n_seqs + 1) * 4 + B;
    /* tokens were counted by the sources as they were written (4 bytes each) */
    return ST_OK;
}

static void *producer_main(void *arg) {
    st_data_loader *dl = arg;
    pthread_mutex_lock(&dl->mu);
    while (!dl->stop) {
        while (!dl->stop && (dl->produced - dl->released >= (uint64_t)dl->n_slots ||
                             (dl->cfg.online_mix && !ow_have(dl, dl->next_step / ow_group(dl)))))
            pthread_cond_wait(&dl->cv, &dl->mu);
        if (dl->stop) break;
        data_slot *slot = &dl->slots[dl->produced % (uint64_t)dl->n_slots];
        pthread_mutex_unlock(&dl->mu);
        st_err e = {0};
        st_status rc = produce(dl, slot, &e);
        pthread_mutex_lock(&dl->mu);
        if (rc) {
            dl->failed = 1;
            dl->fail = e;
            dl->fail.code = rc;
            pthread_cond_broadcast(&dl->cv);
            break;
        }
        dl->produced++;
        dl->next_step++;
        /* A consumer that found the ring empty is woken once two batches are ready
         * (or the ring is full, or at the first batch): it then takes them back to
         * back, and the producer pays for a wake-up (a futex system call that also
         * schedules the other thread, ~9% of its time at one wake per batch in strata
         * bench data) every other batch. */
        if (dl->produced - dl->taken >= 2 || dl->produced - dl->released >= (uint64_t)dl->n_slots ||
            dl->taken == 0)
            pthread_cond_broadcast(&dl->cv);
    }
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

static st_status start_thread(st_data_loader *dl, st_err *err) {
    dl->stop = 0;
    if (!dl->threaded) return ST_OK;
    if (pthread_create(&dl->thread, NULL, producer_main, dl) != 0)
        return st_errf(err, ST_ERR_NOMEM, "data loader: cannot start the prefetch thread");
    dl->thread_live = 1;
    return ST_OK;
}

static void stop_thread(st_data_loader *dl) {
    if (!dl->thread_live) return;
    pthread_mutex_lock(&dl->mu);
    dl->stop = 1;
    pthread_cond_broadcast(&dl->cv);
    pthread_mutex_unlock(&dl->mu);
    pthread_join(dl->thread, NULL);
    dl->thread_live = 0;
}

static st_status check_weights(const double *w, int n, const char *where, st_err *err) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (!(w[i] >= 0) || !isfinite(w[i]))
            return st_errf(err, ST_ERR_INVALID, "data loader: %s: weight of source %d is %g; weights must "
                           "be finite and >= 0", where, i, w[i]);
        total += w[i];
    }
    if (!(total > 0))
        return st_errf(err, ST_ERR_INVALID, "data loader: %s: all weights are 0; give a source a "
                       "positive weight", where);
    return ST_OK;
}

static st_status validate(const st_data_loader_config *c, st_err *err) {
    if (c->n_sources < 1 || c->n_sources > ST_DATA_MAX_SOURCES)
        return st_errf(err, ST_ERR_INVALID, "data loader: %d sources; give 1 to %d", c->n_sources,
                       ST_DATA_MAX_SOURCES);
    if (c->T < 1 || c->B < 1 || c->world < 1 || c->rank < 0 || c->rank >= c->world)
        return st_errf(err, ST_ERR_INVALID,
                       "data loader: T=%d B=%d rank=%d world=%d; need T, B, world >= 1 and 0 <= rank < "
                       "world", c->T, c->B, c->rank, c->world);
    if ((int64_t)c->B * (c->T + 1) > (1ll << 31) - 1)
        return st_errf(err, ST_ERR_INVALID, "data loader: B*(T+1) = %lld tokens exceeds the int32 "
                       "offsets of cu_seqlens", (long long)c->B * (c->T + 1));
    if (c->prefetch < 0 || c->prefetch > 1024)
        return st_errf(err, ST_ERR_INVALID, "data loader: prefetch %d; give 0 (none) to 1024", c->prefetch);
    if (c->vocab_size < 0 || c->vocab_size > (int64_t)INT32_MAX + 1)
        return st_errf(err, ST_ERR_INVALID, "data loader: vocab_size %lld out of range",
                       (long long)c->vocab_size);
    if (c->mask_eod && c->eod_token < 0) {
        /* Indexed sources know their boundaries without an id; windowed ones need it. */
    }
    double w[ST_DATA_MAX_SOURCES];
    for (int i = 0; i < c->n_sources; i++) w[i] = c->sources[i].weight;
    st_status rc = check_weights(w, c->n_sources, "sources", err);
    if (rc) return rc;
    if (c->n_schedule < 0 || (c->n_schedule > 0 && !c->schedule))
        return st_errf(err, ST_ERR_INVALID, "data loader: n_schedule %d without a schedule", c->n_schedule);
    for (int k = 0; k < c->n_schedule; k++) {
        char where[64];
        snprintf(where, sizeof where, "schedule entry %d", k);
        rc = check_weights(c->schedule[k].weights, c->n_sources, where, err);
        if (rc) return rc;
        if (k && c->schedule[k].start_step <= c->schedule[k - 1].start_step)
            return st_errf(err, ST_ERR_INVALID,
                           "data loader: schedule entry %d starts at step %llu, not after entry %d's %llu; "
                           "sort the schedule by step",
                           k, (unsigned long long)c->schedule[k].start_step, k - 1,
                           (unsigned long long)c->schedule[k - 1].start_step);
    }
    return ST_OK;
}

static void initial_state(st_data_loader *dl, st_data_loader_state *st) {
    memset(st, 0, sizeof *st);
    st->magic = ST_DATA_STATE_MAGIC;
    st->version = ST_DATA_STATE_VERSION;
    st->seed = dl->cfg.seed;
    st->schedule_version = dl->cfg.schedule_version;
    st->n_sources = (uint32_t)dl->cfg.n_sources;
    st->seq_len = (uint32_t)dl->cfg.T;
    for (int i = 0; i < dl->cfg.n_sources; i++) st->fingerprint[i] = data_source_fingerprint(dl->src[i]);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

st_status st_data_loader_open(st_data_loader **out, const st_data_loader_config *cfg, st_err *err) {
    *out = NULL;
    st_status rc = validate(cfg, err);
    if (rc) return rc;
    st_data_loader *dl = calloc(1, sizeof *dl);
    if (!dl) return st_errf(err, ST_ERR_NOMEM, "data loader: out of memory");
    dl->cfg = *cfg;
    pthread_mutex_init(&dl->mu, NULL);
    pthread_cond_init(&dl->cv, NULL);
    if (cfg->n_schedule) {
        dl->schedule = malloc(sizeof *dl->schedule * (size_t)cfg->n_schedule);
        if (!dl->schedule) { rc = st_errf(err, ST_ERR_NOMEM, "data loader: out of memory"); goto fail; }
        memcpy(dl->schedule, cfg->schedule, sizeof *dl->schedule * (size_t)cfg->n_schedule);
        dl->cfg.schedule = dl->schedule;
    }
    for (int i = 0; i < cfg->n_sources; i++) {
        rc = st_data_source_open(&dl->src[i], &cfg->sources[i], err);
        if (rc) goto fail;
        /* data packed for a larger vocabulary: refused now, not at the first read */
        if ((rc = data_sidecar_check(dl->src[i], cfg->vocab_size, err))) goto fail;
        dl->cfg.sources[i].path = NULL; /* the caller's string need not outlive open */
        dl->src[i]->mask_in_sign = 1;
        rc = data_stream_init(&dl->stream[i], dl->src[i], i, cfg->seed, cfg->T, !cfg->no_shuffle,
                              cfg->vocab_size, cfg->eod_token, err);
        if (rc) goto fail;
    }
    /* The lookahead windows of all sources together stay within DATA_LOOKAHEAD_TOTAL
     * positions, so the loader's memory is bounded however many sources it mixes. */
    int n_indexed = 0;
    for (int i = 0; i < cfg->n_sources; i++) n_indexed += !dl->stream[i].windowed;
    if (n_indexed * (uint64_t)DATA_LOOKAHEAD_DEFAULT > DATA_LOOKAHEAD_TOTAL)
        for (int i = 0; i < cfg->n_sources && !rc; i++)
            rc = data_stream_set_lookahead(&dl->stream[i], DATA_LOOKAHEAD_TOTAL / (uint32_t)n_indexed, err);
    if (rc) goto fail;
    dl->starts = malloc(sizeof *dl->starts * ((size_t)cfg->T + 2));
    dl->docs = malloc(sizeof *dl->docs * ((size_t)cfg->T + 2));
    dl->visits = malloc(sizeof *dl->visits * ((size_t)cfg->T + 2));
    if (!dl->starts || !dl->docs || !dl->visits) { rc = st_errf(err, ST_ERR_NOMEM, "data loader: out of memory"); goto fail; }
    /* The ring: prefetch slots the producer may fill plus the one the consumer holds. */
    dl->threaded = cfg->prefetch > 0;
    dl->n_slots = cfg->prefetch + 1;
    size_t B = (size_t)cfg->B, T = (size_t)cfg->T;
    size_t sz_tok = align64(B * (T + 1) * 4), sz_pos = align64(B * T * 4), sz_cu = align64((B * T + 1) * 4);
    size_t sz_mask = align64(B * T), sz_src = align64(B), sz_sd = align64(B * T * 8), sz_sv = align64(B * T * 4);
    size_t per = sz_tok + sz_pos + sz_cu + sz_mask + sz_src + sz_sd + sz_sv;
    dl->ring_bytes = per * (size_t)dl->n_slots;
    dl->arena = st_alloc(dl->ring_bytes);
    dl->slots = calloc((size_t)dl->n_slots, sizeof *dl->slots);
    if (!dl->arena || !dl->slots) {
        rc = st_errf(err, ST_ERR_NOMEM, "data loader: cannot allocate the %zu-byte prefetch ring "
                     "(%d slots of B=%zu x T+1=%zu); lower prefetch or B", dl->ring_bytes, dl->n_slots, B, T + 1);
        goto fail;
    }
    for (int k = 0; k < dl->n_slots; k++) {
        uint8_t *p = (uint8_t *)dl->arena + per * (size_t)k;
        data_slot *s = &dl->slots[k];
        s->tokens = (int32_t *)p, p += sz_tok;
        s->positions = (int32_t *)p, p += sz_pos;
        s->cu_seqlens = (int32_t *)p, p += sz_cu;
        s->mask = p, p += sz_mask;
        s->source = p, p += sz_src;
        s->seg_doc = (uint64_t *)p, p += sz_sd;
        s->seg_visit = (uint32_t *)p;
    }
    dl->stats.ring_bytes = dl->ring_bytes;
    initial_state(dl, &dl->prod);
    dl->cons = dl->prod;
    rc = start_thread(dl, err);
    if (rc) goto fail;
    *out = dl;
    return ST_OK;
fail:
    st_data_loader_close(dl);
    return rc;
}

static void batch_of(const st_data_loader *dl, const data_slot *s, st_data_batch *b) {
    b->B = dl->cfg.B;
    b->T = dl->cfg.T;
    b->tokens = s->tokens;
    b->positions = s->positions;
    b->loss_mask = s->mask;
    b->cu_seqlens = s->cu_seqlens;
    b->n_seqs = s->n_seqs;
    b->max_seqlen = s->max_seqlen;
    b->source = s->source;
    b->seg_doc = s->seg_doc;
    b->seg_visit = s->seg_visit;
    b->step = s->step;
    b->first_sample = s->first_sample;
}

int st_data_loader_last_batch(const st_data_loader *dl, st_data_batch *b) {
    if (!dl->last) return 0;
    batch_of(dl, dl->last, b);
    return 1;
}

st_status st_data_loader_source_ident(st_data_loader *dl, int i, st_data_ident *id, char *path, size_t cap,
                                      st_err *err) {
    if (i < 0 || i >= dl->cfg.n_sources)
        return st_errf(err, ST_ERR_INVALID, "data loader: source %d of %d", i, dl->cfg.n_sources);
    st_data_source *s = dl->src[i];
    if (!s->idx_map) { /* no document index: no identity of documents */
        memset(id, 0, sizeof *id);
        snprintf(path, cap, "%s", s->bin_path);
        return ST_OK;
    }
    if (s->view_docs) { /* a view: its base's identity, as checked when it was opened */
        *id = s->view_base;
        snprintf(path, cap, "%s", s->bin_path);
    } else {
        st_status rc = data_source_ident(s, id, err);
        if (rc) return rc;
    }
    size_t n = strlen(s->bin_path);
    if (n >= 4 && !strcmp(s->bin_path + n - 4, ".bin")) n -= 4;
    snprintf(path, cap, "%.*s", (int)n, s->bin_path);
    return ST_OK;
}

static void deliver(st_data_loader *dl, const data_slot *s, st_data_batch *b) {
    dl->last = s;
    batch_of(dl, s, b);
    dl->cons = s->after;
    dl->stats.batches++;
    dl->stats.tokens += (uint64_t)dl->cfg.B * dl->cfg.T;
    dl->stats.bytes_read += s->bytes_read;
    dl->stats.bytes_written += s->bytes_written;
}

st_status st_data_loader_next(st_data_loader *dl, st_data_batch *b, st_err *err) {
    if (!dl->threaded) {
        if (dl->failed) return st_errf(err, dl->fail.code, "%s", dl->fail.msg);
        st_status rc = produce(dl, &dl->slots[0], &dl->fail);
        if (!rc) {
            pthread_mutex_lock(&dl->mu);
            dl->next_step++;
            pthread_mutex_unlock(&dl->mu);
        }
        if (rc) {
            dl->failed = 1;
            dl->fail.code = rc;
            return st_errf(err, rc, "%s", dl->fail.msg);
        }
        deliver(dl, &dl->slots[0], b);
        return ST_OK;
    }
    double t0 = st_now();
    pthread_mutex_lock(&dl->mu);
    if (dl->taken > dl->released) { /* the caller is done with the previous batch */
        dl->released = dl->taken;
        pthread_cond_broadcast(&dl->cv);
    }
    while (dl->produced <= dl->taken && !dl->failed) pthread_cond_wait(&dl->cv, &dl->mu);
    if (dl->produced <= dl->taken) {
        st_status rc = st_errf(err, dl->fail.code, "%s", dl->fail.msg);
        pthread_mutex_unlock(&dl->mu);
        return rc;
    }
    const data_slot *s = &dl->slots[dl->taken % (uint64_t)dl->n_slots];
    dl->taken++;
    pthread_mutex_unlock(&dl->mu);
    dl->stats.wait_s += st_now() - t0;
    deliver(dl, s, b);
    return ST_OK;
}

void st_data_loader_get_state(const st_data_loader *dl, st_data_loader_state *st) { *st = dl->cons; }

void st_data_batch_targets(const st_data_batch *b, int32_t *inputs, int32_t *targets) {
    for (int r = 0; r < b->B; r++) {
        const int32_t *row = b->tokens + (size_t)r * (b->T + 1);
        const uint8_t *m = b->loss_mask + (size_t)r * b->T;
        for (int t = 0; t < b->T; t++) {
            inputs[(size_t)r * b->T + t] = row[t];
            targets[(size_t)r * b->T + t] = m[t] ? row[t + 1] : -1;
        }
    }
}

st_status st_data_loader_set_state(st_data_loader *dl, const st_data_loader_state *st, st_err *err) {
    if (st->magic != ST_DATA_STATE_MAGIC || st->version != ST_DATA_STATE_VERSION)
        return st_errf(err, ST_ERR_FORMAT,
                       "data loader state: magic 0x%08x version %u, expected 0x%08x version %u; the "
                       "checkpoint's data state is corrupt or from another program",
                       st->magic, st->version, ST_DATA_STATE_MAGIC, ST_DATA_STATE_VERSION);
    if (st->seed != dl->cfg.seed)
        return st_errf(err, ST_ERR_INVALID,
                       "data loader state: saved with seed %llu, this loader has seed %llu; resume with "
                       "the same seed", (unsigned long long)st->seed, (unsigned long long)dl->cfg.seed);
    if (st->n_sources != (uint32_t)dl->cfg.n_sources)
        return st_errf(err, ST_ERR_INVALID,
                       "data loader state: saved with %u sources, this loader has %d; resume with the same "
                       "source list (change the mix with weights, not by removing sources)",
                       st->n_sources, dl->cfg.n_sources);
    for (int i = 0; i < dl->cfg.n_sources; i++) {
        if (st->fingerprint[i] != data_source_fingerprint(dl->src[i]))
            return st_errf(err, ST_ERR_INVALID,
                           "data loader state: source %d (%s) is not the dataset the state was saved "
                           "with (size fingerprint differs); resume with the same files in the same order",
                           i, dl->src[i]->view_docs ? dl->src[i]->view_path : dl->src[i]->bin_path);
        if (dl->stream[i].windowed && st->seq_len != (uint32_t)dl->cfg.T)
            return st_errf(err, ST_ERR_INVALID,
                           "data loader state: saved with T=%u but T=%d now; source %d (%s) has no "
                           "document index, so its windows depend on T", st->seq_len, dl->cfg.T, i,
                           dl->src[i]->bin_path);
        if (st->cursor[i].doc >= dl->stream[i].n_units)
            return st_errf(err, ST_ERR_INVALID,
                           "data loader state: source %d cursor %llu is past its %llu units; the state is "
                           "corrupt", i, (unsigned long long)st->cursor[i].doc,
                           (unsigned long long)dl->stream[i].n_units);
    }
    if (st->schedule_version != dl->cfg.schedule_version)
        st_log(1, "data: resuming with schedule version %u (saved: %u); per-source cursors carry over, "
               "so no sample repeats or is skipped\n", dl->cfg.schedule_version, st->schedule_version);
    stop_thread(dl);
    dl->next_step = st->step;
    memset(dl->ow_set, 0, sizeof dl->ow_set);
    dl->prod = *st;
    dl->prod.schedule_version = dl->cfg.schedule_version;
    dl->prod.seq_len = (uint32_t)dl->cfg.T;
    dl->cons = dl->prod;
    dl->produced = dl->taken = dl->released = 0;
    dl->failed = 0;
    return start_thread(dl, err);
}

st_status st_data_loader_set_step_weights(st_data_loader *dl, uint64_t step, const double *w, st_err *err) {
    if (!dl->cfg.online_mix)
        return st_errf(err, ST_ERR_INVALID, "data loader: step weights are for online mixing (config online_mix)");
    char where[64];
    snprintf(where, sizeof where, "online weights of step %llu", (unsigned long long)step);
    st_status rc = check_weights(w, dl->cfg.n_sources, where, err);
    if (rc) return rc;
    pthread_mutex_lock(&dl->mu);
    /* the first weight step whose first batch is not built yet */
    uint64_t next = (dl->next_step + ow_group(dl) - 1) / ow_group(dl);
    if (step < next || step >= next + LOADER_OW_CAP) {
        pthread_mutex_unlock(&dl->mu);
        return st_errf(err, ST_ERR_INVALID, "data loader: online weights for step %llu, but the first step not yet built is "
                       "step %llu: weights are set for steps [%llu, %llu)", (unsigned long long)step,
                       (unsigned long long)next, (unsigned long long)next, (unsigned long long)(next + LOADER_OW_CAP));
    }
    int k = (int)(step % LOADER_OW_CAP);
    memcpy(dl->ow[k], w, sizeof(double) * (size_t)dl->cfg.n_sources);
    dl->ow_step[k] = step;
    dl->ow_set[k] = 1;
    pthread_cond_broadcast(&dl->cv);
    pthread_mutex_unlock(&dl->mu);
    return ST_OK;
}

void st_data_loader_get_stats(const st_data_loader *dl, st_data_loader_stats *s) { *s = dl->stats; }

void st_data_loader_close(st_data_loader *dl) {
    if (!dl) return;
    stop_thread(dl);
    for (int i = 0; i < dl->cfg.n_sources; i++) {
        data_stream_free(&dl->stream[i]);
        st_data_source_close(dl->src[i]);
    }
    st_free(dl->arena);
    free(dl->slots);
    free(dl->starts);
    free(dl->docs);
    free(dl->visits);
    free(dl->schedule);
    pthread_mutex_destroy(&dl->mu);
    pthread_cond_destroy(&dl->cv);
    free(dl);
}

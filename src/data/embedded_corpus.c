/* embedded_corpus.c - the default training text, generated deterministically.
 *
 * strata train with no arguments needs data that ships with the program under no
 * licence question and shows a model learning within two minutes on two cores. This
 * is a small stochastic grammar of English-like sentences (subject-verb agreement,
 * adjectives, prepositional phrases, quoted speech) plus short arithmetic facts that
 * are true, so there is structure at several scales for the model to find.
 */
#include <stdio.h>
#include <string.h>

#include "strata/core.h"
#include "strata/data.h"

static const char *nouns_s[] = {"cat", "dog", "bird", "child", "farmer", "teacher", "river", "storm", "king",
                                "queen", "robot", "sailor", "painter", "wolf", "fox", "engineer", "garden",
                                "village", "machine", "student"};
static const char *nouns_p[] = {"cats", "dogs", "birds", "children", "farmers", "teachers", "rivers", "storms",
                                "kings", "queens", "robots", "sailors", "painters", "wolves", "foxes", "engineers",
                                "gardens", "villages", "machines", "students"};
static const char *verbs_s[] = {"sees", "finds", "follows", "helps", "watches", "builds", "paints", "carries",
                                "remembers", "greets"};
static const char *verbs_p[] = {"see", "find", "follow", "help", "watch", "build", "paint", "carry",
                                "remember", "greet"};
static const char *adjs[] = {"quick", "lazy", "old", "young", "bright", "quiet", "small", "large", "clever",
                             "brave", "tired", "happy"};
static const char *preps[] = {"near", "behind", "under", "beside", "across", "above"};
static const char *dets[] = {"the", "a", "every", "that"};
static const char *says[] = {"says", "whispers", "shouts", "writes"};
static const char *words[] = {"hello", "goodbye", "the sea is calm", "we build machines", "tomorrow it rains",
                              "numbers never lie"};

#define PICK(arr) arr[st_rng_u64(r) % (sizeof arr / sizeof arr[0])]

typedef struct sink { uint8_t *buf; size_t cap, len; } sink;

static void put(sink *s, const char *text) {
    size_t n = strlen(text);
    if (s->len + n > s->cap) n = s->cap - s->len;
    memcpy(s->buf + s->len, text, n);
    s->len += n;
}

static void noun_phrase(sink *s, st_rng *r, int plural) {
    if (plural) put(s, st_rng_u64(r) % 2 ? "the " : "some ");
    else { put(s, PICK(dets)); put(s, " "); }
    if (st_rng_u64(r) % 2) { put(s, PICK(adjs)); put(s, " "); }
    unsigned i = (unsigned)(st_rng_u64(r) % (sizeof nouns_s / sizeof nouns_s[0]));
    put(s, plural ? nouns_p[i] : nouns_s[i]);
}

static void sentence(sink *s, st_rng *r) {
    unsigned kind = (unsigned)(st_rng_u64(r) % 10);
    char tmp[64];
    if (kind < 2) { /* arithmetic facts */
        int a = (int)(st_rng_u64(r) % 50), b = (int)(st_rng_u64(r) % 50);
        if (kind == 0) snprintf(tmp, sizeof tmp, "%d plus %d is %d. ", a, b, a + b);
        else snprintf(tmp, sizeof tmp, "%d minus %d is %d. ", a + b, b, a);
        put(s, tmp);
        return;
    }
    int plural = (int)(st_rng_u64(r) % 2);
    char first[256];
    sink fs = {(uint8_t *)first, sizeof first - 1, 0};
    noun_phrase(&fs, r, plural);
    first[fs.len] = 0;
    first[0] = (char)(first[0] - 'a' + 'A'); /* capitalise */
    put(s, first);
    put(s, " ");
    if (kind == 9) { /* quoted speech */
        put(s, plural ? "say" : PICK(says));
        put(s, " \"");
        put(s, PICK(words));
        put(s, ".\" ");
        return;
    }
    unsigned v = (unsigned)(st_rng_u64(r) % (sizeof verbs_s / sizeof verbs_s[0]));
    put(s, plural ? verbs_p[v] : verbs_s[v]);
    put(s, " ");
    noun_phrase(s, r, (int)(st_rng_u64(r) % 2));
    if (st_rng_u64(r) % 3 == 0) {
        put(s, " ");
        put(s, PICK(preps));
        put(s, " ");
        noun_phrase(s, r, (int)(st_rng_u64(r) % 2));
    }
    put(s, st_rng_u64(r) % 8 == 0 ? ".\n" : ". ");
}

size_t st_data_embedded_generate(uint8_t *buf, size_t cap, uint64_t seed) {
    st_rng rng;
    st_rng_seed(&rng, seed);
    sink s = {buf, cap, 0};
    while (s.len + 256 < cap) sentence(&s, &rng);
    return s.len;
}

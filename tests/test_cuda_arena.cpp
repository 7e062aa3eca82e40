/* test_cuda_arena.cpp - the CUDA backend's arena allocator (src/backend/cuda/cuda_arena.h),
 * host logic only: blocks are aligned, inside the budget and never overlap; a freed block
 * is reused by first fit; freed neighbours merge, so after every block is freed the whole
 * budget is one free range again; what does not fit fails. 2000 random allocations and
 * frees are checked against a plain list of the live blocks. */
#include <vector>

#include "backend/cuda/cuda_arena.h"

extern "C" {
#include "strata/core.h"
#include "testutil.h"
}

struct Live {
    size_t off, bytes;
};

static int consistent(const CuArena &a, const std::vector<Live> &live) {
    size_t sum = 0;
    for (size_t i = 0; i < live.size(); i++) {
        const Live &l = live[i];
        if (l.off % CuArena::ALIGN || l.off + l.bytes > a.cap) return 0;
        for (size_t j = i + 1; j < live.size(); j++)
            if (l.off < live[j].off + live[j].bytes && live[j].off < l.off + l.bytes) return 0; /* overlap */
    }
    for (auto &t : a.taken) sum += t.second;
    size_t free_sum = 0;
    for (auto &f : a.free_) free_sum += f.second;
    return sum == a.used && sum + free_sum == a.cap && a.taken.size() == live.size();
}

int main(void) {
    CuArena a(1 << 20);
    size_t o1, o2, o3, o4;
    CHECK(a.alloc(1000, &o1) && a.alloc(5000, &o2) && a.alloc(100, &o3), "three small blocks fit");
    CHECK(o1 == 0 && o2 == 1024 && o3 == 1024 + 5120, "first fit from 0, 256-aligned: %zu %zu %zu", o1, o2, o3);
    CHECK(a.release(o2) && !a.release(o2) && !a.release(12345), "a block is freed once; unknown offsets refused");
    CHECK(a.alloc(4000, &o4) && o4 == o2, "a freed hole is reused first: %zu (hole at %zu)", o4, o2);
    size_t big;
    CHECK(!a.alloc((1 << 20), &big), "more than what is left does not fit");
    CHECK(a.release(o1) && a.release(o3) && a.release(o4), "free all");
    CHECK(a.free_.size() == 1 && a.free_.begin()->second == a.cap && a.used == 0, "all merged into one range: %zu",
          a.free_.size());
    CHECK(a.alloc(1 << 20, &big) && big == 0, "the whole budget in one block once all is free");
    a.release(big);
    CHECK(a.peak == (1 << 20), "peak %zu", a.peak);

    /* random traffic */
    st_rng rng;
    st_rng_seed(&rng, 15);
    std::vector<Live> live;
    int bad = 0, fails = 0;
    for (int step = 0; step < 2000; step++) {
        if (!live.empty() && st_rng_u64(&rng) % 5 < 2) {
            size_t k = st_rng_u64(&rng) % live.size();
            bad += !a.release(live[k].off);
            live.erase(live.begin() + (long)k);
        } else {
            size_t bytes = st_rng_u64(&rng) % 40000, off;
            if (a.alloc(bytes, &off)) live.push_back({off, bytes});
            else fails++;
        }
        if (!consistent(a, live)) {
            bad++;
            break;
        }
    }
    CHECK(bad == 0, "random traffic: arena inconsistent with the live blocks (%d)", bad);
    for (auto &l : live) a.release(l.off);
    CHECK(a.free_.size() == 1 && a.used == 0, "after random traffic, all freed: %zu free ranges", a.free_.size());
    printf("random traffic: 2000 steps, %d allocations did not fit, peak %zu of %zu bytes\n", fails, a.peak, a.cap);
    return test_finish("test_cuda_arena");
}

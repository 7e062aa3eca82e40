/* cuda_arena.h - the CUDA backend's device arena, as offsets: one cudaMalloc of the hard
 * budget the executor plans against, carved here by first fit into 256-byte aligned
 * blocks, freed blocks merged with their free neighbours. Host-only C++ (no CUDA), so
 * that test_cuda_arena checks it on any machine; backend_cuda.cu adds the offsets to
 * the arena's base pointer. Never grows: an allocation that does not fit fails, and
 * the caller reports the budget. */
#ifndef STRATA_CUDA_ARENA_H
#define STRATA_CUDA_ARENA_H

#include <stddef.h>

#include <iterator>
#include <map>

struct CuArena {
    static constexpr size_t ALIGN = 256; /* cudaMalloc's own alignment */
    size_t cap = 0, used = 0, peak = 0;  /* bytes */
    std::map<size_t, size_t> free_;      /* offset -> bytes, no two adjacent */
    std::map<size_t, size_t> taken;      /* offset -> bytes */

    explicit CuArena(size_t bytes = 0) { reset(bytes); }
    void reset(size_t bytes) {
        cap = bytes / ALIGN * ALIGN, used = peak = 0;
        free_.clear(), taken.clear();
        if (cap) free_[0] = cap;
    }
    /* the offset of a new block of at least `bytes` (0 bytes take ALIGN); false if none fits */
    bool alloc(size_t bytes, size_t *off) {
        size_t n = bytes ? (bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN;
        if (n < bytes) return false; /* overflow */
        for (auto it = free_.begin(); it != free_.end(); ++it)
            if (it->second >= n) {
                size_t o = it->first, rest = it->second - n;
                free_.erase(it);
                if (rest) free_[o + n] = rest;
                taken[o] = n;
                used += n;
                peak = used > peak ? used : peak;
                *off = o;
                return true;
            }
        return false;
    }
    /* gives back the block at `off`; false if no block starts there */
    bool release(size_t off) {
        auto t = taken.find(off);
        if (t == taken.end()) return false;
        size_t n = t->second;
        taken.erase(t);
        used -= n;
        auto next = free_.lower_bound(off);
        if (next != free_.end() && next->first == off + n) n += next->second, next = free_.erase(next);
        if (next != free_.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == off) {
                prev->second += n;
                return true;
            }
        }
        free_[off] = n;
        return true;
    }
};

#endif

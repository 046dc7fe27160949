// Decoupled look-back state between the blocks of one launch (a single-pass scan across
// blocks): each tile publishes its aggregate, then its inclusive prefix, and later tiles
// walk back over them.
#pragma once

#include "types.cuh"

namespace normscan {

// A value is its own flag: the workspace starts all ones (a NaN that no published value
// has: NaNs are published as the canonical NaN), so one load, single-copy atomic for each
// value, both tests and reads it (a separate flag would put a second dependent round trip
// to L2 on every step of the look-back).
__device__ __forceinline__ bool unpublished(double v) { return __double_as_longlong(v) == -1ll; }
__device__ __forceinline__ bool unpublished(float v) { return __float_as_uint(v) == 0xffffffffu; }
// A tile's inclusive prefix and aggregate, side by side, in one load.
__device__ __forceinline__ void load_published(const double* p, double* inclusive, double* aggregate) {
  unsigned long long i, g;
  asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(i), "=l"(g) : "l"(p) : "memory");
  *inclusive = __longlong_as_double(static_cast<long long>(i));
  *aggregate = __longlong_as_double(static_cast<long long>(g));
}
__device__ __forceinline__ void load_published(const float* p, float* inclusive, float* aggregate) {
  unsigned i, g;
  asm volatile("ld.relaxed.gpu.global.v2.b32 {%0, %1}, [%2];" : "=r"(i), "=r"(g) : "l"(p) : "memory");
  *inclusive = __uint_as_float(i);
  *aggregate = __uint_as_float(g);
}
__device__ __forceinline__ void publish(double* p, double v) {
  if (v != v) v = __longlong_as_double(0x7ff8000000000000ll);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(__double_as_longlong(v)) : "memory");
}
__device__ __forceinline__ void publish(float* p, float v) {
  if (v != v) v = __uint_as_float(0x7fc00000u);
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(__float_as_uint(v)) : "memory");
}

// Look-back state, one entry of ENTRY bytes per tile: its inclusive prefix, then its
// aggregate, read in one load (entries are spaced out: tiles sharing a line slow each
// other; scan/tuning.cuh has the measurement). At launch every bit of it is one (one
// memset): nothing is published, and the ticket counter holds 2**64 - 1, so that the first
// ticket taken wraps to 0.
template <typename A, int64_t ENTRY> struct LookbackState {
  static constexpr int64_t kEntry = ENTRY;
  static_assert(kEntry % (2 * sizeof(A)) == 0, "an entry holds a pair, aligned for one load");
  static constexpr int64_t kHeader = kEntry > 16 ? kEntry : 16;  // the ticket's own room
  A* entries;
  unsigned long long* ticket;  // hands out tiles in launch order, so predecessors always run
  __device__ __forceinline__ int64_t take_ticket() const { return static_cast<int64_t>(atomicAdd(ticket, 1ull) + 1ull); }
  __device__ __forceinline__ A* inclusive(int64_t tile) const { return entries + tile * (kEntry / sizeof(A)); }
  __device__ __forceinline__ A* aggregate(int64_t tile) const { return inclusive(tile) + 1; }

  static constexpr int64_t bytes(int64_t tiles) { return kHeader + tiles * kEntry; }
  static LookbackState in(void* workspace, int64_t tiles) {
    auto* base = static_cast<char*>(workspace);
    LookbackState st;
    st.ticket = reinterpret_cast<unsigned long long*>(base);
    st.entries = reinterpret_cast<A*>(base + kHeader);
    return st;
  }
};

// The same for tiles of `columns` scans side by side (slab scans): an entry a column, a
// tile's entries adjacent, tiles ENTRY-aligned apart.
template <typename A, int64_t ENTRY> struct ColumnLookbackState : LookbackState<A, ENTRY> {
  using Base = LookbackState<A, ENTRY>;
  int64_t stride;  // elements of A from one tile's entries to the next's
  __device__ __forceinline__ A* inclusive(int64_t tile, int c) const { return this->entries + tile * stride + 2 * c; }
  __device__ __forceinline__ A* aggregate(int64_t tile, int c) const { return inclusive(tile, c) + 1; }

  static int64_t tile_bytes(int64_t columns) { return ceil_div(columns * 2 * int64_t(sizeof(A)), ENTRY) * ENTRY; }
  static int64_t bytes(int64_t tiles, int64_t columns) { return Base::kHeader + tiles * tile_bytes(columns); }
  static ColumnLookbackState in(void* workspace, int64_t columns) {
    ColumnLookbackState st;
    static_cast<Base&>(st) = Base::in(workspace, 0);
    st.stride = tile_bytes(columns) / static_cast<int64_t>(sizeof(A));
    return st;
  }
};

}  // namespace normscan

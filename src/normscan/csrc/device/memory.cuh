// Global memory access: 16-byte vector loads and stores (optionally under an L2 cache
// policy), and a row split into an unaligned head, whole vectors and a tail.
#pragma once

#include "types.cuh"

namespace normscan {

// 16-byte loads and stores; L2_LAST puts them under an L2 evict_last policy (sm_80+), so
// that L2 keeps their lines ahead of lines accessed without one.
__device__ __forceinline__ uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
template <typename T, int N, bool L2_LAST = false>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  if constexpr (L2_LAST) {
    static_assert(sizeof(T) * N == 16, "16-byte vectors");
    uint4 r;
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(l2_evict_last_policy()));
    return *reinterpret_cast<const Vec<T, N>*>(&r);
  } else {
    return *reinterpret_cast<const Vec<T, N>*>(p);
  }
}
template <typename T, int N, bool L2_LAST = false>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  if constexpr (L2_LAST) {
    static_assert(sizeof(T) * N == 16, "16-byte vectors");
    const uint4 r = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(r.x), "r"(r.y),
                 "r"(r.z), "r"(r.w), "l"(l2_evict_last_policy())
                 : "memory");
  } else {
    *reinterpret_cast<Vec<T, N>*>(p) = v;
  }
}

// One 16-byte store of a 16-byte vector whatever built it (other vectors as store_vec does):
// a Vec whose elements were computed or permuted apart was stored in 2-, 4- and 8-byte
// pieces (a reverse scan's flip, the row scans' and the held and channel rows' scaling;
// nvcc 13.0's PTX, docs/design-notes.md "Vectors stored whole"). L2_LAST as store_vec's (one store too).
template <typename T, int N, bool L2_LAST = false>
__device__ __forceinline__ void store_vec_whole(T* p, const Vec<T, N>& v) {
  if constexpr (L2_LAST) {
    store_vec<T, N, true>(p, v);
  } else if constexpr (sizeof(T) * N == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w) : "memory");
  } else {
    store_vec<T, N>(p, v);
  }
}

// A value another block of this launch wrote, read from L2 (an L1 line may hold an older
// copy: its neighbours were read before it was written), word by word.
template <typename S> __device__ __forceinline__ S load_from_l2(const S* p) {
  static_assert(sizeof(S) % 4 == 0, "whole words");
  S s;
  auto* out = reinterpret_cast<unsigned*>(&s);
  const auto* in = reinterpret_cast<const unsigned*>(p);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(S) / 4); ++i) out[i] = __ldcg(in + i);
  return s;
}

// A counter as another block publishes it (add_release): what this thread reads after it
// sees the value is what the publisher wrote before.
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Adds v to a counter after this thread's earlier writes are visible to the GPU (a release:
// a lighter fence than __threadfence's sequentially consistent one).
__device__ __forceinline__ void add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A row of n elements split into an unaligned head, whole N-element vectors, and a tail.
// With N == 1 everything is "body" and head == tail == 0.
struct RowSplit {
  int64_t head;  // elements before the first aligned vector
  int64_t nvec;  // whole vectors
  int64_t tail;  // elements after the last vector
};

template <typename T, int N>
__device__ __forceinline__ RowSplit split_row(const T* p, int64_t n) {
  RowSplit s;
  if (N == 1) {
    s.head = 0;
    s.nvec = n;
    s.tail = 0;
    return s;
  }
  const auto addr = reinterpret_cast<uintptr_t>(p);
  int64_t head = static_cast<int64_t>(((sizeof(T) * N) - (addr % (sizeof(T) * N))) % (sizeof(T) * N) / sizeof(T));
  if (head > n) head = n;
  s.head = head;
  s.nvec = (n - head) / N;
  s.tail = n - head - s.nvec * N;
  return s;
}

}  // namespace normscan

// Asynchronous copies into shared memory, and arrive/wait barriers (sm_80+).
#pragma once

#include "types.cuh"

namespace normscan {

// 16-byte global -> shared copies that land while the thread does other work. A thread
// waits only for its own copies, so data a thread copies and later reads itself needs no
// barrier.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
// The same for 4, 8 or 16 bytes aligned to their size: a part of a sector (through L1) or,
// 16 bytes, as cp_async16.
template <int N> __device__ __forceinline__ void cp_async_bytes(void* smem, const void* gmem) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (N == 16) {
    cp_async16(smem, gmem);
  } else {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(gmem), "n"(N) : "memory");
  }
}
// One element into shared memory: by cp.async where it takes the element (4 or 8 bytes),
// else through a register (the thread waits for it here).
template <typename T> __device__ __forceinline__ void copy_element(T* smem, const T* gmem) {
  if constexpr (sizeof(T) >= 4) cp_async_bytes<sizeof(T)>(smem, gmem);
  else *smem = *gmem;
}
// Commits this thread's copies issued so far and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}
// A pipeline of copies: commit closes a group of this thread's copies (an empty one too);
// wait_groups<N> returns once at most N of its groups are still landing.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait_groups() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Programmatic dependent launch (sm_90; nothing before it): allow_next_grid() lets a kernel
// launched `early` after this one (launch_config) start its blocks now, beside this one's;
// wait_for_prior_grid(), in that kernel, returns once the kernel before it has ended and its
// writes are visible.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A shared-memory barrier (mbarrier) that a subset of the block's threads arrive on and
// any thread may wait for, while the rest of the block goes on: a phase completes when
// `count` arrivals are in. Arriving releases this thread's earlier shared-memory writes to
// whoever waits for the phase.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(s), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared.b64 state, [%0];\n\t}" ::"r"(s) : "memory");
}
// Waits until the phase of the given parity (0 for the first, then 1, 0, ...) completes:
// PROBE (a test_wait or try_wait of bar, parity) until it says so. sm_90's try_wait lets the
// thread sleep a while inside each probe (faster than test_wait on the look-back scan:
// docs/design-notes.md, "Cluster exchanges").
#define NORMSCAN_MBARRIER_SPIN(PROBE)                                                       \
  asm volatile("{\n\t.reg .pred done;\n"                                                  \
               "WAIT:\n\t" PROBE " done, [%0], %1;\n\t"                                    \
               "@!done bra WAIT;\n\t}" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))), \
               "r"(parity)                                                                 \
               : "memory")
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
  NORMSCAN_MBARRIER_SPIN("mbarrier.try_wait.parity.shared.b64");
#else
  NORMSCAN_MBARRIER_SPIN("mbarrier.test_wait.parity.shared.b64");
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The same barriers across a thread-block cluster (sm_90): any block of the cluster may store
// into a block's shared memory and complete those bytes on its barrier (st_async). A barrier
// must be initialised, and the init fenced, before another block can see it (a cluster
// barrier between).
__device__ __forceinline__ void mbarrier_init_fence_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives on this block's `bar`, counting `bytes` more to come by st_async before the phase
// completes (they may land before it: the count then goes below zero meanwhile).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(s), "r"(bytes) : "memory");
}
// Words I.. of w into the shared::cluster address `to`, completed on the barrier at `at`: 16,
// 8 or 4 bytes a store (each address aligned to its store's size).
template <int I, int W> __device__ __forceinline__ void st_async_words(unsigned to, unsigned at, const unsigned (&w)[W]) {
  if constexpr (W - I >= 4) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                     to + 4 * I),
                 "r"(w[I]), "r"(w[I + 1]), "r"(w[I + 2]), "r"(w[I + 3]), "r"(at)
                 : "memory");
    st_async_words<I + 4>(to, at, w);
  } else if constexpr (W - I >= 2) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(to + 4 * I),
                 "r"(w[I]), "r"(w[I + 1]), "r"(at)
                 : "memory");
    st_async_words<I + 2>(to, at, w);
  } else if constexpr (W - I == 1) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(to + 4 * I),
                 "r"(w[I]), "r"(at)
                 : "memory");
  }
}
// Stores `v` into `slot` of the block of rank `rank` (slot and bar: this block's addresses of
// them; slot aligned to 16 bytes or to v's size) and completes its bytes on that block's
// `bar`: the barrier's phase makes the store visible to whoever waits there, and the store
// waits on none of this thread's earlier ones (an arrival that released them waited for its
// stores to global memory to land: docs/design-notes.md "Cluster exchanges").
template <typename A> __device__ __forceinline__ void st_async(A* slot, uint64_t* bar, int rank, const A& v) {
  static_assert(sizeof(A) % 4 == 0, "whole 4-byte words");
  unsigned words[sizeof(A) / 4];
  __builtin_memcpy(words, &v, sizeof(A));
  unsigned to, at;  // (mapa has no side effects: a loop's barrier address is mapped once)
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(to) : "r"(static_cast<unsigned>(__cvta_generic_to_shared(slot))), "r"(rank));
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(at) : "r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))), "r"(rank));
  st_async_words<0>(to, at, words);
}
// mbarrier_wait, acquiring what the cluster's stores into this block released.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, unsigned parity) {
  NORMSCAN_MBARRIER_SPIN("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64");
}
#endif
#undef NORMSCAN_MBARRIER_SPIN

}  // namespace normscan

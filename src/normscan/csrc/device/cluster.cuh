// Thread-block clusters (sm_90): a block's place in its cluster, and a reduction across it
// through distributed shared memory. Where clusters do not exist (sm_80, host passes) a
// block is a cluster of one, and NORMSCAN_CLUSTERS is undefined.
#pragma once

#include "async.cuh"
#include "reduce.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#define NORMSCAN_CLUSTERS 1
#endif

namespace normscan {

#ifdef NORMSCAN_CLUSTERS
namespace cg = cooperative_groups;
#endif

// The architectures a kernel's configuration is launched on. Its code is left out of the
// others' builds (the kernel returns at once there): ptxas's time and the binary's size.
enum class LaunchedOn { kEvery, kSm90On, kBeforeSm90 };
__host__ __device__ constexpr bool built_here(LaunchedOn where) {
#if defined(NORMSCAN_CLUSTERS)
  return where != LaunchedOn::kBeforeSm90;
#elif defined(__CUDA_ARCH__)
  return where != LaunchedOn::kSm90On;
#else
  return true;
#endif
}

// This block's place in its thread-block cluster: .x the cluster's size, .y the block's
// rank (1 and 0 where there are no clusters).
__device__ __forceinline__ int2 cluster_place() {
#ifdef NORMSCAN_CLUSTERS
  const cg::cluster_group cluster = cg::this_cluster();
  return make_int2(static_cast<int>(cluster.num_blocks()), static_cast<int>(cluster.block_rank()));
#else
  return make_int2(1, 0);
#endif
}

#ifdef NORMSCAN_CLUSTERS
// Op over the `csize` blocks (at most 32) of the cluster of each block's v (thread 0's
// counts); every thread gets it, combined in the same order on every block. `slot` is this
// block's shared scratch of one value: callers alternate two, and sync the cluster once
// more before any block exits, so that no block's shared memory is read after it has gone.
template <typename Op, typename A>
__device__ __forceinline__ A cluster_reduce(A v, A* slot, int csize) {
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) *slot = v;
  cg::this_cluster().sync();
  A c = Op::template identity<A>();
  if (lane < csize) c = *cg::this_cluster().map_shared_rank(slot, lane);
  return warp_reduce<Op>(c);
}
template <typename A>
__device__ __forceinline__ A cluster_sum(A v, A* slot, int csize) {
  return cluster_reduce<SumOp>(v, slot, csize);
}

// cluster_reduce for a kernel that reduces once a round, without a cluster barrier: lane r of
// each block's first warp stores the block's value (every thread has it) into the block's
// slot in block r, completing its bytes on r's barrier (st_async: no fence, so the value does
// not wait for the block's earlier stores to global memory, as a released arrival did:
// docs/design-notes.md "Cluster exchanges"); a block waits only for its own barrier (every value in) and
// each warp combines the slots as cluster_reduce does, the same on every block. ROUNDS
// rounds' slots take turns. reduce() posts a round and takes it: no block can be two rounds
// ahead of another, since a round needs every block's value, given before that block reads
// the round before (the caller's block barrier between, as in block_group_reduce), so two
// suffice. A caller that posts round r + 1 before it takes round r (post(), then take())
// lets a block run three rounds ahead of a slot's last reader: four. In shared memory;
// init() by every thread, then a cluster barrier before the first round. N: the most blocks
// a cluster has.
template <typename A, int N = kMaxPortableCluster, int ROUNDS = 2> struct ClusterRounds {
  static_assert(N <= 32, "a rank a lane");
  static_assert(ROUNDS > 0 && (ROUNDS & (ROUNDS - 1)) == 0, "a power of two");
  // A value's slot, aligned for st_async's widest store of it (12 bytes: 8 and then 4).
  struct alignas(sizeof(A) <= 8 ? sizeof(A) : 16) Slot {
    A v;
  };
  Slot value[ROUNDS][N];
  uint64_t full[ROUNDS];

  __device__ __forceinline__ void init() {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int p = 0; p < ROUNDS; ++p) mbarrier_init(&full[p], 1);  // thread 0's arrival, with the bytes to come
      mbarrier_init_fence_cluster();
    }
  }
  // This block's v, every thread's, into round `round`'s slot of each block.
  __device__ __forceinline__ void post(A v, int csize, int crank, unsigned round) {
    const int p = round % ROUNDS;
    if (threadIdx.x == 0) mbarrier_arrive_expect_tx(&full[p], csize * sizeof(A));
    if (threadIdx.x < csize) st_async(&value[p][crank].v, &full[p], threadIdx.x, v);
  }
  // Op over round `round`'s values, once every block's is in.
  template <typename Op> __device__ __forceinline__ A take(int csize, unsigned round) {
    const int p = round % ROUNDS;
    mbarrier_wait_cluster(&full[p], (round / ROUNDS) & 1);
    const int lane = threadIdx.x % 32;
    return warp_reduce<Op>(lane < csize ? value[p][lane].v : Op::template identity<A>());
  }
  template <typename Op>
  __device__ __forceinline__ A reduce(A v, int csize, int crank, unsigned round) {
    post(v, csize, crank, round);
    return take<Op>(csize, round);
  }
};
#endif

}  // namespace normscan

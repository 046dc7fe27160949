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
// slot in block r and arrives on r's barrier; a block waits only for its own barrier (every
// value in) and combines its slots in rank order, the same on every block. Two rounds' slots
// alternate: no block can be two rounds ahead of another, since a round needs every block's
// value, given before that block reads the round before (the caller's block barrier
// between, as in block_group_reduce). In shared memory; init(csize) by every thread, then a
// cluster barrier before the first round. N: the most blocks a cluster has.
template <typename A, int N = kMaxPortableCluster> struct ClusterRounds {
  A value[2][N];
  uint64_t full[2];

  __device__ __forceinline__ void init(int csize) {
    if (threadIdx.x == 0) {
      mbarrier_init(&full[0], csize);
      mbarrier_init(&full[1], csize);
      mbarrier_init_fence_cluster();
    }
  }
  template <typename Op>
  __device__ __forceinline__ A reduce(A v, int csize, int crank, unsigned round) {
    const int p = round & 1;
    if (threadIdx.x < csize) {
      *cg::this_cluster().map_shared_rank(&value[p][crank], threadIdx.x) = v;
      mbarrier_arrive_remote(&full[p], threadIdx.x);
    }
    mbarrier_wait_cluster(&full[p], (round >> 1) & 1);
    A c = Op::template identity<A>();
    for (int r = 0; r < csize; ++r) c = Op::apply(c, value[p][r]);
    return c;
  }
};
#endif

}  // namespace normscan

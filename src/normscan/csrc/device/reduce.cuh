// Associative operators, and reductions over a warp and over groups of warps of a block.
#pragma once

#include "types.cuh"

namespace normscan {

struct SumOp {
  template <typename A> static __device__ __forceinline__ A identity() { return A(0); }
  template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a + b; }
};
struct ProdOp {
  template <typename A> static __device__ __forceinline__ A identity() { return A(1); }
  template <typename A> static __device__ __forceinline__ A apply(A a, A b) { return a * b; }
};

constexpr unsigned kFullMask = 0xffffffffu;

// Op over the 32 lanes of a warp; every lane gets the result.
template <typename Op, typename A>
__device__ __forceinline__ A warp_reduce(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Where a thread sits in its block: its lane and its warp.
struct WarpPlace {
  int lane, warp;
  static __device__ __forceinline__ WarpPlace of_thread() {
    return WarpPlace{static_cast<int>(threadIdx.x % 32), static_cast<int>(threadIdx.x / 32)};
  }
};

// Sum of v over a group of GROUP_WARPS consecutive warps of the block, starting at warp
// `first` (a row's warps, or the whole block); every thread of the group gets the sum, in
// warp order. `scratch` has one entry per warp of the block. One __syncthreads() when
// GROUP_WARPS > 1: callers alternate two scratch buffers, so that no second barrier is
// needed before the next call writes.
template <int GROUP_WARPS, typename A>
__device__ __forceinline__ A block_group_sum(A v, A* scratch, int first, WarpPlace me) {
  v = warp_reduce<SumOp>(v);
  if (GROUP_WARPS > 1) {
    if (me.lane == 0) scratch[me.warp] = v;
    __syncthreads();
    v = A(0);
#pragma unroll
    for (int i = 0; i < GROUP_WARPS; ++i) v += scratch[first + i];
  }
  return v;
}

}  // namespace normscan

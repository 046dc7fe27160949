// Scans over the lanes of a warp and over the warps of a block.
#pragma once

#include "reduce.cuh"

namespace normscan {

// Inclusive scans over the lanes of a warp `stride` apart: lane r * stride + c gets lanes c,
// c + stride, ..., itself combined. Lanes past the last whole group of `stride` get
// whatever; they give nothing to the others.
template <typename Op, typename A>
__device__ __forceinline__ A warp_inclusive_scan_strided(A v, int lane, int stride) {
  for (int o = stride; o < 32; o <<= 1) {
    const A n = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v = Op::apply(n, v);
  }
  return v;
}

// Inclusive scan over the lanes of a warp, in lane order.
template <typename Op, typename A>
__device__ __forceinline__ A warp_inclusive_scan(A v, int lane) {
  return warp_inclusive_scan_strided<Op>(v, lane, 1);
}

// The same from the last lane down (a reverse scan over threads that hold a row in order):
// lane r gets lanes r, r + 1, ..., 31 combined, in lane order (Op::apply(earlier, later)).
template <typename Op, typename A>
__device__ __forceinline__ A warp_inclusive_scan_down(A v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const A n = shfl_down(v, o);
    if (lane + o < 32) v = Op::apply(v, n);
  }
  return v;
}

// Exclusive scan over the warps of a block of WARPS warps. `totals` is shared scratch of
// WARPS entries. Returns this warp's exclusive prefix (DOWN: the warps after it combined);
// *block_total gets the total. Contains one __syncthreads(); callers separate reuse of
// `totals` by another barrier.
template <typename Op, int WARPS, bool DOWN = false, typename A>
__device__ __forceinline__ A block_exclusive_scan_warps(A warp_total, A* totals, A* block_total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) totals[warp] = warp_total;
  __syncthreads();
  A t = lane < WARPS ? totals[lane] : Op::template identity<A>();
  if constexpr (DOWN) {
    t = warp_inclusive_scan_down<Op>(t, lane);
    *block_total = shfl_idx(t, 0);
    const A after = shfl_idx(t, (warp + 1) % 32);
    return warp + 1 == WARPS ? Op::template identity<A>() : after;
  } else {
    t = warp_inclusive_scan<Op>(t, lane);
    *block_total = __shfl_sync(kFullMask, t, WARPS - 1);
    const A before = __shfl_sync(kFullMask, t, (warp + 31) % 32);
    return warp == 0 ? Op::template identity<A>() : before;
  }
}

}  // namespace normscan

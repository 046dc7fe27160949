// Rows read twice: y = x * scale(sum over the row) [* w] for rows too long to hold on
// chip, or whose x and y rows are aligned differently (then V == 1). One block per row: a
// pass that sums, then a pass that scales, in V-element vectors. The second pass walks the
// row backwards, so it starts with the lines the first pass read last: those most likely
// still in L2.
#pragma once

#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"

namespace normscan {

template <typename T, typename Op, int BLOCK, int V>
__global__ void __launch_bounds__(BLOCK) reduce_scale_reread_kernel(ReduceScaleArgs<T> a) {
  using A = acc_t<T>;
  using VT = Vec<T, V>;
  constexpr int UNROLL = 4;  // vectors in flight per thread
  __shared__ A warp_part[2][BLOCK / 32];
  const WarpPlace me = WarpPlace::of_thread();
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.view.outer; row += gridDim.x, parity ^= 1) {
    const T* xr = a.x + row * a.view.x_so;
    T* yr = a.y + row * a.view.y_so;
    const RowSplit s = split_row<T, V>(xr, a.view.length);
    const T* xb = xr + s.head;
    // Edge element e (head, then tail; fewer than 2 * V) belongs to thread e.
    const int head = static_cast<int>(s.head), edges = static_cast<int>(s.head + s.tail);
    const int64_t edge_at = threadIdx.x < head ? threadIdx.x : s.nvec * V + threadIdx.x;
    A sum = A(0);
    if (threadIdx.x < edges) sum += Op::map(Convert<T>::to_acc(xr[edge_at]));
    for (int64_t j = threadIdx.x; j < s.nvec; j += int64_t(BLOCK) * UNROLL) {
      VT v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j + u * BLOCK < s.nvec) v[u] = load_vec<T, V>(xb + (j + u * BLOCK) * V);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j + u * BLOCK < s.nvec) {
#pragma unroll
          for (int i = 0; i < V; ++i) sum += Op::map(Convert<T>::to_acc(v[u].v[i]));
        }
    }
    sum = block_group_sum<BLOCK / 32>(sum, warp_part[parity], 0, me);
    const A scale = Op::scale(sum, a.view.length, a.eps);
    if (threadIdx.x < edges) yr[edge_at] = scale_one(xr[edge_at], scale, a.w, edge_at);
    T* yb = yr + s.head;
    for (int64_t j = s.nvec - 1 - threadIdx.x; j >= 0; j -= int64_t(BLOCK) * UNROLL) {
      VT v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j - u * BLOCK >= 0) v[u] = load_vec<T, V>(xb + (j - u * BLOCK) * V);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j - u * BLOCK >= 0) {
          const int64_t l = s.head + (j - u * BLOCK) * V;
          VT out;
#pragma unroll
          for (int i = 0; i < V; ++i) out.v[i] = scale_one(v[u].v[i], scale, a.w, l + i);
          store_vec<T, V>(yb + (j - u * BLOCK) * V, out);
        }
    }
  }
}

}  // namespace normscan

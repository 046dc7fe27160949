// Rows read twice: y = apply(x, scale(sum over the row)) [* w] for rows too long to hold on
// chip, or whose x and y rows are aligned differently (then V == 1). One block per row: a
// pass that sums, then a pass that scales, in V-element vectors. The second pass walks the
// row backwards, so it starts with the lines the first pass read last: those most likely
// still in L2. A max-shifted op keeps a running maximum with its sum in the first pass (the
// sum rescaled when the maximum grows, once per UNROLL vectors), so it too reads x twice.
#pragma once

#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"

namespace normscan {

// Max-shifted ops hold a maximum and rescale: up to 128 registers (at 64 they spill).
template <typename T, typename Op, int BLOCK, int V>
__global__ void __launch_bounds__(BLOCK, Op::kMaxShifted ? 1 : 2) reduce_scale_reread_kernel(ReduceScaleArgs<T> a) {
  using A = acc_t<T>;
  using VT = Vec<T, V>;
  constexpr int UNROLL = 4;  // vectors in flight per thread
  constexpr bool SHIFTED = Op::kMaxShifted;  // reduces MaxSum pairs instead (map is exp)
  __shared__ A warp_part[2][SHIFTED ? 1 : BLOCK / 32];
  __shared__ MaxSum<A> warp_stat[2][SHIFTED ? BLOCK / 32 : 1];
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
    // SHIFTED: shift is this thread's running maximum and sum is of map(x - shift), rescaled
    // when the maximum grows; while shift is -inf every value seen was -inf, and adds nothing
    // (their NaN, if the row's maximum is -inf too, comes from apply).
    A shift = MaxOp::identity<A>();
    // Adds `vals`, the first `n` of N of them.
    auto add = [&](const auto& vals, int n) {
      constexpr int N = sizeof(vals) / sizeof(vals[0]);
      if constexpr (SHIFTED) {
        A m = shift;
#pragma unroll
        for (int i = 0; i < N; ++i)
          if (i < n) m = MaxOp::apply(m, vals[i]);
        if (!(m <= shift)) {
          sum *= Op::map(shift - m);
          shift = m;
        }
        if (shift == MaxOp::identity<A>()) return;
      }
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (i < n) sum += Op::map(shifted<Op>(vals[i], shift));
    };
    if (threadIdx.x < edges) {
      const A e[1] = {Convert<T>::to_acc(xr[edge_at])};
      add(e, 1);
    }
    for (int64_t j = threadIdx.x; j < s.nvec; j += int64_t(BLOCK) * UNROLL) {
      VT v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (j + u * BLOCK < s.nvec) v[u] = load_vec<T, V>(xb + (j + u * BLOCK) * V);
      if constexpr (SHIFTED) {
        A vals[UNROLL * V];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
          for (int i = 0; i < V; ++i) vals[u * V + i] = Convert<T>::to_acc(v[u].v[i]);
        // The present vectors are the first ones.
        add(vals, static_cast<int>(min64(UNROLL, (s.nvec - j + BLOCK - 1) / BLOCK)) * V);
      } else {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          if (j + u * BLOCK < s.nvec) {
#pragma unroll
            for (int i = 0; i < V; ++i) sum += Op::map(Convert<T>::to_acc(v[u].v[i]));
          }
      }
    }
    if constexpr (SHIFTED) {
      const MaxSum<A> stat = block_group_reduce<MaxSumOp, BLOCK / 32>(MaxSum<A>{shift, sum}, warp_stat[parity], 0, me);
      shift = stat.max;
      sum = stat.sum;
    } else {
      sum = block_group_sum<BLOCK / 32>(sum, warp_part[parity], 0, me);
    }
    const A scale = Op::scale(sum, a.view.length, a.eps);
    if (threadIdx.x < edges) yr[edge_at] = scale_one<Op>(xr[edge_at], scale, shift, a.w, edge_at);
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
          for (int i = 0; i < V; ++i) out.v[i] = scale_one<Op>(v[u].v[i], scale, shift, a.w, l + i);
          store_vec<T, V>(yb + (j - u * BLOCK) * V, out);
        }
    }
  }
}

}  // namespace normscan

// Backward of y = x * c(S) [* w], S = sum(map(x)) over rows (inner == 1), held on chip:
//   dx = c * g * w + grad_coef(c, n) * D * dmap(x),  D = sum(g * w * x)   (ops.cuh)
//   dw = sum over rows of g * x * c
// x and g are read once, dx written once. Each thread keeps the same columns on every row
// it visits (rows of one launch share their alignment), so it sums its columns' dw in its
// own shared-memory slots (registers held the weight and dw at 95 registers a thread: two
// 256-thread blocks a SM, 88% of the byte floor on 65536x1024); at the end the block adds
// its row groups' sums into its slot of dw_part ([slots][length], one slot a block or
// cluster); the caller sums the slots in order: the same input gives the same bits. The
// weight is read where it is used, twice a row, from L1.
//
// TPR threads hold a row (BLOCK / TPR rows a block), NV vectors of V elements each; with a
// cluster of C blocks (TPR == BLOCK), the row is spread over the C blocks.
#pragma once

#include "../device/cluster.cuh"
#include "../device/memory.cuh"
#include "ops.cuh"

namespace normscan {

template <typename T> struct ReduceScaleBackwardArgs {
  const T* x;
  const T* g;  // rows contiguous, g_so apart (0: one row broadcast)
  T* dx;
  const T* w;          // null without a weight
  acc_t<T>* dw_part;   // [slots][length]; null when dw is not wanted
  View view;           // x's and dx's strides
  int64_t g_so;
  double eps;
};

template <int BLOCK, int TPR, int NV, int MINB, bool CLUSTER = false> struct BackwardRowsConfig {
  static constexpr int kBlock = BLOCK, kThreadsPerRow = TPR, kVecs = NV, kMinBlocks = MINB;
  static constexpr int kGroups = BLOCK / TPR;  // rows a block holds at once
  static constexpr bool kCluster = CLUSTER;
  static constexpr int64_t kVecsPerBlock = int64_t(TPR) * NV;  // of one row
  // Dynamic shared memory: the dw sums of a weighted kernel, NV vectors of V a thread.
  template <typename T, int V, bool WEIGHTED> static constexpr size_t smem_bytes() {
    return WEIGHTED ? size_t(BLOCK) * NV * V * sizeof(acc_t<T>) : 0;
  }
};

// Doubles hold twice the registers: half the resident blocks asked.
template <typename T, typename Op, typename Cfg, int V, bool WEIGHTED>
__global__ void __launch_bounds__(Cfg::kBlock, sizeof(T) == 8 ? (Cfg::kMinBlocks + 1) / 2 : Cfg::kMinBlocks)
    reduce_scale_backward_rows_kernel(ReduceScaleBackwardArgs<T> a) {
  constexpr int BLOCK = Cfg::kBlock, TPR = Cfg::kThreadsPerRow, NV = Cfg::kVecs, GROUPS = Cfg::kGroups;
  constexpr int WARPS_PER_ROW = TPR / 32;
  static_assert(BLOCK % TPR == 0 && TPR % 32 == 0, "rows are held by whole warps");
  using A = acc_t<T>;
  using VT = Vec<T, V>;
  __shared__ A warp_part[2][2][BLOCK / 32];  // [parity][S or D]: one barrier per sum
  __shared__ A cta_part[2][2];
  const int t = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const WarpPlace me = WarpPlace::of_thread();
  const int2 place = Cfg::kCluster ? cluster_place() : make_int2(1, 0);
  const int csize = place.x, crank = place.y;
  const int64_t n = a.view.length;
  // This block's share of a row, in vectors (the dispatcher checked n % V == 0 and that a
  // row fits: in-row offsets fit 32 bits).
  const int nvec = static_cast<int>(n / V);
  const int per_cta = (nvec + csize - 1) / csize;
  const int mine = max(0, min(per_cta, nvec - crank * per_cta));
  auto has = [&](int k) { return k * TPR + t < mine; };
  auto col = [&](int k) { return (crank * per_cta + k * TPR + t) * V; };

  extern __shared__ uint4 smem[];
  // This thread's dw sum of element i of its vector k; consecutive threads, consecutive words.
  A* const dw_sums = reinterpret_cast<A*>(smem);
  auto dw = [&](int k, int i) -> A& { return dw_sums[(k * V + i) * BLOCK + threadIdx.x]; };
  if constexpr (WEIGHTED) {
#pragma unroll
    for (int k = 0; k < NV; ++k)
#pragma unroll
      for (int i = 0; i < V; ++i) dw(k, i) = A(0);
  }

  // The weight's vector k of this thread (unused without one), and g * w.
  auto weight = [&](int k) {
    VT wv;
    if constexpr (WEIGHTED) wv = load_vec<T, V>(a.w + col(k));
    return wv;
  };
  auto weighted = [](A ga, const VT& wv, int i) {
    if constexpr (WEIGHTED) return ga * Convert<T>::to_acc(wv.v[i]);
    return ga;
  };

  const int64_t first = static_cast<int64_t>(blockIdx.x / csize) * GROUPS;  // the block's first row group
  const int64_t step = static_cast<int64_t>(gridDim.x / csize) * GROUPS;
  int parity = 0;
  // Every group of the block takes the loop's barriers: it runs while any group has a row.
  for (int64_t base = first; base < a.view.outer; base += step, parity ^= 1) {
    const int64_t row = base + group;
    const bool active = row < a.view.outer;
    const int64_t r = active ? row : 0;
    const T* xr = a.x + r * a.view.x_so;
    const T* gr = a.g + r * a.g_so;
    T* dxr = a.dx + r * a.view.y_so;
    VT xv[NV], gv[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (active && has(k)) {
        xv[k] = load_vec<T, V>(xr + col(k));
        gv[k] = load_vec<T, V>(gr + col(k));
      }
    A s = A(0), d = A(0);
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (active && has(k)) {
        const VT wv = weight(k);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const A xa = Convert<T>::to_acc(xv[k].v[i]);
          s += Op::map(xa);
          d += weighted(Convert<T>::to_acc(gv[k].v[i]), wv, i) * xa;
        }
      }
    s = block_group_sum<WARPS_PER_ROW>(s, warp_part[parity][0], group * WARPS_PER_ROW, me);
    d = block_group_sum<WARPS_PER_ROW>(d, warp_part[parity][1], group * WARPS_PER_ROW, me);
#ifdef NORMSCAN_CLUSTERS
    if (csize > 1) {
      s = cluster_sum(s, &cta_part[parity][0], csize);
      d = cluster_sum(d, &cta_part[parity][1], csize);
    }
#endif
    const A c = Op::scale(s, n, a.eps);
    const A coef = Op::grad_coef(c, n) * d;
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (active && has(k)) {
        const VT wv = weight(k);
        A out[V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const A xa = Convert<T>::to_acc(xv[k].v[i]), ga = Convert<T>::to_acc(gv[k].v[i]);
          out[i] = c * weighted(ga, wv, i) + coef * Op::dmap(xa);
          if constexpr (WEIGHTED) dw(k, i) += ga * xa * c;
        }
        if constexpr (V == 1) dxr[col(k)] = Convert<T>::from_acc(out[0]);
        else store_vec<T, V>(dxr + col(k), from_acc_vec<T, V>(out));
      }
  }
  // The block's row groups' sums added in group order, into the block's slot (its cluster's,
  // each block its own columns).
  if constexpr (WEIGHTED) {
    if (a.dw_part != nullptr) {
      __syncthreads();
      if (group == 0) {
        A* part = a.dw_part + static_cast<int64_t>(blockIdx.x / csize) * n;
#pragma unroll
        for (int k = 0; k < NV; ++k)
          if (has(k)) {
#pragma unroll
            for (int i = 0; i < V; ++i) {
              A sum = A(0);
              for (int j = 0; j < GROUPS; ++j) sum += dw_sums[(k * V + i) * BLOCK + j * TPR + t];
              part[col(k) + i] = sum;
            }
          }
      }
    }
  }
#ifdef NORMSCAN_CLUSTERS
  // No block may leave while another can still read its shared memory.
  if (csize > 1) cg::this_cluster().sync();
#endif
}

}  // namespace normscan

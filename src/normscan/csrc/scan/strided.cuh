// Strided scans (inner > 1): threads along inner (coalesced, 16-byte vectors of adjacent
// columns where the layout allows), each scanning a run of its columns; the runs are
// joined through shared memory, then carried on.
//
// A block is BX threads along inner, each taking VI adjacent columns (one 16-byte vector
// when VI > 1: inner contiguous and aligned), by BY runs of ITEMS consecutive positions
// along the scanned dim; it walks the dim in tiles of BY * ITEMS, carrying each column's
// value.
#pragma once

#include "../device/memory.cuh"
#include "ops.cuh"

namespace normscan {

// A strided scan's shape (the letters above); MINB resident blocks a SM asked of the
// compiler. tuning.cuh names the ones used.
template <int BX, int BY, int ITEMS, int MINB> struct ScanStridedConfig {
  static constexpr int kBx = BX, kBy = BY, kItems = ITEMS, kMinBlocks = MINB;
};

template <typename T, typename Op, typename Cfg, int VI>
__global__ void __launch_bounds__(Cfg::kBx * Cfg::kBy, (scan_min_blocks<T, Op>(Cfg::kMinBlocks))) scan_strided_kernel(ScanArgsFor<T, Op> a) {
  constexpr int BX = Cfg::kBx, BY = Cfg::kBy, ITEMS = Cfg::kItems;
  using A = scan_acc_t<T>;
  using VT = Vec<T, VI>;
  constexpr int64_t TILE = int64_t(BY) * ITEMS;
  constexpr int COLS = BX * VI;
  __shared__ A totals[2][BY][COLS];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles_inner = (a.view.inner + COLS - 1) / COLS;
  const int64_t ncols = a.view.outer * tiles_inner;
  int parity = 0;
  for (int64_t col = blockIdx.x; col < ncols; col += gridDim.x) {
    const int64_t o = col / tiles_inner;
    const int64_t i = (col % tiles_inner) * COLS + tx * VI;
    const bool active = i < a.view.inner;  // the whole vector: inner is a multiple of VI
    const T* xc = a.x + o * a.view.x_so + (active ? i : 0) * a.view.x_si;
    T* yc = a.y + o * a.view.y_so + (active ? i : 0) * a.view.y_si;
    const auto mc = [&] {  // the mask, laid out as x
      if constexpr (kMasked<Op>) return a.mask + (xc - a.x);
      else return nullptr;
    }();
    A carry[VI];
#pragma unroll
    for (int v = 0; v < VI; ++v) carry[v] = Op::template identity<A>();
    for (int64_t l0 = 0; l0 < a.view.length; l0 += TILE, parity ^= 1) {
      VT vals[ITEMS];
      // The mask elements loaded beside x and applied after every load is issued (applied at
      // each load, each item waited for its mask before the next item's loads).
      LoadedMask<mask_t<Op>, VI> ms[ITEMS] = {};
      A t[VI];
#pragma unroll
      for (int v = 0; v < VI; ++v) t[v] = Op::template identity<A>();
      const bool whole = kMasked<Op> && active && l0 + (ty + 1) * ITEMS <= a.view.length;  // as rows.cuh's
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + ty * ITEMS + k;
        if (whole || (active && l < a.view.length)) {
          const int64_t at = (a.reverse ? a.view.length - 1 - l : l) * a.view.x_sl;
          vals[k] = load_vec<T, VI>(xc + at);
          if constexpr (kMasked<Op>) ms[k] = LoadedMask<mask_t<Op>, VI>::load(mc + at);
        }
      }
      if constexpr (kMasked<Op>) {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) vals[k] = masked_vec(vals[k], ms[k].values());
      }
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + ty * ITEMS + k;
        if (active && l < a.view.length) {
#pragma unroll
          for (int v = 0; v < VI; ++v) t[v] = Op::apply(t[v], to_scan<T>(vals[k].v[v]));
        }
      }
#pragma unroll
      for (int v = 0; v < VI; ++v) totals[parity][ty][tx * VI + v] = t[v];
      __syncthreads();
      A run[VI];
#pragma unroll
      for (int v = 0; v < VI; ++v) {
        A before = Op::template identity<A>();
#pragma unroll
        for (int j = 0; j < BY; ++j)
          if (j < ty) before = Op::apply(before, totals[parity][j][tx * VI + v]);
        run[v] = Op::apply(carry[v], before);
      }
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + ty * ITEMS + k;
        if (active && l < a.view.length) {
          VT out;
#pragma unroll
          for (int v = 0; v < VI; ++v) run[v] = scan_step<Op, T>(to_scan<T>(vals[k].v[v]), run[v], a.exclusive, true, out.v[v]);
          store_vec<T, VI>(yc + (a.reverse ? a.view.length - 1 - l : l) * a.view.y_sl, out);
        }
      }
      // The tile's totals are read again rather than held (registers): the next tile writes
      // the other buffer.
#pragma unroll
      for (int v = 0; v < VI; ++v)
#pragma unroll
        for (int j = 0; j < BY; ++j) carry[v] = Op::apply(carry[v], totals[parity][j][tx * VI + v]);
    }
  }
}

}  // namespace normscan

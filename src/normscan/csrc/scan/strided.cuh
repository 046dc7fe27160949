// Strided scans (inner > 1): each thread scans a run of consecutive positions of VI adjacent
// columns (one 16-byte vector when VI > 1: inner contiguous and aligned); the runs are joined
// by warp shuffles and through shared memory, then carried on.
//
// A warp's lanes are runs by column vectors, lane = run * CV + cv, with CV the vectors across
// inner up to 32: few columns beside the scanned dim (a scan over time of a (batch, time,
// features) tensor with 2-64 features) fill a warp with runs instead of leaving it idle
// (32 % CV lanes stay so). A tile is the block's runs back to back. A unit is (outer, CV * VI
// columns); where units are too few to fill the GPU, a cluster of blocks shares one: in
// round n rank k takes tile n * csize + k, and each rank pushes its tile's column totals into
// every rank's shared memory, so that each combines those of the ranks before it.
#pragma once

#include "../device/cluster.cuh"
#include "../device/memory.cuh"
#include "../device/scan.cuh"
#include "ops.cuh"

namespace normscan {

// A strided scan's shape: BLOCK threads, ITEMS consecutive positions a run; MINB resident
// blocks a SM asked of the compiler. tuning.cuh names the ones used.
template <int BLOCK, int ITEMS, int MINB> struct ScanStridedConfig {
  static constexpr int kBlock = BLOCK, kItems = ITEMS, kMinBlocks = MINB;
  // Column vectors across a block (CV above) for `inner` columns taken VI at a time.
  static __host__ __device__ int column_vectors(int64_t inner, int vi) {
    const int64_t n = ceil_div(inner, vi);
    return n < 32 ? static_cast<int>(n) : 32;
  }
  // Units (CV * VI columns) across `inner`: a view has outer times as many.
  static __host__ __device__ int64_t units_inner(int64_t inner, int vi) {
    return ceil_div(ceil_div(inner, vi), column_vectors(inner, vi));
  }
  // Positions of a tile of CV = cv.
  static __host__ __device__ int64_t tile_length(int cv) { return int64_t(BLOCK / 32) * (32 / cv) * ITEMS; }
  // Dynamic shared memory of a block where clusters are: room for every rank's pushed
  // totals, one size for every launch.
  template <typename T, int VI> static constexpr size_t smem_bytes(bool clusters) {
    return clusters ? size_t(2) * kMaxCluster * 32 * VI * sizeof(scan_acc_t<T>) : 0;
  }
};

template <typename T, typename Op, typename Cfg, int VI>
__global__ void __launch_bounds__(Cfg::kBlock, (scan_min_blocks<T, Op>(Cfg::kMinBlocks))) scan_strided_kernel(ScanArgsFor<T, Op> a) {
  constexpr int WARPS = Cfg::kBlock / 32, ITEMS = Cfg::kItems, COLS = 32 * VI;  // COLS: the most a block takes
  using A = scan_acc_t<T>;
  using VT = Vec<T, VI>;
  __shared__ A wtot[2][WARPS][COLS];  // each warp's column totals, by round parity
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cvs = Cfg::column_vectors(a.view.inner, VI), runs_warp = 32 / cvs;
  const int col = lane % cvs * VI;  // this thread's first column in its unit
  const bool lane_used = lane < runs_warp * cvs;
  const int64_t my_run = int64_t(warp) * runs_warp + lane / cvs;
  const int64_t tile_len = Cfg::tile_length(cvs);
  const int64_t units_inner = Cfg::units_inner(a.view.inner, VI);
  const int64_t units = a.view.outer * units_inner;
  const int2 place = cluster_place();
  const int csize = place.x, crank = place.y;
  const int64_t rounds = ceil_div(ceil_div(a.view.length, tile_len), csize);
#ifdef NORMSCAN_CLUSTERS
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  A* pushed = reinterpret_cast<A*>(dynamic_smem);  // [2][csize][COLS]: each rank's tile totals, by round parity
  __shared__ uint64_t full[2];                      // every other rank's totals are in
  __shared__ A ranks_before[COLS];  // the unit's carry and the ranks' before this one, by column
  if (csize > 1) {
    if (threadIdx.x == 0) {
      mbarrier_init(&full[0], 1);  // thread 0's arrival, with the other ranks' bytes to come
      mbarrier_init(&full[1], 1);
      mbarrier_init_fence_cluster();
    }
    // A block may write another's shared memory only once that block has started.
    cg::this_cluster().sync();
  }
#endif
  unsigned round = 0;  // this block's, across units: the parity of wtot, pushed and full
  for (int64_t unit = blockIdx.x / csize; unit < units; unit += gridDim.x / csize) {
    const int64_t o = unit / units_inner;
    const int64_t i = (unit % units_inner) * cvs * VI + col;
    const bool active = lane_used && i < a.view.inner;  // the whole vector: inner is a multiple of VI
    const T* xc = a.x + o * a.view.x_so + (active ? i : 0) * a.view.x_si;
    T* yc = a.y + o * a.view.y_so + (active ? i : 0) * a.view.y_si;
    const auto mc = [&] {  // the mask, laid out as x
      if constexpr (kMasked<Op>) return a.mask + (xc - a.x);
      else return nullptr;
    }();
    A carry[VI];  // the unit's positions before this round, by column (unclustered)
#pragma unroll
    for (int v = 0; v < VI; ++v) carry[v] = Op::template identity<A>();
    A cluster_carry = Op::template identity<A>();  // the same, of column threadIdx.x (clustered)
    for (int64_t n = 0; n < rounds; ++n, ++round) {
      const int p = round & 1;
      const int64_t l0 = (n * csize + crank) * tile_len + my_run * ITEMS;  // this thread's first position
      VT vals[ITEMS];
      // The mask elements loaded beside x and applied after every load is issued (applied at
      // each load, each item waited for its mask before the next item's loads).
      LoadedMask<mask_t<Op>, VI> ms[ITEMS] = {};
      const bool whole = kMasked<Op> && active && l0 + ITEMS <= a.view.length;  // as rows.cuh's
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + k;
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
      A t[VI];
#pragma unroll
      for (int v = 0; v < VI; ++v) t[v] = Op::template identity<A>();
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (active && l0 + k < a.view.length) {
#pragma unroll
          for (int v = 0; v < VI; ++v) t[v] = Op::apply(t[v], to_scan<T>(vals[k].v[v]));
        }
      }
      // The runs before this one in its warp, then the warp's totals (its last runs' lanes).
      A ex[VI];
#pragma unroll
      for (int v = 0; v < VI; ++v) {
        const A inc = warp_inclusive_scan_strided<Op>(t[v], lane, cvs);
        const A up = __shfl_up_sync(kFullMask, inc, cvs);
        ex[v] = lane < cvs ? Op::template identity<A>() : up;
        if (lane_used && lane >= (runs_warp - 1) * cvs) wtot[p][warp][col + v] = inc;
      }
      __syncthreads();
      A start[VI];  // everything before this run
#pragma unroll
      for (int v = 0; v < VI; ++v) {
        A before = Op::template identity<A>(), total = Op::template identity<A>();
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
          if (w == warp) before = total;
          total = Op::apply(total, wtot[p][w][col + v]);
        }
        if (csize == 1) {  // else the cluster's ranks are combined below
          start[v] = Op::apply(carry[v], before);
          carry[v] = Op::apply(carry[v], total);
        } else {
          start[v] = before;
        }
      }
#ifdef NORMSCAN_CLUSTERS
      if (csize > 1) {
        // The block's totals into its own slot; then thread r copies them into rank r, each
        // completing its bytes on r's barrier (st_async).
        const int cols = cvs * VI;
        if (threadIdx.x < cols) {
          A total = Op::template identity<A>();
#pragma unroll
          for (int w = 0; w < WARPS; ++w) total = Op::apply(total, wtot[p][w][threadIdx.x]);
          pushed[(p * csize + crank) * COLS + threadIdx.x] = total;
        }
        __syncthreads();
        if (threadIdx.x == 0) mbarrier_arrive_expect_tx(&full[p], (csize - 1) * cols * sizeof(A));
        if (threadIdx.x < csize && threadIdx.x != crank) {
          A* const mine = &pushed[(p * csize + crank) * COLS];
          for (int c = 0; c < cols; ++c) st_async(mine + c, &full[p], threadIdx.x, mine[c]);
        }
        mbarrier_wait_cluster(&full[p], (round >> 1) & 1);
        if (threadIdx.x < cols) {  // column threadIdx.x's: its thread keeps the unit's carry
          A before = cluster_carry;
          for (int r = 0; r < csize; ++r) {
            if (r == crank) ranks_before[threadIdx.x] = before;
            before = Op::apply(before, pushed[(p * csize + r) * COLS + threadIdx.x]);
          }
          cluster_carry = before;
        }
        __syncthreads();
#pragma unroll
        for (int v = 0; v < VI; ++v) start[v] = Op::apply(ranks_before[col + v], start[v]);
      }
#endif
#pragma unroll
      for (int v = 0; v < VI; ++v) start[v] = Op::apply(start[v], ex[v]);
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + k;
        if (active && l < a.view.length) {
          VT out;
#pragma unroll
          for (int v = 0; v < VI; ++v)
            start[v] = scan_step<Op, T>(to_scan<T>(vals[k].v[v]), start[v], a.exclusive, true, out.v[v]);
          store_vec<T, VI>(yc + (a.reverse ? a.view.length - 1 - l : l) * a.view.y_sl, out);
        }
      }
    }
  }
#ifdef NORMSCAN_CLUSTERS
  // No block leaves while another may still write its shared memory.
  if (csize > 1) cg::this_cluster().sync();
#endif
}

}  // namespace normscan

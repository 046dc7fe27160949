// Strided reduce-then-scale (inner > 1): y = apply(x, scale(sum over each column)) [* w] [+ b],
// the reduced dim strided, threads along inner (coalesced); w and b by position along the
// column (by the column's channel for a grouped op); a max-shifted op (softmax)
// reduces each column's maximum first, then its sum of exp(x - maximum), a centered one
// (layer_norm) its sum first (the mean), then its squared deviations.
//
// A block is BX threads along inner by BY threads along the reduced dim. Thread tx takes
// CPT groups of VI adjacent positions along inner, groups BX * VI apart: VI > 1 reads them
// as one 16-byte vector (inner contiguous and aligned), CPT > 1 gives short columns enough
// bytes in flight. Thread (tx, ty) takes positions l = ty + k * BY of its columns: with
// IN_REGS it holds them in registers (k < ITEMS, length <= BY * ITEMS), otherwise it reads
// them twice. Held 16-byte vectors arrive through shared memory: the thread's vectors of
// the block's next tile are fetched (cp.async) into its own slots while the current tile
// is reduced, scaled and stored. Longer columns go to a cluster (sm_90, IN_REGS): block
// rank r holds positions [r * BY * ITEMS, (r + 1) * BY * ITEMS), and the blocks' column
// sums cross the cluster through distributed shared memory.
#pragma once

#include "../device/async.cuh"
#include "../device/cluster.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"

namespace normscan {

// A strided kernel's shape (the letters of the kernel's comment); MINB resident blocks a SM
// asked of the compiler; ON: the architectures it is launched on (its code left out of the
// others'); CLUSTERED: launched on clusters (launch_strided_cluster), the only ones that keep
// the cluster's column sums. tuning.cuh names the ones used.
template <int BX, int BY, int ITEMS, bool IN_REGS, int CPT, int VI, int MINB, LaunchedOn ON = LaunchedOn::kEvery,
          bool CLUSTERED = false>
struct StridedConfig {
  static_assert(!CLUSTERED || (IN_REGS && BY > 1), "a cluster's blocks hold their columns' parts");
  static constexpr int kBx = BX, kBy = BY, kItems = ITEMS, kCpt = CPT, kVi = VI, kMinBlocks = MINB;
  static constexpr bool kInRegs = IN_REGS, kClustered = CLUSTERED;
  static constexpr LaunchedOn kLaunchedOn = ON;
  static constexpr int kThreads = BX * BY;
  static constexpr int kTile = BX * CPT * VI;  // positions along inner per tile
  static constexpr int64_t kHeld = int64_t(BY) * ITEMS;  // positions of the reduced dim a block holds (IN_REGS)
  // Held values are fetched ahead through shared memory: only whole 16-byte vectors can go
  // by cp.async.
  template <typename T> __host__ __device__ static constexpr bool prefetches() { return IN_REGS && VI * sizeof(T) == 16; }
  template <typename T> static constexpr size_t smem_bytes() {
    return prefetches<T>() ? size_t(BX) * BY * CPT * ITEMS * 16 : 0;
  }
};

template <typename T, typename Op, typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, (min_blocks<T, Op>(Cfg::kMinBlocks))) reduce_scale_strided_kernel(
    ArgsFor<T, Op> a) {
  if constexpr (!built_here(Cfg::kLaunchedOn)) return;
  constexpr int BX = Cfg::kBx, BY = Cfg::kBy, ITEMS = Cfg::kItems, CPT = Cfg::kCpt, VI = Cfg::kVi;
  constexpr bool IN_REGS = Cfg::kInRegs;
  using A = acc_t<T>;
  using VT = Vec<T, VI>;
  constexpr int HELD = IN_REGS ? ITEMS : 1;  // vectors a thread holds per group
  constexpr int TILE = Cfg::kTile;
  constexpr bool PREFETCH = Cfg::template prefetches<T>();
  constexpr int NT = Cfg::kThreads;
  constexpr bool SHIFTED = kShifted<Op>;  // two reductions a tile: the maxima or means, then the sums
  struct Columns {
    A v[CPT][VI];
  };
  // A block narrower than a warp first folds the rows a warp spans by shuffles (FOLD of them,
  // lanes BX apart), so that the scratch holds a row of sums a warp, not one a thread row: the
  // 4 x 64 block's column sums read 8 rows, not 64 (rms_norm (8, 1024, 64, 64) bf16 0.055 ->
  // 0.052 ms), the 16 x 16 block's 8 (bf16 (16, 256, 128, 128) 0.092 -> 0.090; H100). Not a
  // grouped op's: its 16-bit kernels spilled 4 bytes with the shuffles (sm_90).
  constexpr int FOLD = !Op::kGrouped && BX < 32 && BY * BX >= 32 ? 32 / BX : 1;
  constexpr int ROWS = BY / FOLD;  // rows of partial sums a column in the scratch
  // Scratch for the reductions: two buffers, alternate reductions alternating (a thread that
  // writes one has passed the barrier after every read of the reduction before last). Aligned
  // to 16 bytes, a thread's VI sums go in and out as 16-byte vectors (nvcc 13.0's PTX; 4-byte
  // aligned, as element stores 16 bytes apart a lane: 4-way bank conflicts).
  __shared__ __align__(16) A part[2][BY > 1 ? ROWS : 1][BY > 1 ? TILE : 1];
  extern __shared__ uint4 ahead[];  // PREFETCH: vector (c, k) of thread i at ahead[(c * HELD + k) * NT + i]
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * BX + tx;
  const int2 place = cluster_place();
  const int csize = place.x, crank = place.y;
#ifdef NORMSCAN_CLUSTERS
  constexpr bool CLUSTERED = Cfg::kClustered;
  // Column sums of each block of the cluster, pushed by that block.
  __shared__ __align__(16) A cta_sum[2][CLUSTERED ? 8 : 1][CLUSTERED ? TILE : 1];
  // A block may write another's shared memory only once that block has started
  // (compute-sanitizer's racecheck flagged the first push without this barrier).
  if (CLUSTERED && csize > 1) cg::this_cluster().sync();
#endif
  const int64_t tiles_inner = (a.view.inner + TILE - 1) / TILE;
  const int64_t ntiles = a.view.outer * tiles_inner;
  const int64_t l0 = int64_t(crank) * BY * ITEMS;  // this block's first position along the reduced dim
  const int64_t slice = csize > 1 ? min64(int64_t(BY) * ITEMS, a.view.length - l0) : a.view.length;
  const int64_t count = slice > ty ? (slice - ty + BY - 1) / BY : 0;  // positions of this thread
  const int64_t first_tile = blockIdx.x / csize, tile_step = gridDim.x / csize;
  const int64_t x_step = BY * a.view.x_sl, y_step = BY * a.view.y_sl;
  // Stepping pointers (not k * step) keeps the compiler from hoisting ITEMS offsets.
  auto column = [&](int64_t tile, int c) {
    return a.x + (tile / tiles_inner) * a.view.x_so + ((tile % tiles_inner) * TILE + tx * VI + c * BX * VI) * a.view.x_si +
           (l0 + ty) * a.view.x_sl;
  };
  auto in_inner = [&](int64_t tile, int c) { return (tile % tiles_inner) * TILE + tx * VI + c * BX * VI < a.view.inner; };
  auto prefetch = [&](int64_t tile) {
    if (tile < ntiles) {
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        if (!in_inner(tile, c)) continue;
        const T* p = column(tile, c);
#pragma unroll
        for (int k = 0; k < HELD; ++k, p += x_step)
          if (k < count) cp_async16(&ahead[(c * HELD + k) * NT + tid], p);
      }
    }
  };
  if (PREFETCH) prefetch(first_tile);
  int parity = 0;
  for (int64_t tile = first_tile; tile < ntiles; tile += tile_step, parity ^= 1) {
    const int64_t o = tile / tiles_inner;
    const int64_t i0 = (tile % tiles_inner) * TILE + tx * VI;
    VT vals[CPT][HELD];
    if (PREFETCH) cp_async_wait_all();
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      if (IN_REGS && in_inner(tile, c)) {
        const T* p = column(tile, c);
#pragma unroll
        for (int k = 0; k < HELD; ++k, p += x_step)
          if (k < count)
            vals[c][k] = PREFETCH ? *reinterpret_cast<const VT*>(&ahead[(c * HELD + k) * NT + tid])
                                  : *reinterpret_cast<const VT*>(p);
      }
    }
    // R over each of this thread's columns of f(value), across the block's threads along the
    // reduced dim and the cluster's blocks, in scratch buffer `buf`. `after_local` runs once
    // this thread's values are folded.
    auto columns = [&](auto combine, int buf, auto f, auto after_local) {
      using R = decltype(combine);
      Columns acc;
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
#pragma unroll
        for (int v = 0; v < VI; ++v) acc.v[c][v] = R::template identity<A>();
        const int64_t i = i0 + c * BX * VI;
        if (i >= a.view.inner) continue;
        if (IN_REGS) {
#pragma unroll
          for (int k = 0; k < HELD; ++k)
            if (k < count) {
#pragma unroll
              for (int v = 0; v < VI; ++v) acc.v[c][v] = R::apply(acc.v[c][v], f(Convert<T>::to_acc(vals[c][k].v[v]), c, v));
            }
        } else {
          const T* p = a.x + o * a.view.x_so + i * a.view.x_si + ty * a.view.x_sl;
#pragma unroll 8
          for (int64_t k = 0; k < count; ++k, p += x_step) {
            const VT x = *reinterpret_cast<const VT*>(p);
#pragma unroll
            for (int v = 0; v < VI; ++v) acc.v[c][v] = R::apply(acc.v[c][v], f(Convert<T>::to_acc(x.v[v]), c, v));
          }
        }
      }
      after_local();
      if (BY > 1) {
#pragma unroll
        for (int o = BX; o < BX * FOLD; o *= 2)
#pragma unroll
          for (int c = 0; c < CPT; ++c)
#pragma unroll
            for (int v = 0; v < VI; ++v) acc.v[c][v] = R::apply(acc.v[c][v], shfl_xor(acc.v[c][v], o));
        if (ty % FOLD == 0) {
#pragma unroll
          for (int c = 0; c < CPT; ++c)
#pragma unroll
            for (int v = 0; v < VI; ++v) part[buf][ty / FOLD][(tx + c * BX) * VI + v] = acc.v[c][v];
        }
      }
      if (BY > 1 && csize == 1) {
        __syncthreads();
#pragma unroll
        for (int c = 0; c < CPT; ++c)
#pragma unroll
          for (int v = 0; v < VI; ++v) {
            acc.v[c][v] = R::template identity<A>();
#pragma unroll
            for (int j = 0; j < ROWS; ++j) acc.v[c][v] = R::apply(acc.v[c][v], part[buf][j][(tx + c * BX) * VI + v]);
          }
      }
#ifdef NORMSCAN_CLUSTERS
      if constexpr (CLUSTERED) {
        if (csize > 1) {
          // Each block pushes its column results into every block of the cluster: remote
          // stores do not wait, and after the barrier every read is local. Double-buffered: a
          // block can be at most one reduction ahead of the cluster's readers.
          __syncthreads();  // part[buf] is complete
          for (int j = tid; j < TILE; j += NT) {
            A col = R::template identity<A>();
#pragma unroll
            for (int k = 0; k < ROWS; ++k) col = R::apply(col, part[buf][k][j]);
            for (int r = 0; r < csize; ++r)
              *cg::this_cluster().map_shared_rank(&cta_sum[buf][crank][j], r) = col;
          }
          cg::this_cluster().sync();
#pragma unroll
          for (int c = 0; c < CPT; ++c)
#pragma unroll
            for (int v = 0; v < VI; ++v) {
              acc.v[c][v] = R::template identity<A>();
              for (int r = 0; r < csize; ++r)
                acc.v[c][v] = R::apply(acc.v[c][v], cta_sum[buf][r][(tx + c * BX) * VI + v]);
            }
        }
      }
#endif
      return acc;
    };
    // The prefetch waits until every value read from the slots is consumed.
    auto prefetch_next = [&] {
      if (PREFETCH) prefetch(tile + tile_step);
    };
    Columns shift{};
    if constexpr (Op::kMaxShifted) {
      // The comparisons' max (max.NaN spilled fp32 log_softmax's clustered kernel 4 bytes).
      shift = columns(CompareMaxOp{}, 0, [](A x, int, int) { return x; }, prefetch_next);
    } else if constexpr (Op::kCentered) {
      // Each column's mean as its first element plus the mean of the differences from it
      // (as the rows kernel takes it).
      Columns pilot{};
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const int64_t i = i0 + c * BX * VI;
        if (i >= a.view.inner) continue;
        const VT first = *reinterpret_cast<const VT*>(a.x + o * a.view.x_so + i * a.view.x_si);
#pragma unroll
        for (int v = 0; v < VI; ++v) pilot.v[c][v] = Convert<T>::to_acc(first.v[v]);
      }
      shift = columns(SumOp{}, 0, [&](A x, int c, int v) { return x - pilot.v[c][v]; }, prefetch_next);
      const A inv_length = A(1) / A(a.view.length);
#pragma unroll
      for (int c = 0; c < CPT; ++c)
#pragma unroll
        for (int v = 0; v < VI; ++v) shift.v[c][v] = pilot.v[c][v] + shift.v[c][v] * inv_length;
    }
    const Columns sum = columns(SumOp{}, SHIFTED ? 1 : parity, [&](A x, int c, int v) { return Op::map(shifted<Op>(x, shift.v[c][v])); },
                                [&] {
                                  if (!SHIFTED) prefetch_next();
                                });
    // Whether there is a weight is a constant in the stores (with_flag), and the weight and bias
    // are loaded once an item, whose VI columns share its position l. Checked and loaded for
    // each element (scale_one), the 16-bit clustered kernel took 8 loads and checks a vector,
    // predicated off without a weight: about half the stores' instructions (ncu). A grouped
    // op's columns are its channels, a weight each: it keeps scale_one's (its 16-bit clustered
    // kernel spilled 4-12 bytes with either flag a constant).
    auto store_tile = [&](auto weighted) {
      constexpr bool WEIGHTED = decltype(weighted)::value;
      const bool biased = Op::kBiased && a.b != nullptr;
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        const int64_t i = i0 + c * BX * VI;
        if (i >= a.view.inner) continue;
        A scale[VI];
#pragma unroll
        for (int v = 0; v < VI; ++v) scale[v] = Op::scale(sum.v[c][v], a.view.length, a.eps);
        // A grouped op's columns are its channels (the dispatcher's condition: inner ==
        // groups, span == length), each with its own statistic.
        if constexpr (kWritesStats<Op>) {
          if (ty == 0 && crank == 0) {
#pragma unroll
            for (int v = 0; v < VI; ++v) write_stat(a, o * a.view.inner + i + v, RowScale<A>{scale[v], shift.v[c][v]}, sum.v[c][v]);
          }
        }
        auto scale_vec = [&](const VT& x, int64_t l) {
          VT out;
          if constexpr (Op::kGrouped) {
#pragma unroll
            for (int v = 0; v < VI; ++v) out.v[v] = scale_one<Op>(x.v[v], scale[v], shift.v[c][v], a.w, a.b, i + v);
          } else {
            using P = param_t<T, Op>;
            const A wl = WEIGHTED ? Convert<P>::to_acc(a.w[l]) : A(1);
            const A bl = biased ? Convert<P>::to_acc(a.b[l]) : A(0);
#pragma unroll
            for (int v = 0; v < VI; ++v) out.v[v] = scale_with<Op, WEIGHTED>(x.v[v], scale[v], shift.v[c][v], wl, biased, bl);
          }
          return out;
        };
        T* q = a.y + o * a.view.y_so + i * a.view.y_si + (l0 + ty) * a.view.y_sl;
        if (IN_REGS) {
#pragma unroll
          for (int k = 0; k < HELD; ++k, q += y_step)
            if (k < count) *reinterpret_cast<VT*>(q) = scale_vec(vals[c][k], l0 + ty + int64_t(k) * BY);
        } else {
          const T* p = a.x + o * a.view.x_so + i * a.view.x_si + ty * a.view.x_sl;
#pragma unroll 8
          for (int64_t k = 0; k < count; ++k, p += x_step, q += y_step)
            *reinterpret_cast<VT*>(q) = scale_vec(*reinterpret_cast<const VT*>(p), ty + k * BY);
        }
      }
    };
    if constexpr (Op::kGrouped) store_tile(std::false_type{});  // scale_one's checks (as constants they spilled)
    else with_flag(a.w != nullptr, [&](auto weighted) { store_tile(weighted); });
  }
#ifdef NORMSCAN_CLUSTERS
  // No block may leave while another can still read its shared memory.
  if (csize > 1) cg::this_cluster().sync();
#endif
}

}  // namespace normscan

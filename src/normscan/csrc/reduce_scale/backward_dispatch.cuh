// Picks the reduce-scale backward kernel and configuration for a view, and launches it.
// Host only; built into the family's backward extension (backward_binding.cu).
#pragma once

#include <type_traits>

#include "../device/launch.cuh"
#include "backward.cuh"
#include "policy.cuh"

namespace normscan {

// The configurations: a warp, four warps, a block or a cluster of up to 8
// (kMaxPortableCluster) a row, whichever is the first to hold it (a weighted op's clusters
// of narrow blocks first: below), then the long rows' cluster of rows in shared memory
// (which the max-shifted ops take past a block, layer_norm past its widest: below). A
// weighted op's: a persistent grid (its dw summed per block), the next rows staged. An
// unweighted op's: a block (cluster) a row group, loaded straight into registers, twice the
// resident threads; but the max-shifted ops' rows of a block, which measured slower so
// (docs/design-notes.md, "Backward"). A centered op
// (layer_norm) carries its bias's gradient too: its kernels spilled at 64 registers (a block
// a row group, when they also found the row's mean): they take the persistent grid, whose
// staged rows they read from shared memory (backward.cuh), on blocks (clusters) of 256
// threads, two a SM, where those hold the row (H100, fp32 layer_norm 32768x4096 0.703 ->
// 0.556 ms, 8192x32768 1.441 -> 1.334, with three passes and two reductions a row then: a
// block's overlap the other block's); and two warps a row where four would be half idle
// (fp32 65536x1024 0.325 -> 0.280).
template <int BLOCK, int TPR, bool CLUSTER = false>
using BackwardRows = BackwardRowsConfig<BLOCK, TPR, BackwardPolicy::kVecs,
                                        (BackwardPolicy::kThreadsSm + BLOCK - 1) / BLOCK, BackwardPolicy::kStages,
                                        CLUSTER>;
// A weighted op's clusters: pipelined (backward.cuh), each row scaled while the next one's
// sums cross the cluster, in 3 stages, 4 for 16-bit rows on 256-thread blocks (measured:
// docs/tuning-record.md, backward-pipeline-stages).
// MINB resident blocks a SM asked, clusters of up to MAX_CLUSTER blocks.
template <int BLOCK, int TPR, bool CLUSTER, int MINB, int MAX_CLUSTER>
using PipelinedConfig = BackwardRowsConfig<
    BLOCK, TPR, BackwardPolicy::kVecs, MINB, BackwardPolicy::kPipelineStages, CLUSTER, true, false, MAX_CLUSTER, true,
    BLOCK == 256 ? BackwardPolicy::kPipelineNarrowStages16 : BackwardPolicy::kPipelineStages>;
template <int BLOCK, int TPR, bool CLUSTER = false>
using PipelinedRows =
    PipelinedConfig<BLOCK, TPR, CLUSTER, (BackwardPolicy::kThreadsSm + BLOCK - 1) / BLOCK, kMaxPortableCluster>;
template <int BLOCK, int TPR, bool CLUSTER = false>
using BackwardRowsPerGroup =
    BackwardRowsConfig<BLOCK, TPR, BackwardPolicy::kVecs, (BackwardPolicy::kUnweightedThreadsSm + BLOCK - 1) / BLOCK,
                       1, CLUSTER, false>;
// The rungs of configurations an op's rows climb, in order: the first that holds a row
// takes it (a cluster rung: up to its kMaxCluster blocks).
template <typename... Cfgs> struct BackwardRungs {};
// The last rung, for rows past the others: a cluster on a persistent grid whose blocks hold
// their share of x and g in shared memory alone (twice the vectors a thread, one stage: the
// next row is not on its way) and a weighted op's weight there too: up to 8 blocks of 128 KB
// (192 KB with the weight), one a SM; the max-shifted ops', whose rows take two reductions
// each, up to 16 blocks of 64 KB, two a SM. The max-shifted ops take it for every row past
// a block, layer_norm past its widest block, the other norms only past the register
// clusters (docs/design-notes.md, "Backward").
template <int BLOCK, int CLUSTER, int NV = BackwardPolicy::kLongVecs>
using LongRows = BackwardRowsConfig<BLOCK, BLOCK, NV, 512 / BLOCK, 1, true, true, true, CLUSTER>;
template <bool SHIFTED>
using LongRung = std::conditional_t<SHIFTED, LongRows<BackwardPolicy::kLongShiftedBlock, BackwardPolicy::kLongShiftedCluster>,
                                    LongRows<BackwardPolicy::kLongBlock, BackwardPolicy::kLongCluster>>;
// A warp, four warps and a block a row, then Past.
template <template <int, int, bool> class Rows, typename Block, typename... Past>
using CommonRungs = BackwardRungs<Rows<256, 32, false>, Rows<256, 128, false>, Block, Past...>;
template <template <int, int, bool> class Rows>
using BlockRung = Rows<BackwardPolicy::kBlock, BackwardPolicy::kBlock, false>;
template <template <int, int, bool> class Rows>
using RegisterClusterRung = Rows<BackwardPolicy::kBlock, BackwardPolicy::kBlock, true>;
// A weighted op's rows past a block go to clusters of 256-thread blocks (two a SM) before
// those of the widest (measured: docs/tuning-record.md, backward-narrow-clusters).
template <template <int, int, bool> class Rows>
using NarrowClusterRung = Rows<256, 256, true>;
// A centered op's: a rung between each of the others (a row fills each rung it takes more
// than half), blocks of BackwardPolicy::kCenteredBlock threads, then a block of the widest,
// then the long rung; 16-bit rows with a weight past the widest block take clusters of the
// narrow blocks, then of the widest, then a long rung of half the vectors a thread in
// clusters of up to 16 (measured: docs/tuning-record.md, backward-centered-rungs).
using HalfLongRung = LongRows<BackwardPolicy::kLongBlock, kMaxCluster, BackwardPolicy::kLongVecs / 2>;
template <typename... Past>
using CenteredRungs = BackwardRungs<BackwardRows<256, 32>, BackwardRows<256, 64>, BackwardRows<256, 128>,
                                    BackwardRows<BackwardPolicy::kCenteredBlock, BackwardPolicy::kCenteredBlock>,
                                    BlockRung<BackwardRows>, Past...>;
// Rows with a weight past the widest block (one exchange a row, the forward's mean and rstd
// read) take pipelined clusters, one block a SM: fp32 of up to 16 of the widest blocks, then
// the long rung; 16-bit up to 8 narrow blocks, then the widest blocks' clusters (measured:
// docs/tuning-record.md, backward-centered-pipelined).
template <int BLOCK, int MAX_CLUSTER> using CenteredPipelined = PipelinedConfig<BLOCK, BLOCK, true, 1, MAX_CLUSTER>;
template <typename T, bool WEIGHTED>
using CenteredOf = std::conditional_t<
    WEIGHTED && sizeof(T) == 2,
    CenteredRungs<CenteredPipelined<BackwardPolicy::kCenteredBlock, kMaxPortableCluster>,
                  RegisterClusterRung<BackwardRows>, HalfLongRung>,
    std::conditional_t<WEIGHTED && sizeof(T) == 4,
                       CenteredRungs<CenteredPipelined<BackwardPolicy::kBlock, BackwardPolicy::kCenteredCluster>,
                                     LongRung<false>>,
                       CenteredRungs<LongRung<false>>>>;

// One backward kernel with its cluster size, launched on a persistent grid (each row group
// of it, a slot of dw_part, visits a fixed set of rows, whatever the timing) or a block
// (cluster) a row group.
template <typename T, typename Op, typename Cfg, int V, bool WEIGHTED, bool ADDS> struct BackwardRowsPlan {
  static constexpr auto kernel = reduce_scale_backward_rows_kernel<T, Op, Cfg, V, WEIGHTED, ADDS>;
  static constexpr size_t kSmem = Cfg::template smem_bytes<T, V, WEIGHTED, Op::kRowStats, param_t<T, Op>>();
  int cluster;

  int64_t units(const View& v) const { return Cfg::kCluster ? v.outer : ceil_div(v.outer, Cfg::kGroups); }
  // Rows of dw_part the launch writes: one a cluster (a block, unclustered).
  cudaError_t slots(const View& v, int64_t* out) const {
    int64_t clusters = 0;
    const cudaError_t err = grid_units<kernel>(Grid::Persistent, dim3(Cfg::kBlock), cluster, units(v), kSmem, &clusters);
    *out = clusters;
    return err;
  }
  // Clusters of it the device holds at once (0: none can run, as a non-portable size may not).
  cudaError_t resident(int64_t* out) const { return resident_units<kernel>(dim3(Cfg::kBlock), cluster, kSmem, out); }
  cudaError_t launch(const ReduceScaleBackwardArgs<T, param_t<T, Op>>& a, cudaStream_t stream) const {
    return launch_units<kernel>(Cfg::kPersistent ? Grid::Persistent : Grid::PerUnit, dim3(Cfg::kBlock), cluster,
                                units(a.view), kSmem, stream, a);
  }
};

// dw (of the weight's element type P) from the slots of dw_part, rows `stride` apart
// (reduce_scale_dw_sum_kernel): 32 columns of 8 lanes a block. early (sm_90): launched while
// the backward kernel before it still runs, its blocks waiting for that kernel's end where
// they fit beside it: the launch's latency hidden.
template <typename P>
inline cudaError_t launch_dw_sum(const acc_t<P>* part, int64_t slots, int64_t stride, int64_t length, P* dw,
                                 bool early, cudaStream_t stream) {
  constexpr int kCols = 32, kLanes = 8;
  if (length == 0) return cudaSuccess;
  return launch_units_as<reduce_scale_dw_sum_kernel<P, kCols, kLanes>>(
      Grid::PerUnit, early, dim3(kCols * kLanes), 1, ceil_div(length, kCols), 0, stream, part, slots, stride, length,
      dw);
}

// A rung that takes only the rows more than one of its blocks hold (a cluster rung before a
// block that holds them too).
template <typename Cfg> struct PastOneBlock {};
template <typename Rung> struct RungOf {
  using Config = Rung;
  static constexpr int64_t kMinBlocks = 1;
};
template <typename Cfg> struct RungOf<PastOneBlock<Cfg>> {
  using Config = Cfg;
  static constexpr int64_t kMinBlocks = 2;
};

// Whether a rung's kernel adds dh (ADDS): all but the long rows' (read from shared memory,
// their registers at the bound) and a centered op's warp a row of 16-bit rows with float32
// parameters (the weight, dw and db held): there the added vector spilled 8 bytes (ptxas,
// sm_80 and sm_90). Rows whose rung does not add it take the backward, then the add.
template <typename T, typename Op, typename Cfg>
constexpr bool kAddsInPass =
    !Cfg::kRowsInSmem && !(Op::kCentered && sizeof(param_t<T, Op>) > sizeof(T) && Cfg::kThreadsPerRow == 32);

// Calls f(plan) with the first of `rungs` that holds rows of nvec V-element vectors, with at
// most max_cluster blocks a cluster, and a non-portable cluster size or more than 48 KB of
// shared memory a block only where the device runs it (the long rows' 192 KB exceed an
// A100's 163); false where none does, or where that rung adds no dh (ADDS). *err: a failure
// to ask the device (then true, f not called).
template <typename T, typename Op, int V, bool WEIGHTED, bool ADDS, typename F, typename... Cfgs>
inline bool with_first_rung(BackwardRungs<Cfgs...>, int64_t nvec, int64_t max_cluster, cudaError_t* err, F&& f) {
  bool served = false;
  const auto holds = [&](auto rung) {
    using Cfg = typename RungOf<decltype(rung)>::Config;
    const int64_t blocks = nvec > 0 ? ceil_div(nvec, Cfg::kVecsPerBlock) : 1;  // empty rows: a block of the first
    if (blocks > min64(max_cluster, Cfg::kMaxCluster) || blocks < RungOf<decltype(rung)>::kMinBlocks) return false;
    if constexpr (ADDS && !kAddsInPass<T, Op, Cfg>) {
      return true;  // the rung that holds the row adds no dh: not served
    } else {
      const BackwardRowsPlan<T, Op, Cfg, V, WEIGHTED, ADDS> plan{static_cast<int>(blocks)};
      if (blocks > kMaxPortableCluster || plan.kSmem > 48 * 1024) {
        int64_t fit = 0;
        *err = plan.resident(&fit);
        if (*err != cudaSuccess) return served = true;
        if (fit == 0) return false;
      }
      f(plan);
      return served = true;
    }
  };
  (holds(Cfgs{}) || ...);
  return served;
}

// Calls f(plan) for the kernel that holds rows of nvec V-element vectors on a device of
// compute capability `major` (adding a.dh to dx: ADDS); false where none does (*err as
// with_first_rung's).
template <typename T, typename Op, int V, bool WEIGHTED, bool ADDS, typename F>
inline bool with_backward_rows_of(int64_t nvec, int major, cudaError_t* err, F&& f) {
  // Max-shifted ops' rows of a block stay persistent, as a weighted op's.
  using Block = std::conditional_t<WEIGHTED || Op::kMaxShifted, BlockRung<BackwardRows>, BlockRung<BackwardRowsPerGroup>>;
  // 16-bit rows of vectors past a narrow block (1025-2048 vectors) take the narrow clusters
  // before the widest block: rms_norm + w bf16 4096x16384 0.158 -> 0.151 ms (H100, tools/tune.py,
  // backward alone); fp32 rows of 2048 vectors lost so (8192x8192 0.277 -> 0.279), and rows of
  // one narrow block more (bf16 8192x8192 0.145 -> 0.148, fp32 32768x4096 0.549 -> 0.554).
  using Narrow = NarrowClusterRung<PipelinedRows>;
  using Weighted = std::conditional_t<
      (sizeof(T) == 2 && V > 1),
      CommonRungs<BackwardRows, PastOneBlock<Narrow>, Block, RegisterClusterRung<PipelinedRows>, LongRung<false>>,
      CommonRungs<BackwardRows, Block, Narrow, RegisterClusterRung<PipelinedRows>, LongRung<false>>>;
  using Unweighted = std::conditional_t<
      Op::kMaxShifted, CommonRungs<BackwardRowsPerGroup, Block, LongRung<true>>,
      CommonRungs<BackwardRowsPerGroup, Block, RegisterClusterRung<BackwardRowsPerGroup>, LongRung<false>>>;
  using Rungs =
      std::conditional_t<Op::kCentered, CenteredOf<T, WEIGHTED>, std::conditional_t<WEIGHTED, Weighted, Unweighted>>;
  return with_first_rung<T, Op, V, WEIGHTED, ADDS>(Rungs{}, nvec, major >= 9 ? kMaxCluster : 1, err, f);
}

// Calls f(plan) for the backward kernel of these arguments: rows (x, g, dx contiguous
// along the reduced dim) held on chip, in 16-byte vectors where every row of the three
// (and the weight, and dh) starts aligned and holds whole vectors. False where no kernel
// serves them (every layout, for an op without a fused backward; rows of dh not of whole
// vectors). *err: a failure to ask the device which cluster it runs (then true, f not called).
template <typename T, typename Op, typename F>
inline bool with_reduce_scale_backward(const ReduceScaleBackwardArgs<T, param_t<T, Op>>& a, int major, cudaError_t* err,
                                       F&& f) {
  if constexpr (!Op::kFusedBackward) {
    return false;
  } else {
    constexpr int V = vec16<T>();
    const View& v = a.view;
    if (!v.rows()) return false;
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = v.length % V == 0 && aligned(a.x) && aligned(a.g) && aligned(a.dx) && aligned(a.w) &&
                     aligned(a.dh) &&
                     (v.outer == 1 || (v.x_so % V == 0 && v.y_so % V == 0 && a.g_so % V == 0 && a.dh_so % V == 0));
    if (a.dh != nullptr) {
      if constexpr (Op::kFusedRowForms) {
        if (!vec) return false;
        return a.w != nullptr ? with_backward_rows_of<T, Op, V, true, true>(v.length / V, major, err, f)
                              : with_backward_rows_of<T, Op, V, false, true>(v.length / V, major, err, f);
      }
      return false;
    }
    if constexpr (Op::kWeighted) {
      if (a.w != nullptr) {
        return vec ? with_backward_rows_of<T, Op, V, true, false>(v.length / V, major, err, f)
                   : with_backward_rows_of<T, Op, 1, true, false>(v.length, major, err, f);
      }
    }
    return vec ? with_backward_rows_of<T, Op, V, false, false>(v.length / V, major, err, f)
               : with_backward_rows_of<T, Op, 1, false, false>(v.length, major, err, f);
  }
}

}  // namespace normscan

// The reduce-scale configurations the dispatcher picks, built from policy.cuh's numbers, each
// with a line on what chose it and where its measurements are (docs/tuning-record.md).
#pragma once

#include <type_traits>

#include "../device/launch.cuh"
#include "channels.cuh"
#include "held.cuh"
#include "policy.cuh"
#include "rows.cuh"
#include "slab.cuh"
#include "strided.cuh"

namespace normscan {

// ---------------------------------------------------------------- rows (inner == 1)
// Rows up to 1024 vectors: the fewest threads a row that hold it in 4 vectors each; rows of
// 1025-4096 vectors: 8 a thread where that does not spill, so that a SM holds two blocks or more
// (kRowsEightVecs) (measured: docs/tuning-record.md, reduce_scale-1).
template <typename T, typename Op>
constexpr bool kRowsEightVecs = sizeof(T) == 4   ? !Op::kGrouped
                                : sizeof(T) == 2 ? !(Op::kWeighted || Op::kCentered || Op::kGrouped)
                                                 : Op::kMaxShifted;
using RowsOneWarp = RowsConfig<256, 32, 4, 0, 4>;
using RowsTwoWarps = RowsConfig<256, 64, 4, 0, 4>;
using RowsFourWarps = RowsConfig<256, 128, 4, 0, 4>;
using RowsEightWarps = RowsConfig<256, 256, 4, 0, 4>;
// Rows that spill at 8 vectors a thread hold 4 in registers and 4 in shared memory on the same
// blocks (measured: docs/tuning-record.md, reduce_scale-2), but the grouped ops' 16-bit and
// fp64 rows, which keep twice the threads of 4 (one block of 1024 a SM at 2049-4096 vectors)
// (measured: docs/tuning-record.md, reduce_scale-3).
template <typename T, typename Op> constexpr bool kRowsSplitHeld = !Op::kGrouped || sizeof(T) == 4;
// Rows of up to 8 * BLOCK vectors: BLOCK threads of 8 (1024 / BLOCK blocks a SM), or of 4 and 4
// in shared memory, or else twice the threads of 4.
template <typename T, typename Op, int BLOCK>
using RowsOfEightVecs = std::conditional_t<
    kRowsEightVecs<T, Op>, RowsConfig<BLOCK, BLOCK, 8, 0, 1024 / BLOCK>,
    std::conditional_t<kRowsSplitHeld<T, Op>, RowsConfig<BLOCK, BLOCK, 4, 4, 1024 / BLOCK>,
                       RowsConfig<2 * BLOCK, 2 * BLOCK, 4, 0, 512 / BLOCK>>>;
template <typename T, typename Op> using RowsOf2048 = RowsOfEightVecs<T, Op, 256>;
template <typename T, typename Op> using RowsOf4096 = RowsOfEightVecs<T, Op, 512>;
// Longer rows: a cluster of up to 8 blocks of 512 threads, 16 vectors a thread, those beyond the
// registers in shared memory (KernelBench 38 and 39 at 97.9% of copy) (measured:
// docs/tuning-record.md, reduce_scale-4).
// A biased op's bias is loaded in the weight's batches (RowsPolicy::kWeightBatch vectors).
template <typename T, typename Op>
constexpr int kRowsWeightBatch =
    std::is_same<T, float>::value && Op::kWeighted && !Op::kGrouped ? RowsPolicy::kWeightBatch : 0;
// Clustered rows with a weight and no bias run on a persistent grid, fp32 rows filling the next
// row's slots during their stores (measured: docs/tuning-record.md, reduce_scale-5).
template <typename Op> constexpr bool kRowsWeightedPersistent = Op::kWeighted && !Op::kBiased;
// fp32 softmax rows on clusters take the persistent grid where the device's DRAM feeds a SM fast:
// faster on the H200, slower on the H100 (measured: docs/tuning-record.md, reduce_scale-6).
template <typename T, typename Op> inline bool rows_persistent_softmax(const DeviceInfo& d) {
  if constexpr (std::is_same<T, float>::value && Op::kMaxShifted)
    return RowsPolicy::kSoftmaxPersistent < 0 ? fast_dram(d) : RowsPolicy::kSoftmaxPersistent > 0;
  else
    return false;
}
// Register vectors of a cluster's block (above: fp32 5, others 4; layer_norm's fp32 2).
template <typename T, typename Op>
constexpr int kRowsClusterRegVecs =
    sizeof(T) != 4 ? 4 : (Op::kBiased && kRowsWeightBatch<T, Op> > 0 ? RowsPolicy::kBiasedRegVecs : 5);
template <typename T, typename Op>
using RowsCluster = RowsConfig<RowsPolicy::kClusterBlock, RowsPolicy::kClusterBlock, kRowsClusterRegVecs<T, Op>,
                               RowsPolicy::kHeld - kRowsClusterRegVecs<T, Op>, 1024 / RowsPolicy::kClusterBlock, true,
                               sizeof(T) == 4 && (Op::kMaxShifted || kRowsWeightedPersistent<Op>),
                               kRowsWeightBatch<T, Op>>;
// Up to this many blocks a cluster, the fewest that hold the row; longer rows are held across the
// GPU (held.cuh) (measured: docs/tuning-record.md, reduce_scale-7).
constexpr int kRowsMaxCluster = RowsPolicy::kMaxCluster;
// The fp32 norms (not the max-shifted softmaxes): their long rows measure best held.
template <typename T, typename Op> constexpr bool kFp32Norm = std::is_same<T, float>::value && !Op::kMaxShifted;
// fp32 rows of the norms (not the softmaxes), but those whose weight the persistent cluster keeps
// on chip, are held past RowsPolicy::kMaxClusterHeldSooner blocks (measured: docs/tuning-record.md,
// reduce_scale-8).
template <typename T, typename Op> inline int rows_max_cluster(const ArgsFor<T, Op>& a) {
  const bool held_sooner = kFp32Norm<T, Op> && !(kRowsWeightedPersistent<Op> && a.w != nullptr);
  return held_sooner ? RowsPolicy::kMaxClusterHeldSooner : kRowsMaxCluster;
}
// Rows longer still, or whose x and y are aligned differently: read twice, one block of
// RowsPolicy::kRereadBlock threads a row (and the split kernels', below, and batch_norm's
// channels a block).
constexpr int kRereadBlock = RowsPolicy::kRereadBlock;
// batch_norm's channels go one a cluster where the resident blocks' shares fit
// GroupedPolicy::kRereadL2Percent of L2 (the second pass reads L2); else to the split kernels
// (measured: docs/tuning-record.md, reduce_scale-9). Their blocks: 512 threads, or 128 for
// statistics of fewer vectors than GroupedPolicy::kRereadSmallVectors a thread (faster on small
// channels, H200) (measured: docs/tuning-record.md, reduce_scale-10).
constexpr int kGroupRereadBlock = 512, kGroupRereadSmallBlock = 128;
// Or held in shared memory (the kernel's HELD), on the fewest blocks of a cluster that hold a
// statistic and fill the GPU (measured: docs/tuning-record.md, reduce_scale-11).
constexpr int kGroupHeldBlock = GroupedPolicy::kHeldBlock, kGroupHeldSmallBlock = 128;
constexpr int kGroupHeldVecs = GroupedPolicy::kHeldVecs;
// Rows fewer than the blocks the GPU holds at once split across blocks, as many summing a row as
// fill the GPU in one wave (KernelBench 37) (measured: docs/tuning-record.md, reduce_scale-12).
constexpr int64_t kSplitMinTiles = 4;
// Blocks summing each of `units` rows (or slabs) of nvec vectors, tiles of `tile`: as many as
// fill the `resident` blocks, each at least kSplitMinTiles tiles; 1 where the units fill them.
inline int64_t split_parts(int64_t units, int64_t nvec, int64_t tile, int64_t resident) {
  const int64_t parts = units >= resident ? 1 : min64(resident / units, ceil_div(nvec, tile) / kSplitMinTiles);
  return parts > 1 ? parts : 1;
}
inline RowSplitting split_rows(int64_t rows, int64_t nvec, int64_t resident, bool grouped) {
  const int64_t tile = kRereadTile<kRereadBlock>,
                span = tile * (grouped ? RowsPolicy::kSplitSpanTilesGrouped : RowsPolicy::kSplitSpanTiles);
  const int64_t parts = split_parts(rows, nvec, tile, resident);
  // One span at least: span 0 also scales the row's edges (rows shorter than a vector that
  // share statistics, batch_norm's, are split too).
  return RowSplitting{parts, nvec > 0 ? ceil_div(nvec, span) : 1, span};
}

// Aligned rows longer than a cluster holds are held across the GPU in parts, two buffers a block
// (KernelBench 35 and 40, against reading them twice) (measured: docs/tuning-record.md,
// reduce_scale-13).
// Rows of at most HeldPolicy::kSplitPercent % as many parts as resident blocks go to the split
// kernel (held.cuh), longer ones to the serial kernel (0: none split; 200: all) (measured:
// docs/tuning-record.md, reduce_scale-14).
// The split kernel's summing warps of 16 on large parts: 8 the fastest of 4, 8 and 12 on
// KernelBench 35 (measured: docs/tuning-record.md, reduce_scale-held-warps).
// Parts of BLOCK x VECS vectors; the split kernel's first SUMMING threads sum, the others scale.
template <int BLOCK, int VECS, int SUMMING> struct HeldConfig {
  static constexpr int kBlock = BLOCK, kVecs = VECS, kSumming = SUMMING;
};
using HeldLargeParts = HeldConfig<512, 6, 32 * HeldPolicy::kSummingWarps>;
using HeldSmallParts = HeldConfig<256, 8, 128>;
template <typename T, typename Op>
using HeldFor = std::conditional_t<sizeof(T) == 2 || (sizeof(T) == 4 && Op::kMaxShifted), HeldSmallParts, HeldLargeParts>;
// fp32 norm rows with HeldPolicy::kSmParts parts a resident block or more take parts twice as large, one block of 1024
// threads a SM (KernelBench 34 and 35) (measured: docs/tuning-record.md, reduce_scale-15).
using HeldSmParts = HeldConfig<1024, 6, 512>;

// batch_norm's channels are taken by the whole GPU one after another where each is at least
// GroupedPolicy::kChannelsMinRatio times what the blocks hold; smaller ones measured slower so (measured:
// docs/tuning-record.md, reduce_scale-16).
// GroupedPolicy::kChannelsMaxHeld, the tiles a block holds at most (14 fit): 12 the fastest of 10-14 on KernelBench 33 (measured:
// docs/tuning-record.md, reduce_scale-channels-held).
// Blocks taking alternate channels (STREAMS) and their size, by the device's DRAM: two streams of
// 512 threads on the H200, one of 1024 on the H100 (KernelBench 33) (measured:
// docs/tuning-record.md, reduce_scale-17).
template <int BLOCK, int STREAMS> struct ChannelsConfig {
  static constexpr int kBlock = BLOCK, kStreams = STREAMS;
};
using ChannelsOneStream = ChannelsConfig<1024, 1>;
using ChannelsTwoStreams = ChannelsConfig<512, 2>;
inline bool channels_two_streams(const DeviceInfo& d) {
  return GroupedPolicy::kChannelsTwoStreams < 0 ? fast_dram(d) : GroupedPolicy::kChannelsTwoStreams > 0;
}

// ---------------------------------------------------------------- strided (inner > 1)
// Each config holds BY * ITEMS positions of the reduced dim a block (kHeld). 16-byte vectors along
// inner (inner contiguous and aligned), up to 16 a thread (256 bytes) (measured:
// docs/tuning-record.md, reduce_scale-18).
template <typename T>
using StridedVecFew = StridedConfig<StridedPolicy::kVecBx, 1, 4, true, sizeof(T) == 2 ? StridedPolicy::kFewCpt16 : StridedPolicy::kFewCpt,
                                    vec16<T>(), StridedPolicy::kMinBlocks>;
template <typename T> using StridedVecShort = StridedConfig<StridedPolicy::kVecBx, 1, 16, true, 1, vec16<T>(), StridedPolicy::kMinBlocks>;
template <typename T> using StridedVecMedium = StridedConfig<StridedPolicy::kVecBx, 4, 16, true, 1, vec16<T>(), StridedPolicy::kMinBlocks>;
// Columns up to 256 in one block of 16 x 16 threads (16 along them), no cluster (measured:
// docs/tuning-record.md, reduce_scale-19).
template <typename T>
using StridedVecTall = StridedConfig<16, 16, 16, true, 1, vec16<T>(), StridedPolicy::kMinBlocks, LaunchedOn::kSm90On>;
// Columns of 257-1024 in one block of 4 x 64 threads (a position's 64 bytes a tile; 64 KB of x in
// flight, two blocks a SM), no cluster (measured: docs/tuning-record.md, reduce_scale-20).
template <typename T>
using StridedVecTaller = StridedConfig<4, 64, 16, true, 1, vec16<T>(), StridedPolicy::kMinBlocks, LaunchedOn::kSm90On>;
// Columns of 65-128 where the tall blocks are not built (before sm_90): one block of 16 x 8
// threads; 16-bit types spilled there and take the scalar kernels (measured: docs/tuning-record.md,
// reduce_scale-21).
template <typename T>
using StridedVecPreSm90 = StridedConfig<16, 8, 16, true, 1, vec16<T>(), StridedPolicy::kMinBlocks, LaunchedOn::kBeforeSm90>;
// Scalar columns (odd inner, unaligned): items held per thread in 32-bit registers' worth (doubles
// take two) (measured: docs/tuning-record.md, reduce_scale-22).
template <typename T> constexpr int kStridedRegs = sizeof(T) > 4 ? 2 : 1;
// Centered ops (layer_norm) take half the columns: their means spilled 16 a thread.
template <typename T, typename Op>
using StridedFew = StridedConfig<StridedPolicy::kBx, 1, 4 / kStridedRegs<T>, true, (Op::kCentered ? 8 : 16) / kStridedRegs<T>,
                                 1, StridedPolicy::kMinBlocks>;
template <typename T> using StridedShort = StridedConfig<StridedPolicy::kBx, 1, 64 / kStridedRegs<T>, true, 1, 1, StridedPolicy::kMinBlocks>;
template <typename T>
using StridedCluster = StridedConfig<32, 8, 64 / kStridedRegs<T>, true, 1, 1, StridedPolicy::kMinBlocks, LaunchedOn::kEvery, true>;
// Longer columns are read twice (the second time partly from L2).
template <typename T> using StridedVecReread = StridedConfig<32, 8, 1, false, 1, vec16<T>(), StridedPolicy::kMinBlocks>;
using StridedReread = StridedConfig<32, 32, 1, false, 1, 1, 1>;
// Max-shifted ops have no 1024-thread blocks (measured: docs/tuning-record.md, reduce_scale-23).
template <typename Op> constexpr bool kThousandThreads = !Op::kMaxShifted;
template <typename T, typename Op>
using StridedRereadOf = std::conditional_t<kThousandThreads<Op>, StridedReread, StridedConfig<32, 16, 1, false, 1, 1, 1>>;
constexpr int kStridedMaxCluster = 8;  // long columns' clusters (without, read twice)

// ---------------------------------------------------------------- slabs (slab.cuh)
// Views with 2 to SlabPolicy::kMaxColumns columns beside the dim go to the slab kernels rather than the strided
// ones (0: none do; dispatch.cuh has the exceptions) (measured: docs/tuning-record.md,
// reduce_scale-24).
// Few columns beside the dim: the slab kernels measured 6-2650x faster than the strided ones
// (rms_norm and softmax, fp32) (measured: docs/tuning-record.md, reduce_scale-25).
constexpr int kSlabBlock = 256;
// Slabs of at most SlabPolicy::kWarpVecs vectors take a warp each: (4096, 256, 4) (256 vectors a slab) on
// a block a slab -> a warp, rms_norm 0.021 -> 0.014 ms, softmax 0.053 -> 0.016.
// Slabs fewer than the blocks the GPU holds at once are each summed by as many blocks as fill it
// (split_parts); spans of SlabPolicy::kSpanTiles tiles scale them (measured:
// docs/tuning-record.md, reduce_scale-26).
// A slab is split into at least SlabPolicy::kMinParts parts, else one block reads it (measured:
// docs/tuning-record.md, reduce_scale-27).
inline SlabSplitting split_slabs(int64_t slabs, int64_t nvec, int w, int cvs, int64_t resident) {
  const int stride = kSlabBlock - kSlabBlock % cvs;  // threads at work: whole positions
  const int64_t tile = int64_t(stride) * slab_unroll(w), span = tile * SlabPolicy::kSpanTiles;
  const int64_t parts = split_parts(slabs, nvec, tile, resident);
  return SlabSplitting{nvec, parts >= SlabPolicy::kMinParts ? parts : 1, ceil_div(nvec, span), span, cvs, stride};
}

}  // namespace normscan

// The reduce-scale configurations the dispatcher picks, each with a line on what chose it and
// where its measurements are (docs/tuning-record.md). The -D hooks are for tools/tune.py, which
// builds variants side by side; the defaults are the measured best.
#pragma once

#include <type_traits>

#include "../device/launch.cuh"
#include "channels.cuh"
#include "held.cuh"
#include "rows.cuh"
#include "slab.cuh"
#include "strided.cuh"

#ifndef NORMSCAN_ROWS_CLUSTER_BLOCK  // threads per block when a cluster holds a long row
#define NORMSCAN_ROWS_CLUSTER_BLOCK 512
#endif
#ifndef NORMSCAN_ROWS_HELD  // vectors per thread, registers and shared memory, for long rows
#define NORMSCAN_ROWS_HELD 16
#endif
#ifndef NORMSCAN_ROWS_WEIGHT_BATCH  // fp32 weight vectors loaded at a time ahead of their stores (clustered rows)
#define NORMSCAN_ROWS_WEIGHT_BATCH 2
#endif
#ifndef NORMSCAN_STRIDED_BX  // positions along inner per block in the short-length strided kernels
#define NORMSCAN_STRIDED_BX 256
#endif
#ifndef NORMSCAN_STRIDED_VEC_BX  // threads along inner per block in the short-length vector kernels
#define NORMSCAN_STRIDED_VEC_BX 64
#endif
#ifndef NORMSCAN_STRIDED_MINB  // resident blocks per SM asked of the register-held strided kernels
#define NORMSCAN_STRIDED_MINB 2
#endif
#ifndef NORMSCAN_STRIDED_FEW_CPT  // column vectors a thread in the few-position vector kernel: 32- and 64-bit types
#define NORMSCAN_STRIDED_FEW_CPT 2
#endif
#ifndef NORMSCAN_STRIDED_FEW_CPT16  // the same, 16-bit types
#define NORMSCAN_STRIDED_FEW_CPT16 1
#endif

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
// A biased op's bias is loaded in the weight's batches.
#ifndef NORMSCAN_ROWS_BIASED_REG_VECS  // its rows' register vectors
#define NORMSCAN_ROWS_BIASED_REG_VECS 2
#endif
template <typename T, typename Op>
constexpr int kRowsWeightBatch =
    std::is_same<T, float>::value && Op::kWeighted && !Op::kGrouped ? NORMSCAN_ROWS_WEIGHT_BATCH : 0;
// Clustered rows with a weight and no bias run on a persistent grid, fp32 rows filling the next
// row's slots during their stores (measured: docs/tuning-record.md, reduce_scale-5).
template <typename Op> constexpr bool kRowsWeightedPersistent = Op::kWeighted && !Op::kBiased;
// fp32 softmax rows on clusters take the persistent grid where the device's DRAM feeds a SM fast:
// faster on the H200, slower on the H100 (measured: docs/tuning-record.md, reduce_scale-6).
#ifndef NORMSCAN_ROWS_SOFTMAX_PERSISTENT  // 1: every device, 0: none, -1: those with fast DRAM
#define NORMSCAN_ROWS_SOFTMAX_PERSISTENT -1
#endif
template <typename T, typename Op> inline bool rows_persistent_softmax(const DeviceInfo& d) {
  if constexpr (std::is_same<T, float>::value && Op::kMaxShifted)
    return NORMSCAN_ROWS_SOFTMAX_PERSISTENT < 0 ? fast_dram(d) : NORMSCAN_ROWS_SOFTMAX_PERSISTENT > 0;
  else
    return false;
}
// Register vectors of a cluster's block (above: fp32 5, others 4; layer_norm's fp32 2).
template <typename T, typename Op>
constexpr int kRowsClusterRegVecs =
    sizeof(T) != 4 ? 4 : (Op::kBiased && kRowsWeightBatch<T, Op> > 0 ? NORMSCAN_ROWS_BIASED_REG_VECS : 5);
template <typename T, typename Op>
using RowsCluster = RowsConfig<NORMSCAN_ROWS_CLUSTER_BLOCK, NORMSCAN_ROWS_CLUSTER_BLOCK, kRowsClusterRegVecs<T, Op>,
                               NORMSCAN_ROWS_HELD - kRowsClusterRegVecs<T, Op>, 1024 / NORMSCAN_ROWS_CLUSTER_BLOCK, true,
                               sizeof(T) == 4 && (Op::kMaxShifted || kRowsWeightedPersistent<Op>),
                               kRowsWeightBatch<T, Op>>;
// Up to this many blocks a cluster, the fewest that hold the row; longer rows are held across the
// GPU (held.cuh) (measured: docs/tuning-record.md, reduce_scale-7).
#ifndef NORMSCAN_ROWS_MAX_CLUSTER
#define NORMSCAN_ROWS_MAX_CLUSTER 8
#endif
constexpr int kRowsMaxCluster = NORMSCAN_ROWS_MAX_CLUSTER;
// The fp32 norms (not the max-shifted softmaxes): their long rows measure best held.
template <typename T, typename Op> constexpr bool kFp32Norm = std::is_same<T, float>::value && !Op::kMaxShifted;
// fp32 rows of the norms (not the softmaxes), but those whose weight the persistent cluster keeps
// on chip, are held from beyond this many blocks on (measured: docs/tuning-record.md,
// reduce_scale-8).
#ifndef NORMSCAN_ROWS_MAX_CLUSTER_HELD_SOONER
#define NORMSCAN_ROWS_MAX_CLUSTER_HELD_SOONER 2
#endif
template <typename T, typename Op> inline int rows_max_cluster(const ArgsFor<T, Op>& a) {
  const bool held_sooner = kFp32Norm<T, Op> && !(kRowsWeightedPersistent<Op> && a.w != nullptr);
  return held_sooner ? NORMSCAN_ROWS_MAX_CLUSTER_HELD_SOONER : kRowsMaxCluster;
}
// Rows longer still, or whose x and y are aligned differently: read twice, one block of
// this many threads a row (and the split kernels', below, and batch_norm's channels a block).
#ifndef NORMSCAN_REREAD_BLOCK
#define NORMSCAN_REREAD_BLOCK 512
#endif
constexpr int kRereadBlock = NORMSCAN_REREAD_BLOCK;
// batch_norm's channels go one a cluster where the resident blocks' shares fit this percentage of
// L2 (the second pass reads L2); else to the split kernels (measured: docs/tuning-record.md,
// reduce_scale-9).
#ifndef NORMSCAN_GROUP_REREAD_L2_PERCENT
#define NORMSCAN_GROUP_REREAD_L2_PERCENT 50
#endif
// Their blocks: 512 threads, or 128 for statistics of fewer vectors than this many a thread (faster
// on small channels, H200) (measured: docs/tuning-record.md, reduce_scale-10).
#ifndef NORMSCAN_GROUP_REREAD_SMALL_VECTORS
#define NORMSCAN_GROUP_REREAD_SMALL_VECTORS 16
#endif
constexpr int kGroupRereadBlock = 512, kGroupRereadSmallBlock = 128;
// Or held in shared memory (the kernel's HELD), on the fewest blocks of a cluster that hold a
// statistic and fill the GPU (measured: docs/tuning-record.md, reduce_scale-11).
#ifndef NORMSCAN_GROUP_HELD_BLOCK
#define NORMSCAN_GROUP_HELD_BLOCK 256
#endif
#ifndef NORMSCAN_GROUP_HELD_VECS
#define NORMSCAN_GROUP_HELD_VECS 16
#endif
#ifndef NORMSCAN_GROUP_HELD_SMALL_BLOCKS
#define NORMSCAN_GROUP_HELD_SMALL_BLOCKS 2
#endif
constexpr int kGroupHeldBlock = NORMSCAN_GROUP_HELD_BLOCK, kGroupHeldSmallBlock = 128;
constexpr int kGroupHeldVecs = NORMSCAN_GROUP_HELD_VECS;
// Rows fewer than the blocks the GPU holds at once split across blocks, as many summing a row as
// fill the GPU in one wave (KernelBench 37) (measured: docs/tuning-record.md, reduce_scale-12).
#ifndef NORMSCAN_SPLIT_SPAN_TILES
#define NORMSCAN_SPLIT_SPAN_TILES 1
#endif
#ifndef NORMSCAN_SPLIT_SPAN_TILES_GROUPED
#define NORMSCAN_SPLIT_SPAN_TILES_GROUPED 4
#endif
constexpr int64_t kSplitMinTiles = 4;
// Blocks summing each of `units` rows (or slabs) of nvec vectors, tiles of `tile`: as many as
// fill the `resident` blocks, each at least kSplitMinTiles tiles; 1 where the units fill them.
inline int64_t split_parts(int64_t units, int64_t nvec, int64_t tile, int64_t resident) {
  const int64_t parts = units >= resident ? 1 : min64(resident / units, ceil_div(nvec, tile) / kSplitMinTiles);
  return parts > 1 ? parts : 1;
}
inline RowSplitting split_rows(int64_t rows, int64_t nvec, int64_t resident, bool grouped) {
  const int64_t tile = kRereadTile<kRereadBlock>,
                span = tile * (grouped ? NORMSCAN_SPLIT_SPAN_TILES_GROUPED : NORMSCAN_SPLIT_SPAN_TILES);
  const int64_t parts = split_parts(rows, nvec, tile, resident);
  // One span at least: span 0 also scales the row's edges (rows shorter than a vector that
  // share statistics, batch_norm's, are split too).
  return RowSplitting{parts, nvec > 0 ? ceil_div(nvec, span) : 1, span};
}

// Aligned rows longer than a cluster holds are held across the GPU in parts, two buffers a block
// (KernelBench 35 and 40, against reading them twice) (measured: docs/tuning-record.md,
// reduce_scale-13).
// Rows of at most NORMSCAN_HELD_SPLIT_PERCENT % as many parts as resident blocks go to the split
// kernel (held.cuh), longer ones to the serial kernel (0: none split; 200: all) (measured:
// docs/tuning-record.md, reduce_scale-14).
#ifndef NORMSCAN_HELD_SPLIT_PERCENT
#define NORMSCAN_HELD_SPLIT_PERCENT 100
#endif
// The split kernel's summing warps of 16 on large parts: 8 the fastest of 4, 8 and 12 on
// KernelBench 35 (measured: docs/tuning-record.md, reduce_scale-held-warps).
#ifndef NORMSCAN_HELD_SUMMING_WARPS
#define NORMSCAN_HELD_SUMMING_WARPS 8
#endif
// Parts of BLOCK x VECS vectors; the split kernel's first SUMMING threads sum, the others scale.
template <int BLOCK, int VECS, int SUMMING> struct HeldConfig {
  static constexpr int kBlock = BLOCK, kVecs = VECS, kSumming = SUMMING;
};
using HeldLargeParts = HeldConfig<512, 6, 32 * NORMSCAN_HELD_SUMMING_WARPS>;
using HeldSmallParts = HeldConfig<256, 8, 128>;
template <typename T, typename Op>
using HeldFor = std::conditional_t<sizeof(T) == 2 || (sizeof(T) == 4 && Op::kMaxShifted), HeldSmallParts, HeldLargeParts>;
// fp32 norm rows with enough parts a resident block take parts twice as large, one block of 1024
// threads a SM (KernelBench 34 and 35) (measured: docs/tuning-record.md, reduce_scale-15).
#ifndef NORMSCAN_HELD_SM_PARTS
#define NORMSCAN_HELD_SM_PARTS 256
#endif
using HeldSmParts = HeldConfig<1024, 6, 512>;

// batch_norm's channels are taken by the whole GPU one after another where each is at least this
// many times what the blocks hold; smaller ones measured slower so (measured:
// docs/tuning-record.md, reduce_scale-16).
#ifndef NORMSCAN_CHANNELS_MIN_RATIO
#define NORMSCAN_CHANNELS_MIN_RATIO 2
#endif
// Tiles a block holds, at most (14 fit): 12 the fastest of 10-14 on KernelBench 33 (measured:
// docs/tuning-record.md, reduce_scale-channels-held).
#ifndef NORMSCAN_CHANNELS_MAX_HELD
#define NORMSCAN_CHANNELS_MAX_HELD 12
#endif
// Blocks taking alternate channels (STREAMS) and their size, by the device's DRAM: two streams of
// 512 threads on the H200, one of 1024 on the H100 (KernelBench 33) (measured:
// docs/tuning-record.md, reduce_scale-17).
template <int BLOCK, int STREAMS> struct ChannelsConfig {
  static constexpr int kBlock = BLOCK, kStreams = STREAMS;
};
using ChannelsOneStream = ChannelsConfig<1024, 1>;
using ChannelsTwoStreams = ChannelsConfig<512, 2>;
#ifndef NORMSCAN_CHANNELS_TWO_STREAMS  // 1: every device takes two streams, 0: none, -1: those with fast DRAM
#define NORMSCAN_CHANNELS_TWO_STREAMS -1
#endif
inline bool channels_two_streams(const DeviceInfo& d) {
  return NORMSCAN_CHANNELS_TWO_STREAMS < 0 ? fast_dram(d) : NORMSCAN_CHANNELS_TWO_STREAMS > 0;
}

// ---------------------------------------------------------------- strided (inner > 1)
// Each config holds BY * ITEMS positions of the reduced dim a block (kHeld). 16-byte vectors along
// inner (inner contiguous and aligned), up to 16 a thread (256 bytes) (measured:
// docs/tuning-record.md, reduce_scale-18).
template <typename T>
using StridedVecFew = StridedConfig<NORMSCAN_STRIDED_VEC_BX, 1, 4, true, sizeof(T) == 2 ? NORMSCAN_STRIDED_FEW_CPT16 : NORMSCAN_STRIDED_FEW_CPT,
                                    vec16<T>(), NORMSCAN_STRIDED_MINB>;
template <typename T> using StridedVecShort = StridedConfig<NORMSCAN_STRIDED_VEC_BX, 1, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB>;
template <typename T> using StridedVecMedium = StridedConfig<NORMSCAN_STRIDED_VEC_BX, 4, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB>;
// Columns up to 256 in one block of 16 x 16 threads (16 along them), no cluster (measured:
// docs/tuning-record.md, reduce_scale-19).
template <typename T>
using StridedVecTall = StridedConfig<16, 16, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB, LaunchedOn::kSm90On>;
// Columns of 257-1024 in one block of 4 x 64 threads (a position's 64 bytes a tile; 64 KB of x in
// flight, two blocks a SM), no cluster (measured: docs/tuning-record.md, reduce_scale-20).
template <typename T>
using StridedVecTaller = StridedConfig<4, 64, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB, LaunchedOn::kSm90On>;
// Columns of 65-128 where the tall blocks are not built (before sm_90): one block of 16 x 8
// threads; 16-bit types spilled there and take the scalar kernels (measured: docs/tuning-record.md,
// reduce_scale-21).
template <typename T>
using StridedVecPreSm90 = StridedConfig<16, 8, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB, LaunchedOn::kBeforeSm90>;
// Scalar columns (odd inner, unaligned): items held per thread in 32-bit registers' worth (doubles
// take two) (measured: docs/tuning-record.md, reduce_scale-22).
template <typename T> constexpr int kStridedRegs = sizeof(T) > 4 ? 2 : 1;
// Centered ops (layer_norm) take half the columns: their means spilled 16 a thread.
template <typename T, typename Op>
using StridedFew = StridedConfig<NORMSCAN_STRIDED_BX, 1, 4 / kStridedRegs<T>, true, (Op::kCentered ? 8 : 16) / kStridedRegs<T>,
                                 1, NORMSCAN_STRIDED_MINB>;
template <typename T> using StridedShort = StridedConfig<NORMSCAN_STRIDED_BX, 1, 64 / kStridedRegs<T>, true, 1, 1, NORMSCAN_STRIDED_MINB>;
template <typename T>
using StridedCluster = StridedConfig<32, 8, 64 / kStridedRegs<T>, true, 1, 1, NORMSCAN_STRIDED_MINB, LaunchedOn::kEvery, true>;
// Longer columns are read twice (the second time partly from L2).
template <typename T> using StridedVecReread = StridedConfig<32, 8, 1, false, 1, vec16<T>(), NORMSCAN_STRIDED_MINB>;
using StridedReread = StridedConfig<32, 32, 1, false, 1, 1, 1>;
// Max-shifted ops have no 1024-thread blocks (measured: docs/tuning-record.md, reduce_scale-23).
template <typename Op> constexpr bool kThousandThreads = !Op::kMaxShifted;
template <typename T, typename Op>
using StridedRereadOf = std::conditional_t<kThousandThreads<Op>, StridedReread, StridedConfig<32, 16, 1, false, 1, 1, 1>>;
constexpr int kStridedMaxCluster = 8;  // long columns' clusters (without, read twice)

// ---------------------------------------------------------------- slabs (slab.cuh)
// Views with 2 to this many columns beside the dim go to the slab kernels rather than the strided
// ones (0: none do; dispatch.cuh has the exceptions) (measured: docs/tuning-record.md,
// reduce_scale-24).
#ifndef NORMSCAN_SLAB_MAX_COLUMNS
#define NORMSCAN_SLAB_MAX_COLUMNS 1024
#endif
// Few columns beside the dim: the slab kernels measured 6-2650x faster than the strided ones
// (rms_norm and softmax, fp32) (measured: docs/tuning-record.md, reduce_scale-25).
constexpr int kSlabBlock = 256;
// Slabs of at most this many vectors take a warp each: (4096, 256, 4) (256 vectors a slab) on
// a block a slab -> a warp, rms_norm 0.021 -> 0.014 ms, softmax 0.053 -> 0.016.
#ifndef NORMSCAN_SLAB_WARP_VECS
#define NORMSCAN_SLAB_WARP_VECS 512
#endif
// Slabs fewer than the blocks the GPU holds at once are each summed by as many blocks as fill it
// (split_parts); spans of NORMSCAN_SLAB_SPAN_TILES tiles scale them (measured:
// docs/tuning-record.md, reduce_scale-26).
#ifndef NORMSCAN_SLAB_SPAN_TILES
#define NORMSCAN_SLAB_SPAN_TILES 4
#endif
// A slab is split into at least NORMSCAN_SLAB_MIN_PARTS parts, else one block reads it (measured:
// docs/tuning-record.md, reduce_scale-27).
#ifndef NORMSCAN_SLAB_MIN_PARTS
#define NORMSCAN_SLAB_MIN_PARTS 3
#endif
inline SlabSplitting split_slabs(int64_t slabs, int64_t nvec, int w, int cvs, int64_t resident) {
  const int stride = kSlabBlock - kSlabBlock % cvs;  // threads at work: whole positions
  const int64_t tile = int64_t(stride) * slab_unroll(w), span = tile * NORMSCAN_SLAB_SPAN_TILES;
  const int64_t parts = split_parts(slabs, nvec, tile, resident);
  return SlabSplitting{nvec, parts >= NORMSCAN_SLAB_MIN_PARTS ? parts : 1, ceil_div(nvec, span), span, cvs, stride};
}

}  // namespace normscan

// The reduce-scale family's tuning: the numbers its configurations are built from (tuning.cuh
// composes the forward's, backward_dispatch.cuh the backward's rungs), as typed policies. One
// set serves every GPU: chosen on sm_90 (the H100 and the H200; where they differ, the choice
// reads the device: fast_dram); sm_80 and sm_100 run it unmeasured. Each policy's line names
// its records in docs/tuning-record.md.
//
// tools/tune.py builds a variant with whole policies of its own: it defines
// NORMSCAN_TUNED_REDUCE_SCALE and puts tuned_reduce_scale.cuh on the include path, which names
// every policy below (`using RowsPolicy = ...;`), its own derived from the default.
#pragma once

namespace normscan {

// Rows (inner == 1) held on chip, read twice, or split across blocks (measured:
// docs/tuning-record.md, reduce_scale-4 to reduce_scale-8 and reduce_scale-12).
struct DefaultRowsPolicy {
  static constexpr int kClusterBlock = 512;     // threads a block when a cluster holds a long row
  static constexpr int kHeld = 16;              // vectors a thread, registers and shared memory, for long rows
  static constexpr int kWeightBatch = 2;        // fp32 weight vectors loaded at a time ahead of their stores (clusters)
  static constexpr int kBiasedRegVecs = 2;      // register vectors of a biased op's fp32 rows on clusters
  static constexpr int kSoftmaxPersistent = -1;  // fp32 softmax clusters persistent: 1 every device, 0 none, -1 fast DRAM
  static constexpr int kMaxCluster = 8;          // blocks a cluster holding a row, at most; longer rows held across the GPU
  static constexpr int kMaxClusterHeldSooner = 2;  // the same for the fp32 norms whose weight no cluster keeps
  static constexpr int kRereadBlock = 512;       // threads a block of the rows read twice (and the split kernels')
  static constexpr int kSplitSpanTiles = 1;      // tiles a span of a split row scales
  static constexpr int kSplitSpanTilesGrouped = 4;  // the same, the grouped ops'
  static constexpr int kSplitSumUnroll = 8;      // vectors in flight a thread of the split summing kernel
};

// Rows longer than a cluster holds, held across the GPU in parts (measured:
// docs/tuning-record.md, reduce_scale-13 to reduce_scale-15, reduce_scale-held-warps).
struct DefaultHeldPolicy {
  static constexpr int kSplitPercent = 100;  // rows of at most this % as many parts as resident blocks: split kernel
  static constexpr int kSummingWarps = 8;    // the split kernel's summing warps of 16 on large parts
  static constexpr int kSmParts = 256;       // fp32 norm rows of this many parts a resident block: 1024 threads
};

// batch_norm's channels: a cluster each and read twice, held, or the whole GPU's in turn
// (measured: docs/tuning-record.md, reduce_scale-9 to reduce_scale-11, reduce_scale-16,
// reduce_scale-17, reduce_scale-channels-held).
struct DefaultGroupedPolicy {
  static constexpr int kRereadL2Percent = 50;     // channels a cluster where the blocks' shares fit this much of L2
  static constexpr int kRereadSmallVectors = 16;  // 128-thread blocks for statistics of fewer vectors a thread
  static constexpr int kHeldBlock = 256;          // threads a block holding a statistic in shared memory
  static constexpr int kHeldVecs = 16;            // vectors a thread of those
  static constexpr int kHeldSmallBlocks = 2;      // statistics that many 128-thread blocks hold take those
  static constexpr int kChannelsMinRatio = 2;     // channels the whole GPU takes in turn: this many times what it holds
  static constexpr int kChannelsMaxHeld = 12;     // tiles a block holds, at most
  static constexpr int kChannelsTwoStreams = -1;  // two streams of channels: 1 every device, 0 none, -1 fast DRAM
};

// Reductions over a strided dim (inner > 1) (measured: docs/tuning-record.md, reduce_scale-18 to
// reduce_scale-22).
struct DefaultStridedPolicy {
  static constexpr int kBx = 256;     // positions along inner a block of the short-length scalar kernels
  static constexpr int kVecBx = 64;   // threads along inner a block of the short-length vector kernels
  static constexpr int kMinBlocks = 2;  // resident blocks a SM asked of the register-held kernels
  static constexpr int kFewCpt = 2;   // column vectors a thread of the few-position vector kernel, 32- and 64-bit
  static constexpr int kFewCpt16 = 1;  // the same, 16-bit
};

// Few columns beside the reduced dim: the slab kernels (measured: docs/tuning-record.md,
// reduce_scale-24, reduce_scale-26, reduce_scale-27, slab-element-unroll).
struct DefaultSlabPolicy {
  static constexpr int kMaxColumns = 1024;  // views of 2 to this many columns take the slab kernels
  static constexpr int kWarpVecs = 512;     // slabs of at most this many vectors take a warp each
  static constexpr int kSpanTiles = 4;      // tiles a span of a split slab scales
  static constexpr int kMinParts = 3;       // a slab split into fewer parts is one block's
  static constexpr int kElementUnroll = 4;  // single elements a thread has in flight
};

// The fused backward over rows (measured: docs/tuning-record.md, backward-pipeline-stages,
// backward-narrow-clusters, backward-centered-rungs, backward-centered-pipelined; the rest:
// docs/design-notes.md, "Backward").
struct DefaultBackwardPolicy {
  static constexpr int kVecs = 4;           // vectors of x (and of g) a thread holds
  static constexpr int kStages = 2;         // rows a block has in shared memory or on their way (1: none)
  static constexpr int kPipelineStages = 3;  // kStages of a weighted op's pipelined clusters
  static constexpr int kPipelineNarrowStages16 = 4;  // the same, 16-bit rows on clusters of 256-thread blocks
  static constexpr int kBlock = 512;        // threads a block (a row's) when a block or cluster holds a row
  static constexpr int kThreadsSm = 512;    // resident threads a SM asked (the registers a thread has)
  static constexpr int kUnweightedThreadsSm = 1024;  // the same, the kernels of ops without a weight
  static constexpr int kCenteredBlock = 256;  // kBlock for a centered op's rows
  static constexpr int kCenteredCluster = 16;  // blocks of a centered op's fp32 pipelined clusters, at most
  static constexpr int kLongVecs = 8;       // vectors of x (and of g) a thread of the long rows' rung holds
  static constexpr int kLongBlock = 512;    // threads a block of it
  static constexpr int kLongCluster = 8;    // blocks a cluster of it, at most (past 8: non-portable)
  static constexpr int kLongShiftedBlock = 256;  // the same two for the max-shifted ops'
  static constexpr int kLongShiftedCluster = 16;
};

}  // namespace normscan

#ifdef NORMSCAN_TUNED_REDUCE_SCALE
#include <tuned_reduce_scale.cuh>  // tools/tune.py's, on the include path it gives
#else
namespace normscan {
using RowsPolicy = DefaultRowsPolicy;
using HeldPolicy = DefaultHeldPolicy;
using GroupedPolicy = DefaultGroupedPolicy;
using StridedPolicy = DefaultStridedPolicy;
using SlabPolicy = DefaultSlabPolicy;
using BackwardPolicy = DefaultBackwardPolicy;
}  // namespace normscan
#endif

// The scan configurations the dispatcher picks, built from policy.cuh's numbers, each with a
// line on what chose it and where its measurements are (docs/tuning-record.md).
#pragma once

#include "columns.cuh"
#include "lookback.cuh"
#include "policy.cuh"
#include "rows.cuh"
#include "slab.cuh"
#include "strided.cuh"

namespace normscan {

// ---------------------------------------------------------------- rows
// The smallest block whose chunk holds the row: a half-empty chunk halves the bytes in flight; 4
// vectors a thread beat 2 (KernelBench 90) (measured: docs/tuning-record.md, scan-28).
using ScanRowsSmall = ScanRowsConfig<128, ScanRowsPolicy::kVecs, ScanRowsPolicy::kThreadsSm / 128>;
using ScanRowsMedium = ScanRowsConfig<256, ScanRowsPolicy::kVecs, ScanRowsPolicy::kThreadsSm / 256>;
using ScanRowsLarge = ScanRowsConfig<ScanRowsPolicy::kBlock, ScanRowsPolicy::kVecs, ScanRowsPolicy::kThreadsSm / ScanRowsPolicy::kBlock>;

// ---------------------------------------------------------------- look-back (few long rows)
// One row of 2**28 fp32, kernel only: 256-thread blocks holding two tiles of 7 vectors a data
// thread, 4 blocks a SM, 0.82 ms (512 x 2: 0.83; 128 x 8: 0.91; 1024 x 1: 0.90; one tile a block:
// 0.92) (measured: docs/tuning-record.md, scan-29).
using ScanLookback = ScanLookbackConfig<LookbackPolicy::kBlock, LookbackPolicy::kVecs, LookbackPolicy::kMinBlocks,
                                        LookbackPolicy::kEntry>;
// Rows of fewer elements in all, or enough rows to fill the device, go to the row kernel:
// a workspace and its memset are not worth it below this many elements.
constexpr int64_t kLookbackMinElements = int64_t(1) << 22;
constexpr int kLookbackMaxRowsPerSm = 4;

// ---------------------------------------------------------------- slabs (inner 2 to 128)
// 256 threads, runs of 5 positions, 4 blocks a SM, up to 128 columns: the fastest of the run and
// block shapes timed on 32 MB cumsums (measured: docs/tuning-record.md, scan-30).
using ScanSlab = ScanSlabConfig<LookbackPolicy::kSlabBlock, LookbackPolicy::kSlabVecs, LookbackPolicy::kSlabMinBlocks,
                                LookbackPolicy::kEntry, 128>;

// ---------------------------------------------------------------- columns (many slabs)
// 256 threads, up to 32 KB a chunk (two a block), 3 blocks a SM, a column's elements scanned 8 at a
// time (measured: docs/tuning-record.md, scan-31).
using ScanColumns = ScanColumnsConfig<256, 3, 32768, 8>;
constexpr int kScanColumnsSplits = ScanColumnsPolicy::kSplits;
constexpr int kScanColumnsSplitColumns = 32;  // a block's columns at most where its threads spread
constexpr int64_t kScanColumnsOwnBlock = ScanColumnsPolicy::kOwnBlock;

// Columns not a power of two are padded slabs where the strided kernel would leave SMs idle or the
// dim is this long (1.3-12x faster) (measured: docs/tuning-record.md, scan-32).
constexpr int64_t kScanPaddedMinLength = int64_t(1) << 18;

// ---------------------------------------------------------------- strided (inner > 1)
// 16-byte vectors of adjacent columns took cumprod dim 0 of 32768x32768 from 3.95 ms (72% of copy)
// to 3.04 ms (93%) (measured: docs/tuning-record.md, scan-33).
using ScanStrided = ScanStridedConfig<256, ScanColumnsPolicy::kStridedItems, ScanColumnsPolicy::kStridedMinBlocks>;
using ScanStridedVec = ScanStridedConfig<256, ScanColumnsPolicy::kStridedVecItems, ScanColumnsPolicy::kStridedMinBlocks>;
// Units (outer x column tiles) fewer than ScanColumnsPolicy::kStridedFill blocks a SM share each unit among the
// blocks of a cluster.
constexpr int kScanStridedFill = ScanColumnsPolicy::kStridedFill;

}  // namespace normscan

// The scan configurations the dispatcher picks, each with a line on what chose it and where its
// measurements are (docs/tuning-record.md). The -D hooks are for tools/tune.py, which builds
// variants side by side; the defaults are the measured best.
#pragma once

#include "columns.cuh"
#include "lookback.cuh"
#include "rows.cuh"
#include "slab.cuh"
#include "strided.cuh"

#ifndef NORMSCAN_SCAN_BLOCK
#define NORMSCAN_SCAN_BLOCK 512
#endif
#ifndef NORMSCAN_SCAN_VECS  // vectors per thread per chunk
#define NORMSCAN_SCAN_VECS 4
#endif
#ifndef NORMSCAN_SCAN_THREADS  // resident threads per SM asked of the row scan
#define NORMSCAN_SCAN_THREADS 1024
#endif
#ifndef NORMSCAN_LOOKBACK_BLOCK  // threads per look-back block (warp 0 looks back, the rest hold tiles)
#define NORMSCAN_LOOKBACK_BLOCK 256
#endif
#ifndef NORMSCAN_LOOKBACK_VECS  // vectors per data thread in a look-back tile (two tiles a block)
#define NORMSCAN_LOOKBACK_VECS 7
#endif
#ifndef NORMSCAN_LOOKBACK_MINB  // resident look-back blocks per SM asked of the compiler
#define NORMSCAN_LOOKBACK_MINB 4
#endif
#ifndef NORMSCAN_LOOKBACK_ENTRY  // bytes from one tile's look-back entry to the next
#define NORMSCAN_LOOKBACK_ENTRY 64
#endif
#ifndef NORMSCAN_SLAB_BLOCK  // threads per slab-scan block (warp 0 looks back, the rest hold tiles)
#define NORMSCAN_SLAB_BLOCK 256
#endif
#ifndef NORMSCAN_SLAB_VECS  // positions a run in a slab scan's tile (odd)
#define NORMSCAN_SLAB_VECS 5
#endif
#ifndef NORMSCAN_SLAB_MINB  // resident slab-scan blocks per SM asked of the compiler
#define NORMSCAN_SLAB_MINB 4
#endif
#ifndef NORMSCAN_SCAN_COLUMNS_OWN_BLOCK  // bytes from which a slab takes a column-scan block of its own
#define NORMSCAN_SCAN_COLUMNS_OWN_BLOCK 24576
#endif
#ifndef NORMSCAN_SCAN_COLUMNS_SPLITS  // threads a column at most in the column scan
#define NORMSCAN_SCAN_COLUMNS_SPLITS 32
#endif
#ifndef NORMSCAN_SCAN_STRIDED_ITEMS  // consecutive positions per thread in the strided scan
#define NORMSCAN_SCAN_STRIDED_ITEMS 16
#endif
#ifndef NORMSCAN_SCAN_STRIDED_VEC_ITEMS  // the same, when each position is a 16-byte vector
#define NORMSCAN_SCAN_STRIDED_VEC_ITEMS 8
#endif
#ifndef NORMSCAN_SCAN_STRIDED_FILL  // blocks a SM a strided scan's grid gives before it clusters
#define NORMSCAN_SCAN_STRIDED_FILL 1
#endif
#ifndef NORMSCAN_SCAN_STRIDED_MINB  // resident blocks per SM asked of the strided scan
#define NORMSCAN_SCAN_STRIDED_MINB 2
#endif

namespace normscan {

// ---------------------------------------------------------------- rows
// The smallest block whose chunk holds the row: a half-empty chunk halves the bytes in flight; 4
// vectors a thread beat 2 (KernelBench 90) (measured: docs/tuning-record.md, scan-28).
using ScanRowsSmall = ScanRowsConfig<128, NORMSCAN_SCAN_VECS, NORMSCAN_SCAN_THREADS / 128>;
using ScanRowsMedium = ScanRowsConfig<256, NORMSCAN_SCAN_VECS, NORMSCAN_SCAN_THREADS / 256>;
using ScanRowsLarge = ScanRowsConfig<NORMSCAN_SCAN_BLOCK, NORMSCAN_SCAN_VECS, NORMSCAN_SCAN_THREADS / NORMSCAN_SCAN_BLOCK>;

// ---------------------------------------------------------------- look-back (few long rows)
// One row of 2**28 fp32, kernel only: 256-thread blocks holding two tiles of 7 vectors a data
// thread, 4 blocks a SM, 0.82 ms (512 x 2: 0.83; 128 x 8: 0.91; 1024 x 1: 0.90; one tile a block:
// 0.92) (measured: docs/tuning-record.md, scan-29).
using ScanLookback = ScanLookbackConfig<NORMSCAN_LOOKBACK_BLOCK, NORMSCAN_LOOKBACK_VECS, NORMSCAN_LOOKBACK_MINB,
                                        NORMSCAN_LOOKBACK_ENTRY>;
// Rows of fewer elements in all, or enough rows to fill the device, go to the row kernel:
// a workspace and its memset are not worth it below this many elements.
constexpr int64_t kLookbackMinElements = int64_t(1) << 22;
constexpr int kLookbackMaxRowsPerSm = 4;

// ---------------------------------------------------------------- slabs (inner 2 to 128)
// 256 threads, runs of 5 positions, 4 blocks a SM, up to 128 columns: the fastest of the run and
// block shapes timed on 32 MB cumsums (measured: docs/tuning-record.md, scan-30).
using ScanSlab = ScanSlabConfig<NORMSCAN_SLAB_BLOCK, NORMSCAN_SLAB_VECS, NORMSCAN_SLAB_MINB,
                                NORMSCAN_LOOKBACK_ENTRY, 128>;

// ---------------------------------------------------------------- columns (many slabs)
// 256 threads, up to 32 KB a chunk (two a block), 3 blocks a SM, a column's elements scanned 8 at a
// time (measured: docs/tuning-record.md, scan-31).
using ScanColumns = ScanColumnsConfig<256, 3, 32768, 8>;
constexpr int kScanColumnsSplits = NORMSCAN_SCAN_COLUMNS_SPLITS;
constexpr int kScanColumnsSplitColumns = 32;  // a block's columns at most where its threads spread
constexpr int64_t kScanColumnsOwnBlock = NORMSCAN_SCAN_COLUMNS_OWN_BLOCK;

// Columns not a power of two are padded slabs where the strided kernel would leave SMs idle or the
// dim is this long (1.3-12x faster) (measured: docs/tuning-record.md, scan-32).
constexpr int64_t kScanPaddedMinLength = int64_t(1) << 18;

// ---------------------------------------------------------------- strided (inner > 1)
// 16-byte vectors of adjacent columns took cumprod dim 0 of 32768x32768 from 3.95 ms (72% of copy)
// to 3.04 ms (93%) (measured: docs/tuning-record.md, scan-33).
using ScanStrided = ScanStridedConfig<256, NORMSCAN_SCAN_STRIDED_ITEMS, NORMSCAN_SCAN_STRIDED_MINB>;
using ScanStridedVec = ScanStridedConfig<256, NORMSCAN_SCAN_STRIDED_VEC_ITEMS, NORMSCAN_SCAN_STRIDED_MINB>;
// Units (outer x column tiles) fewer than this many blocks a SM share each unit among the
// blocks of a cluster.
constexpr int kScanStridedFill = NORMSCAN_SCAN_STRIDED_FILL;

}  // namespace normscan

// The scan configurations the dispatcher picks, each with the measurement that chose it
// (H100, fp32; docs/archive/NOTES.md has the history). The -D hooks are for tools/tune.py, which builds
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
// The smallest block whose chunk holds the row: a chunk half empty halves the bytes in
// flight (4096x4096: 0.060 ms on 512 threads, 0.044 on 256, 101% of copy). 4 vectors a
// thread beat 2 (KernelBench 90: 2.98 against 3.09 ms).
using ScanRowsSmall = ScanRowsConfig<128, NORMSCAN_SCAN_VECS, NORMSCAN_SCAN_THREADS / 128>;
using ScanRowsMedium = ScanRowsConfig<256, NORMSCAN_SCAN_VECS, NORMSCAN_SCAN_THREADS / 256>;
using ScanRowsLarge = ScanRowsConfig<NORMSCAN_SCAN_BLOCK, NORMSCAN_SCAN_VECS, NORMSCAN_SCAN_THREADS / NORMSCAN_SCAN_BLOCK>;

// ---------------------------------------------------------------- look-back (few long rows)
// One row of 2**28 fp32, kernel only: 256-thread blocks holding two tiles of 7 vectors a
// data thread, 4 blocks a SM, 0.82 ms (512 x 2: 0.83; 128 x 8: 0.91; 1024 x 1: 0.90; one
// tile a block: 0.92). Look-back entries every 16 bytes 0.786 ms, 32 0.770, 64 0.764, 128
// 0.765, 256 0.775.
using ScanLookback = ScanLookbackConfig<NORMSCAN_LOOKBACK_BLOCK, NORMSCAN_LOOKBACK_VECS, NORMSCAN_LOOKBACK_MINB,
                                        NORMSCAN_LOOKBACK_ENTRY>;
// Rows of fewer elements in all, or enough rows to fill the device, go to the row kernel:
// a workspace and its memset are not worth it below this many elements.
constexpr int64_t kLookbackMinElements = int64_t(1) << 22;
constexpr int kLookbackMaxRowsPerSm = 4;

// ---------------------------------------------------------------- slabs (inner 2 to 128)
// 256 threads, runs of 5 positions, 4 blocks a SM (54 KB a block for fp32), up to 128
// columns. 32 MB fp32 cumsums, ms, (1024, 4096, 2) / (64, 8192, 16) / (16, 32768, 32) /
// (8, 16384, 64), tickets round the slabs in each: 7 a run, 3 a SM .041 / .037 / .066 /
// .047; 5, 4 a SM .035 / .035 / .067 / .049; 512 threads, 5, 2 a SM .041 / .041 / .073 /
// .052; 128, 7, 8 a SM .035 / .033 / .070 / .054; 192, 7, 5 a SM .034 / .036 / .067 / .050
// (masked_cumsum: 5, 4 a SM the best or level at each).
using ScanSlab = ScanSlabConfig<NORMSCAN_SLAB_BLOCK, NORMSCAN_SLAB_VECS, NORMSCAN_SLAB_MINB,
                                NORMSCAN_LOOKBACK_ENTRY, 128>;

// ---------------------------------------------------------------- columns (many slabs)
// 256 threads, up to 32 KB a chunk (two a block), 3 blocks a SM, a column's elements scanned 8
// at a time. A thread a column, first taken from 4096 columns (outer x inner) on, with as
// many slabs as resident blocks (396 on an H100) or more. cumsum, us, H100, 2026-11-27,
// fc642a7's kernel (slab, packed or strided) -> column scan, fp32; bf16 (columns): (16384,
// 256, 3) 243.9 -> 46.6; 213.5 -> 25.7 (49152), (8192, 512, 3) 132.3 -> 48.0; 112.8 -> 27.9
// (24576), (8192, 512, 6) 127.8 -> 84.5; 126.8 -> 44.9 (49152), (2048, 1024, 12) 125.2 ->
// 93.4; 96.9 -> 48.5 (24576), (4096, 1024, 4) 101.6 -> 60.8; 87.0 -> 35.7 (16384), (4096,
// 1024, 3) 71.1 -> 53.7; 80.2 -> 32.8 (12288), (2048, 2048, 3) 70.9 -> 66.0; 46.3 -> 38.8
// (6144), (1024, 4096, 5) 123.5 -> 111.7; 97.3 -> 61.8 (5120); but (1024, 4096, 3) 70.7 ->
// 95.7; 45.8 -> 54.2 (3072) and (1024, 4096, 2) 37.1 -> 88.6; 22.8 -> 48.0 (2048): a block's
// few columns, each a long serial walk. Scanned one element at a time (each load behind the
// store before it) the same kernel took (16384, 256, 3) 49.4, (4096, 1024, 3) 70.2 and (1024,
// 4096, 2) 171.9.
// Now a block of a warp's columns or fewer spreads its threads over them (up to 32 a column),
// and the column scan takes any number of columns. cumsum, us, H100, 2026-11-27, every
// contiguous slab with as many slabs as resident blocks on the column kernel, a thread a
// column -> threads spread (a0397ac's kernel, torch.compile), fp32: (1024, 4096, 3) 89.4 ->
// 48.9 (70.0 packed; 73.1), (512, 4096, 7) 94.7 -> 55.3 (70.6 packed; 149.9), (1024, 4096, 5)
// 101.1 -> 77.3 (105.8; 162.4), (2048, 2048, 3) 62.9 -> 50.3 (64.3; 71.4), (512, 2048, 4)
// 47.5 -> 22.8 (32.0 strided; 34.5), (600, 1024, 6) 30.7 -> 20.7 (27.7 strided; 38.0),
// (1000, 1024, 3) 28.5 -> 17.5 (25.6 packed; 22.5), (2000, 512, 2) 18.2 -> 13.3 (34.4
// strided; 14.1), (1024, 4096, 2) 86.5 -> 38.5 (37.2 slabs; 42.1), (400, 1024, 8) 30.4 ->
// 20.3 (19.2 strided; 44.3); bf16: 53.3 -> 31.6 (44.8; 50.5), 53.5 -> 35.6 (58.3; 84.3), 59.4
// -> 44.6 (57.6; 93.5), 38.3 -> 31.8 (37.0; 46.5), 27.4 -> 15.3 (17.4; 22.2), 17.9 -> 13.7
// (25.1; 23.7), 17.2 -> 12.7 (25.4; 16.4), 12.2 -> 9.8 (28.9; 11.6), 48.2 -> 22.0 (22.8;
// 34.8), 18.1 -> 14.0 (20.0; 25.8). Slower than before only at fp32 (1024, 4096, 2) and (400,
// 1024, 8), by 4% and 6-8% (two calls). Spread over more columns than a warp's, they lost:
// (16384, 256, 3) 45.9 -> 47.8 (126 columns a block, two threads each), (8192, 512, 3) 47.5
// -> 47.8, bf16 25.7 -> 28.8 and 28.0 -> 29.8 (63 columns, four each).
// A slab of 24 KB or more takes a block of its own (several slabs a block chain their chunks on
// one block, and a 32 KB slab is one chunk alone). cumsum, us, H100, 2026-11-27, views_time
// --no-compile, fp32 | bf16, slabs a block as above -> one: (1024, 4096, 2) 38.5 -> 35.1 |
// 16 KB, not taken, (1024, 4096, 3) 48.2 -> 45.2 | 31.7 -> 28.2, (2048, 2048, 3) 49.8 -> 45.6 |
// 12 KB, (512, 4096, 4) 35.9 -> 32.0 | 23.4 -> 18.5, (1024, 4096, 5) 76.6 -> 70.8 | 44.6 ->
// 42.4, (400, 4096, 8) 52.5 -> 46.9 | 33.1 -> 27.7, (600, 4096, 2) 26.1 -> 24.4 | 16 KB. One
// slab a block at every size (chunks of 32 or 36 KB) lost where slabs are small: (8192, 512,
// 3) 46.8 -> 82.8, (16384, 256, 3) 45.1 -> 127.8, (2000, 512, 2) 13.2 -> 22.8, (1000, 1024, 3)
// 17.4 -> 19.2.
using ScanColumns = ScanColumnsConfig<256, 3, 32768, 8>;
constexpr int kScanColumnsSplits = NORMSCAN_SCAN_COLUMNS_SPLITS;
constexpr int kScanColumnsSplitColumns = 32;  // a block's columns at most where its threads spread
constexpr int64_t kScanColumnsOwnBlock = NORMSCAN_SCAN_COLUMNS_OWN_BLOCK;

// Columns not a power of two are padded slabs (slab.cuh's SlabCopy::Padded) where the
// strided kernel's units times its largest cluster are fewer than the SMs, or the dim has
// this many positions or more. cumsum, us, strided / padded (H100, 2026-11-27, fp32; bf16):
// (1, 4194304, 3) 1090 / 94; 912 / 80; (8, 1048576, 5) 553 / 334; 501 / 254; (2, 2097152,
// 12) 1121 / 360; 1969 / 345; (4, 1048576, 100) 6640 / 3969; 3938 / 2959; but (16, 32768,
// 24) 88 / 98; 64 / 103 and (1024, 4096, 3) 103 / 95; 85 / 80 (torch.compile 72; 50).
// Since the padded slabs copy 4- and 8-byte elements of unmasked ops by cp.async, also where
// there are fewer columns than a vector holds (the strided kernel's scalars, most lanes
// idle): fp32, strided / padded, (1024, 4096, 3) 102.2 / 83.2, (2048, 2048, 3) 97.4 / 84.3,
// (4096, 1024, 3) 96.9 / 83.0; not 16-bit or masked ones, loaded through registers: bf16
// (1024, 4096, 6) 110.2 / 160.6, (1024, 4096, 3) 85.3 / 80.5; masked fp32 (1024, 4096, 3)
// 108.8 / 107.9. (Many outers of 5-7 fp32 columns, a vector or more, are strided: not timed
// on the padded slabs.)
// Contiguous slabs of such columns are packed slabs (SlabCopy::Packed) however many outers:
// x copied and y stored as they lie, whole vectors. cumsum, us, H100, 2026-11-27, strided or
// padded as above -> packed, fp32; bf16: (1024, 4096, 3) 83.5 -> 70.9; 85.7 -> 46.6, (2048,
// 2048, 3) 83.0 -> 71.6; 80.5 -> 47.3, (4096, 1024, 3) 83.1 -> 70.9 (bf16: half a tile a
// slab, strided), (1024, 4096, 5) 123.1 -> 123.7; 108.1 -> 96.7, (1024, 4096, 6) 130.7 ->
// 126.0; 111.1 -> 98.0, (512, 4096, 7) 79.4 -> 71.1; 65.5 -> 58.5, (16, 32768, 24) 87.4 ->
// 65.6; 63.5 -> 52.4, (1, 4194304, 3) 84.9 -> 74.7; 80.7 -> 50.0, (8, 1048576, 5) 311.5 ->
// 222.5; 252.7 -> 172.0, (2, 2097152, 12) 348.5 -> 283.9; 340.5 -> 183.2, (4, 1048576, 100)
// 3758 -> 3176; 2946 -> 1777.
constexpr int64_t kScanPaddedMinLength = int64_t(1) << 18;

// ---------------------------------------------------------------- strided (inner > 1)
// 16-byte vectors of adjacent columns took cumprod dim 0 of 32768x32768 from 3.95 ms (72%
// of copy) to 3.04 ms (93%).
using ScanStrided = ScanStridedConfig<256, NORMSCAN_SCAN_STRIDED_ITEMS, NORMSCAN_SCAN_STRIDED_MINB>;
using ScanStridedVec = ScanStridedConfig<256, NORMSCAN_SCAN_STRIDED_VEC_ITEMS, NORMSCAN_SCAN_STRIDED_MINB>;
// Units (outer x column tiles) fewer than this many blocks a SM share each unit among the
// blocks of a cluster.
constexpr int kScanStridedFill = NORMSCAN_SCAN_STRIDED_FILL;

}  // namespace normscan

// The scan family's tuning: the numbers tuning.cuh composes its configurations from, as typed
// policies. One set serves every GPU: chosen on sm_90 (the H100 and the H200); sm_80 and sm_100
// run it unmeasured. Each policy's line names its records in docs/tuning-record.md.
//
// tools/tune.py builds a variant with whole policies of its own: it defines NORMSCAN_TUNED_SCAN
// and puts tuned_scan.cuh on the include path, which names every policy below (`using
// ScanRowsPolicy = ...;`), its own derived from the default.
#pragma once

namespace normscan {

// Rows a block holds chunk by chunk (measured: docs/tuning-record.md, scan-28).
struct DefaultScanRowsPolicy {
  static constexpr int kBlock = 512;     // threads a block of the longest rows
  static constexpr int kVecs = 4;        // vectors a thread a chunk
  static constexpr int kThreadsSm = 1024;  // resident threads a SM asked
};

// Few long rows, one tile after another with a decoupled look-back; slabs (inner 2 to 128)
// likewise (measured: docs/tuning-record.md, scan-29, scan-30).
struct DefaultLookbackPolicy {
  static constexpr int kBlock = 256;      // threads a block (warp 0 looks back, the rest hold tiles)
  static constexpr int kVecs = 7;         // vectors a data thread of a tile (two tiles a block)
  static constexpr int kMinBlocks = 4;    // resident blocks a SM asked of the compiler
  static constexpr int kEntry = 64;       // bytes from one tile's look-back entry to the next
  static constexpr int kSlabBlock = 256;  // threads a slab scan's block
  static constexpr int kSlabVecs = 5;     // positions a run of a slab scan's tile (odd)
  static constexpr int kSlabMinBlocks = 4;  // resident slab-scan blocks a SM asked
};

// Columns: many slabs, and scans over a strided dim (measured: docs/tuning-record.md, scan-31,
// scan-33).
struct DefaultScanColumnsPolicy {
  static constexpr int kOwnBlock = 24576;  // bytes from which a slab takes a column-scan block of its own
  static constexpr int kSplits = 32;       // threads a column, at most, of the column scan
  static constexpr int kStridedItems = 16;  // consecutive positions a thread of the strided scan
  static constexpr int kStridedVecItems = 8;  // the same, each position a 16-byte vector
  static constexpr int kStridedFill = 1;    // blocks a SM a strided scan's grid gives before it clusters
  static constexpr int kStridedMinBlocks = 2;  // resident blocks a SM asked of the strided scan
};

}  // namespace normscan

#ifdef NORMSCAN_TUNED_SCAN
#include <tuned_scan.cuh>  // tools/tune.py's, on the include path it gives
#else
namespace normscan {
using ScanRowsPolicy = DefaultScanRowsPolicy;
using LookbackPolicy = DefaultLookbackPolicy;
using ScanColumnsPolicy = DefaultScanColumnsPolicy;
}  // namespace normscan
#endif

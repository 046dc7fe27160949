// The reduce-scale configurations the dispatcher picks, each with the measurement that
// chose it (H100, fp32 unless said; docs/archive/NOTES.md has the history). The -D hooks are for
// tools/tune.py, which builds variants side by side; the defaults are the measured best.
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
#ifndef NORMSCAN_ROWS_PIPELINE  // 1: clustered fp32 rows on a persistent grid fill the next row's slots during their stores
#define NORMSCAN_ROWS_PIPELINE 1
#endif
#ifndef NORMSCAN_ROWS_WEIGHTED_PERSISTENT  // 1: clustered rows with a weight (no bias) take row after row
#define NORMSCAN_ROWS_WEIGHTED_PERSISTENT 1
#endif
#ifndef NORMSCAN_STRIDED_BX  // positions along inner per block in the short-length strided kernels
#define NORMSCAN_STRIDED_BX 256
#endif
#ifndef NORMSCAN_STRIDED_VEC_BX  // threads along inner per block in the short-length vector kernels
#define NORMSCAN_STRIDED_VEC_BX 64
#endif
#ifndef NORMSCAN_STRIDED_CLUSTERS  // 0: no clusters for long columns (they are read twice)
#define NORMSCAN_STRIDED_CLUSTERS 1
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
// Rows up to 1024 vectors: the fewest threads per row that hold it in 4 vectors each. A
// thread whose vector slots sit half empty keeps half the bytes in flight: 65536x1024 ran
// at 0.95x of torch.compile on 128 threads per row, 4096-float rows on 512 threads at 89%
// of copy against 95% on 256.
// Rows of 1025-4096 vectors: 8 vectors a thread where the kernel holds them in 64 registers
// without spilling (kRowsEightVecs), so that a SM holds two blocks or more and one block's
// loads overlap another's stores; the others keep 4 a thread. Measured on the H200, ms,
// 2026-11-28 (tools/tune.py, 3 rounds):
// - 1025-2048 vectors on 256 threads (four blocks a SM), from 512 of 4 (two). A probe of rows
//   not in the sweep (two runs alike): fp32 (32768, 4100), half-filled slots, softmax 0.380
//   -> 0.256, layer_norm + w 0.451 -> 0.283, l2_normalize 0.323 -> 0.248; (16384, 8192)
//   softmax 0.259 -> 0.250, layer_norm + w 0.278 -> 0.252, but l2_normalize 0.2467 -> 0.2505
//   (101.4 -> 99.9% of copy) and rms_norm + w 0.249 -> 0.251; bf16 (8192, 16384) l2_normalize
//   0.127 -> 0.124 (98.3 -> 100.7%).
// - 2049-4096 vectors on 512 threads (two blocks a SM), from one block of 1024 threads of 4
//   a SM: (8192, 16384) fp32 l2_normalize 0.284 -> 0.251 (88.7 -> 100.6%), l1 0.283 -> 0.250,
//   rms_norm + w 0.292 -> 0.253. The softmaxes took the cluster's block there (one of 1024
//   threads a SM had run their 16-bit rows of 32768 at 73-78% of copy, H100) and take this
//   one too: softmax and log_softmax (8192, 32768) bf16 0.309 -> 0.251 and 0.302 -> 0.251
//   (99.6%). On the H100, 1024 x 4 once measured 0.5% faster than 512 x 8 on fp32 rows of
//   16384; neither change is timed there since.
// - Spilling at 8 (ptxas, sm_90 or sm_80: 12-144 bytes), so at 4 in registers: 16-bit rms_norm, layer_norm
//   and group_norm, fp32 group_norm, and the doubles of the norms. Their spilling builds
//   still ran faster: bf16 rms_norm + w (8192, 16384) 0.130 -> 0.126, layer_norm + w (8192,
//   32768) 0.345 -> 0.271, (16384, 16384) 0.311 -> 0.262 (16 and 32 bytes spilled).
template <typename T, typename Op>
constexpr bool kRowsEightVecs = sizeof(T) == 4   ? !Op::kGrouped
                                : sizeof(T) == 2 ? !(Op::kWeighted || Op::kCentered || Op::kGrouped)
                                                 : Op::kMaxShifted;
using RowsOneWarp = RowsConfig<256, 32, 4, 0, 4>;
using RowsTwoWarps = RowsConfig<256, 64, 4, 0, 4>;
using RowsFourWarps = RowsConfig<256, 128, 4, 0, 4>;
using RowsEightWarps = RowsConfig<256, 256, 4, 0, 4>;
// Those that spill at 8 hold 4 vectors in registers and 4 in shared memory on the same
// blocks (no spill so, sm_90 and sm_80; 16-bit group_norm spilled 4 bytes so, and keeps twice
// the threads of 4: below). H200, 2026-11-28, tools/tune.py, 3 rounds, ms, twice the
// threads of 4 -> this: bf16 layer_norm + w (8192, 32768) 0.343 -> 0.284 (73.2 -> 88.2% of
// copy), rms_norm + w (8192, 16384) 0.131 -> 0.129, (32768, 4096) 0.123 -> 0.124. 0 gives
// back twice the threads of 4.
#ifndef NORMSCAN_ROWS_SPLIT_HELD
#define NORMSCAN_ROWS_SPLIT_HELD 1
#endif
// The grouped ops' 16-bit and fp64 rows of 1025-4096 vectors keep twice the threads of 4 (one
// block of 1024 a SM at 2049-4096); their fp32 rows take the split of 4 + 4 too: instance_norm
// (16, 256, 128, 128) fp32, rows of 16384, went 0.177 -> 0.132 ms on the H200 (torch.compile
// 0.127), the other channel norms level (docs/archive/NOTES.md). A probe, not yet timed: 1 gives the
// 16-bit ones the split too (bf16 (16, 256, 128, 128) ran 0.78x torch.compile, 0.084 against
// 0.065 ms, on the H200).
#ifndef NORMSCAN_ROWS_SPLIT_HELD_GROUPED_16BIT
#define NORMSCAN_ROWS_SPLIT_HELD_GROUPED_16BIT 0
#endif
template <typename T, typename Op>
constexpr bool kRowsSplitHeld =
    NORMSCAN_ROWS_SPLIT_HELD &&
    (!Op::kGrouped || sizeof(T) == 4 || (NORMSCAN_ROWS_SPLIT_HELD_GROUPED_16BIT && sizeof(T) == 2));
// Rows of up to 8 * BLOCK vectors: BLOCK threads of 8 (1024 / BLOCK blocks a SM), or of 4 and 4
// in shared memory, or else twice the threads of 4.
template <typename T, typename Op, int BLOCK>
using RowsOfEightVecs = std::conditional_t<
    kRowsEightVecs<T, Op>, RowsConfig<BLOCK, BLOCK, 8, 0, 1024 / BLOCK>,
    std::conditional_t<kRowsSplitHeld<T, Op>, RowsConfig<BLOCK, BLOCK, 4, 4, 1024 / BLOCK>,
                       RowsConfig<2 * BLOCK, 2 * BLOCK, 4, 0, 512 / BLOCK>>>;
template <typename T, typename Op> using RowsOf2048 = RowsOfEightVecs<T, Op, 256>;
template <typename T, typename Op> using RowsOf4096 = RowsOfEightVecs<T, Op, 512>;
// Longer rows: a cluster of up to 8 blocks (sm_90) of 512 threads holding 16 vectors each,
// those beyond the registers in shared memory (fp32 keeps 5 in registers: 8 and 8, or 6
// and 10, spill; other types 4). Shared memory halves the cluster a long row needs, and
// clusters of 2 fill every block slot of an H100, where clusters of 4 left 16 of 264 empty.
// 32768x65535 (KernelBench 38, 39): 97.9% of copy.
// fp32 softmaxes fill the next row's slots during the stores: KernelBench 23 5.83 -> 5.61
// ms, 24 5.72 -> 5.39 ms (on a persistent grid then); the norms' 38 and 39 5.782 -> 5.804
// ms, and their 16-bit kernels spill with it. On today's grid of a cluster a row no next row
// comes, but the flag's code (the first row's slots filled before the loop) still measures
// ahead: without it 23 5.161 -> 5.176, 24 5.107 -> 5.183, softmax 4096x131072 1.540 -> 1.554
// (H100, 2026-11-26).
// A weighted fp32 row loads its weight 2 vectors at a time ahead of their stores (rms_norm+w,
// ms, one at each store -> 2 -> 4 at a time; 4 spilled): 1024x65536 0.221 -> 0.194 -> 0.204,
// 512x131072 0.234 -> 0.213 -> 0.213, 256x262144 0.240 -> 0.232 -> 0.224. bf16 rows were no
// faster (0.105 -> 0.106 -> 0.115 at 1024x65536). Loading the weight through the read-only
// path (ld.global.nc, which the compiler may issue ahead of the stores) instead: 0.228, and
// layer_norm's rows of 32768 and longer 6-23% slower.
// layer_norm's fp32 bias is loaded in the weight's batches, past the row's register vectors
// (rows.cuh), and those are 2 instead of 5 (14 vectors in shared memory, 112 KB a block, two
// a SM): with 5, 4 and 3 it spilled 56, 24 and 8 bytes. ms, H100, 2026-11-26, loads at each
// store -> batches with 2 register vectors (4 of them: 24 bytes spilled): layer_norm + w + b
// 8192x32768 1.054 -> 0.812 (0.963), 4096x65536 1.137 -> 0.885; + w 0.773 -> 0.767, 0.846 ->
// 0.818; without either (the same kernel) 0.742 -> 0.749, 0.745 -> 0.754.
#ifndef NORMSCAN_ROWS_BIAS_BATCH  // 1: a biased op's bias loaded in the weight's batches
#define NORMSCAN_ROWS_BIAS_BATCH 1
#endif
#ifndef NORMSCAN_ROWS_BIASED_REG_VECS  // its rows' register vectors then
#define NORMSCAN_ROWS_BIASED_REG_VECS 2
#endif
template <typename T, typename Op>
constexpr int kRowsWeightBatch =
    std::is_same<T, float>::value && Op::kWeighted && !Op::kGrouped && (!Op::kBiased || NORMSCAN_ROWS_BIAS_BATCH)
        ? NORMSCAN_ROWS_WEIGHT_BATCH
        : 0;
// Clustered rows with a weight and no bias (rms_norm's) run on a persistent grid, each cluster
// taking row after row, fp32 rows filling the next row's slots during their stores (which a
// grid of a cluster a row never reaches). ms, rms_norm+w, H100 | H200 (2026-11-25, tools/tune.py,
// a cluster a row -> persistent with the next row in flight; 16-bit rows have no pipeline):
// fp32 1024x65536 0.195 -> 0.194 | 0.149 -> 0.146, 512x131072 0.214 -> 0.201 | 0.167 -> 0.152,
// 256x262144 0.227 -> 0.201 | 0.182 -> 0.157; bf16 512x131072 0.111 -> 0.106 | 0.091 -> 0.085,
// 256x262144 0.124 -> 0.112 | 0.103 -> 0.089. Without a weight (the same kernel, w null) the
// persistent grid was no faster (fp32 512x131072 0.192 -> 0.197), l2_normalize's 39 on
// clusters of 2 slower (5.886 -> 6.201 ms), and the softmaxes of 131072 on clusters of 4
// slower on the H100 (1.552 -> 1.586) though faster on the H200 (1.237 -> 1.221): those keep
// a cluster a row.
template <typename Op> constexpr bool kRowsWeightedPersistent = NORMSCAN_ROWS_WEIGHTED_PERSISTENT && Op::kWeighted && !Op::kBiased;
// fp32 softmax rows on clusters take the persistent grid too (their next row's slots filled
// during the stores) on devices whose DRAM feeds a SM fast (fast_dram). ms, a cluster a row
// -> persistent, softmax | log_softmax (4096, 131072): H100 1.552 -> 1.586 | -, H200 1.237 ->
// 1.221 | - (2026-11-26); H200 1.219 -> 1.175 | 1.224 -> 1.203 (2026-12-01, tools/tune.py, 3
// rounds, where every fp32 clustered row took it: KernelBench 38 and 39 4.314 -> 4.561, the
// other norms' rows level).
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
                               NORMSCAN_ROWS_PIPELINE && sizeof(T) == 4 && (Op::kMaxShifted || kRowsWeightedPersistent<Op>),
                               kRowsWeightBatch<T, Op>>;
// Up to this many blocks, the fewest that hold the row; longer rows are held across the GPU
// (held.cuh). Above 8 the cluster is non-portable (the dispatcher asks whether the device
// runs it). KernelBench 23's and 24's rows of 393216 floats, ms (H100): on a cluster of 12
// (NORMSCAN_ROWS_MAX_CLUSTER=16) 5.19 and 5.15 (2026-11-23), 5.165 and 5.097 (2026-11-26);
// held, on the serial kernel, 5.80 and 5.57 (2026-11-23); on the split kernel 4.61 and 4.39
// (2026-11-26, the same run as the 5.165 and 5.097). A cluster of 12 does a row's reduction
// and scaling in step, its barriers unhidden; held, a row's parts are summed while others
// are scaled.
#ifndef NORMSCAN_ROWS_MAX_CLUSTER
#define NORMSCAN_ROWS_MAX_CLUSTER 8
#endif
constexpr int kRowsMaxCluster = NORMSCAN_ROWS_MAX_CLUSTER;
// The fp32 norms (not the max-shifted softmaxes): their long rows measure best held.
template <typename T, typename Op> constexpr bool kFp32Norm = std::is_same<T, float>::value && !Op::kMaxShifted;
// fp32 rows of the norms (not the softmaxes), but those whose weight the persistent cluster
// keeps on chip, are held from beyond this many blocks on. H100, 2026-11-26, ms, clusters of
// up to 8 -> held past 2 blocks: KernelBench 34 (rows of 262144) 5.438 -> 5.188;
// l2_normalize (512, 131072) 0.191 -> 0.185, (256, 262144) 0.196 -> 0.186 (l1 and rms_norm
// alike); layer_norm + w (4096, 131072) 1.827 -> 1.665; group_norm (16, 256, 128, 128) 32
// groups 0.209 -> 0.198. Not held: rms_norm + w (512, 131072) 0.199 -> 0.208, softmax
// (4096, 131072) 1.535 -> 1.545 (log_softmax 1.520 -> 1.473), bf16 rows (rms_norm (512,
// 131072) 0.097 -> 0.108); and rows of 65536 (2 blocks) 0.186 -> 0.188.
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
// Statistics shared by rows (batch_norm's channels) go one a cluster of 1, 2, 4 or 8 blocks
// (clusters on sm_90 only: launch_group_reread_of says which) where the resident blocks'
// shares of their statistics take at most this percentage of L2 (reduce_scale_group_reread_kernel:
// the second pass reads L2); else to the split kernels. batch_norm (8, 1024, 64, 64) on the
// H200 (1024 channels of 128 KB, 132 resident blocks: 17 MB of its 60) went 0.298 -> 0.114
// ms fp32, 0.316 -> 0.078 bf16 (torch.compile 0.081, 0.051) one a block.
#ifndef NORMSCAN_GROUP_REREAD_L2_PERCENT
#define NORMSCAN_GROUP_REREAD_L2_PERCENT 50
#endif
// Their blocks: of 512 threads, or of 128 for statistics of fewer vectors than this many a
// thread of 512 (ms, H200, 2026-12-02, blocks of 512 | 128: fp32 (8, 2048, 32, 32) 0.091 |
// 0.060, (128, 512, 14, 14) 0.056 | 0.054, (32, 512, 32, 32) 0.063 | 0.073; bf16 (8, 2048,
// 32, 32) 0.077 | 0.042, (8, 1024, 64, 64) 0.082 | 0.076; docs/archive/NOTES.md).
#ifndef NORMSCAN_GROUP_REREAD_SMALL_VECTORS
#define NORMSCAN_GROUP_REREAD_SMALL_VECTORS 16
#endif
constexpr int kGroupRereadBlock = 512, kGroupRereadSmallBlock = 128;
// Or held in shared memory (the kernel's HELD): NORMSCAN_GROUP_HELD_VECS vectors a thread
// (0: never held) in blocks of NORMSCAN_GROUP_HELD_BLOCK threads, or of 128 for statistics of
// at most NORMSCAN_GROUP_HELD_SMALL_BLOCKS such blocks' vectors, on the fewest of up to
// kMaxCluster blocks (sm_90) that hold a statistic and fill the GPU (launch_group_held_of).
// Held beside read from L2 (H200, 2026-12-02, ms; docs/archive/NOTES.md): fp32 (8, 1024, 64, 64) 0.114 ->
// 0.096, (64, 64, 64, 64) 0.083 -> 0.066, (16, 256, 128, 128) 0.258 -> 0.231; bf16 (16, 256,
// 128, 128) 0.166 -> 0.132. Blocks of 128 beside 256 for the small ones: bf16 (8, 2048, 32,
// 32) 0.046 -> 0.040, (8, 1024, 64, 64) 0.067 -> 0.062; of 512 (one a SM) slower at 15 of 18.
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
// Such rows, fewer than the blocks the GPU holds at once, split across blocks: as many
// summing a row as fill the GPU (whole rows a wave: a second, part-filled wave would double
// the time), each at least kSplitMinTiles tiles (kRereadTile's; the summing kernel walks its
// part in tiles of its own, kSplitSumTile); spans of NORMSCAN_SPLIT_SPAN_TILES tiles
// scaling it, one block each. KernelBench 37 (one row of 1.9e9 floats): contiguous chunks a
// summing block 9.00 ms, interleaved tiles 7.69; spans of 64, 16, 4, 2 and 1 tiles 7.70,
// 7.61, 7.46, 7.41 and 7.375 ms (torch.compile 7.37). A grouped op's scaling block looks up
// its statistic, the statistic's first element and its channels before its first load:
// KernelBench 33 (batch_norm, 4096 rows of 1 MB) with spans of 1, 2, 3, 4 and 8 tiles
// 4.604, 4.354, 4.286, 4.233 and 4.253 ms (torch.compile 4.22; 37 with 2 tiles 7.416
// against 7.387).
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

// Aligned rows longer than a cluster holds, held across the GPU (reduce_scale_held_kernel;
// NORMSCAN_HELD=0: read twice instead): parts of kBlock threads x kVecs vectors, two
// buffers a block. KernelBench 35 (896 rows of 8 MB) and 40 (16 of 16 MB), against 7.87 and
// 0.272 ms read twice, 512 threads: two buffers of 6 vectors 6.56 and 0.241-0.257 ms; of 4,
// 8.02 and 0.317-0.334; one buffer of 12 (waiting idle for the row's last parts) 6.50 and
// 0.315-0.323; of 13, 6.58 and 0.310-0.330. 256 threads x 8 vectors (three blocks a SM, 32 KB
// parts) against 512 x 6 (two, 48 KB), ms (H100, 2026-11-24, six timings each): 16-bit rows
// faster (rms_norm bf16 (128, 2**22) 0.957 -> 0.920, layer_norm bf16 (32, 2**23) 0.636 ->
// 0.610, softmax bf16 (64, 2**23) 1.367 -> 1.299), and fp32 softmax (64, 2**22) 1.150 ->
// 1.040 (an exp an element); the other fp32 rows slower (35 6.51 -> 7.06, 40 0.238 -> 0.256,
// rms_norm (64, 2**22) 0.828 -> 0.869).
#ifndef NORMSCAN_HELD
#define NORMSCAN_HELD 1
#endif
// Rows of at most NORMSCAN_HELD_SPLIT_PERCENT % as many parts as resident blocks go to the
// split kernel (held.cuh), longer ones to the serial kernel (0: none split; 200: all). H100,
// 2026-11-26, ms, serial -> split: 35 (171 parts, 264 blocks) 6.51 -> 5.84, rms_norm bf16
// (128, 2**22) (256, 396) 0.921 -> 0.911; 40 (342, 264) 0.248 -> 0.279, layer_norm bf16 (32,
// 2**23) (512, 396) 0.742 -> 0.904.
#ifndef NORMSCAN_HELD_SPLIT_PERCENT
#define NORMSCAN_HELD_SPLIT_PERCENT 100
#endif
// The split kernel's summing warps of 16 on large parts: 35 took 6.08 ms with 4, 5.82 with 8,
// 6.21 with 12 (H100, 2026-11-26).
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
// fp32 norm rows whose parts give every resident block at least NORMSCAN_HELD_SM_PARTS of
// them take parts twice as large on the split kernel, one block of 1024 threads a SM (96
// KB parts; where the device gives a block 192 KB), where the rows fit its blocks. ms, H100,
// 2026-11-26, large parts -> these (parts a block): KernelBench 35 5.820 -> 5.677 (584), 34
// 5.189 -> 5.051 (597); layer_norm + w (4096, 131072) 1.665 -> 1.682 (186), rms_norm (256,
// 262144) 0.187 -> 0.189 (21), group_norm (8, 1024, 64, 64) 32 groups 0.104 -> 0.108 (12);
// 40 (171 parts a row, more than the 132 blocks: the serial kernel) 0.238 -> 0.256. H200
// (2026-12-01), these -> none: 35 4.577 -> 4.531, 34 4.011 -> 4.163; the same on both devices.
#ifndef NORMSCAN_HELD_SM_PARTS
#define NORMSCAN_HELD_SM_PARTS 256
#endif
using HeldSmParts = HeldConfig<1024, 6, 512>;

// Statistics shared by rows (batch_norm's channels) taken by the whole GPU one after another
// (channels.cuh), where each statistic is at least
// NORMSCAN_CHANNELS_MIN_RATIO times what the blocks hold (else the split kernels read it
// twice): smaller ones have no re-read tiles of the next channel to sum while they wait, and
// measured slower (ms, H100, 2026-11-26, split kernels -> this kernel: (128, 64, 256, 256)
// fp32 2.141 -> 2.376, bf16 1.196 -> 1.378; docs/archive/NOTES.md, "batch_norm's channels on the whole GPU").
#ifndef NORMSCAN_CHANNELS_MIN_RATIO
#define NORMSCAN_CHANNELS_MIN_RATIO 2
#endif
// Tiles a block holds, at most (14 fit; KernelBench 33, ms, H100, 2026-11-26, builds side by
// side: 14 4.178, 13 4.222, 12 4.028, 11 4.082, 10 4.152; the split kernels 4.256).
#ifndef NORMSCAN_CHANNELS_MAX_HELD
#define NORMSCAN_CHANNELS_MAX_HELD 12
#endif
// Groups of blocks taking alternate channels (STREAMS), and threads a block (two streams of
// 512-thread blocks, two a SM, or one of 1024), chosen by the device's DRAM (fast_dram).
// KernelBench 33, ms, one stream of 1024 -> two of 512: H100 4.175 -> 4.234 (2026-11-26; and
// the channels the blocks hold whole, (128, 64, 256, 256) fp32, which take the split kernels
// instead, 2.376 -> 2.036); H200 3.234 -> 3.108, 92.9 -> 97.1% of copy (2026-11-28,
// tools/tune.py, 3 rounds, by flags), and chosen so by the device, 3.248 -> 3.122.
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
// Each config holds BY * ITEMS positions of the reduced dim a block (kHeld).
// 16-byte vectors along inner (inner contiguous and aligned), up to 16 a thread (256
// bytes): 16-byte vectors took KernelBench 36 (112, 64, 512, 512) from 5.7 to 5.3 ms,
// prefetching the next tile into shared memory to 5.25, one block a tile to 5.16.
// Columns of up to 4 take 2 column vectors a thread (16-bit: 1): rms_norm dim 1 of (112, 3,
// 512, 512), ms, 4 -> 2 -> 1 vectors (2026-11-25): bf16 H100 0.158 -> 0.126 -> 0.120, H200
// 0.151 -> 0.115 -> 0.109; fp32 4 -> 2, H100 0.236 -> 0.232, H200 0.189 -> 0.171. Fewer
// registers a thread (bf16 161 at 4), more blocks a SM, and each column's scale (a division
// and a square root) computed by fewer threads in turn.
template <typename T>
using StridedVecFew = StridedConfig<NORMSCAN_STRIDED_VEC_BX, 1, 4, true, sizeof(T) == 2 ? NORMSCAN_STRIDED_FEW_CPT16 : NORMSCAN_STRIDED_FEW_CPT,
                                    vec16<T>(), NORMSCAN_STRIDED_MINB>;
template <typename T> using StridedVecShort = StridedConfig<NORMSCAN_STRIDED_VEC_BX, 1, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB>;
template <typename T> using StridedVecMedium = StridedConfig<NORMSCAN_STRIDED_VEC_BX, 4, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB>;
// Columns up to 256 in one block of 16 x 16 threads (16 along them), no cluster: rms_norm
// dim 1 of (16, 256, 128, 128), ms, H100 (2026-11-25), a cluster of two 32 x 8 blocks -> one
// 16 x 16 block -> one 8 x 32: fp32 0.190 -> 0.180 -> 0.187, bf16 0.101 -> 0.095 -> 0.149.
// sm_90 only: on sm_80 these kernels spilled 44-388 bytes. Blocks of 8 x 32 threads of 8
// vectors (three a SM) and 4 x 64 of 4 (four), H100 (2026-11-27, tools/tune.py, 3 rounds):
// fp32 0.180 -> 0.184 / 0.192 (best rounds), bf16 0.090 -> 0.092 / 0.096.
template <typename T>
using StridedVecTall = StridedConfig<16, 16, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB, LaunchedOn::kSm90On>;
// Columns of 257-1024 in one block of 4 x 64 threads (a position's 64 bytes a tile; 64 KB of
// x in flight, two blocks a SM), no cluster. Against clusters of up to 8 blocks of 16 x 8
// threads (32 x 8 for fp32 softmaxes) pushing column sums to each other, H100 (2026-11-27):
// rms_norm (8, 1024, 64, 64) bf16 0.060 -> 0.052 ms, fp32 0.100 -> 0.100 (tools/tune.py, 3
// rounds, with the warp fold of strided.cuh; without it 0.055); us (probe of both builds,
// CUDA events, L2 flushed, median of 3 x 15), (8, 1024, 64, 64) and (16, 512, 64, 64):
// softmax bf16 88.4 -> 61.2, 83.2 -> 69.1, fp32 124.6 -> 105.6, 119.7 -> 103.4; log_softmax
// bf16 86.3 -> 59.8, 80.8 -> 65.7; l2_normalize bf16 64.7 -> 56.4, 60.7 -> 54.9, fp32 104.9 ->
// 104.6, 103.6 -> 100.4. Most likely what the clusters cost: their blocks wait for each
// other at each tile's barrier (docs/archive/NOTES.md, "The channel RMSNorm's stores"). A position's 32
// bytes a tile instead, 2 x 128 threads of 8 vectors (three blocks a SM) or 2 x 64 of 16
// (four): (8, 1024, 64, 64) bf16 0.051 -> 0.059 / 0.061, fp32 0.100 -> 0.114 / 0.115.
template <typename T>
using StridedVecTaller = StridedConfig<4, 64, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB, LaunchedOn::kSm90On>;
// Columns of 65-128 where the tall blocks are not built (before sm_90): one block of 16 x 8
// threads, 32- and 64-bit types (16-bit ones spilled 52 bytes on sm_80 and take the scalar
// kernels there).
template <typename T>
using StridedVecPreSm90 = StridedConfig<16, 8, 16, true, 1, vec16<T>(), NORMSCAN_STRIDED_MINB, LaunchedOn::kBeforeSm90>;
// Scalar columns (odd inner, unaligned): items held per thread in 32-bit registers' worth
// (doubles take two). Short columns take several per thread, so that a thread keeps up to
// 64 values in flight.
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
// Max-shifted ops have no 1024-thread blocks: their doubles spill there (min_blocks in
// ops.cuh), and their 16-bit rows of 32768 ran at 73-78% of copy on one such block a SM
// (their exps keep the reductions long).
template <typename Op> constexpr bool kThousandThreads = !Op::kMaxShifted;
template <typename T, typename Op>
using StridedRereadOf = std::conditional_t<kThousandThreads<Op>, StridedReread, StridedConfig<32, 16, 1, false, 1, 1, 1>>;
constexpr int kStridedMaxCluster = NORMSCAN_STRIDED_CLUSTERS ? 8 : 1;

// ---------------------------------------------------------------- slabs (slab.cuh)
// Views with 2 to this many columns beside the dim go to the slab kernels rather than the
// strided ones (0: none do; dispatch.cuh has the exceptions).
#ifndef NORMSCAN_SLAB_MAX_COLUMNS
#define NORMSCAN_SLAB_MAX_COLUMNS 1024
#endif
// fp32, ms, H100, 2026-11-27 (tools/tune.py, 3 rounds), strided kernels -> slabs: rms_norm
// (1024, 4096, 2) 0.147 -> 0.023, (16, 32768, 32) 1.811 -> 0.073, (1, 4194304, 2) 46.3 ->
// 0.034, (8, 2**20, 4) 54.6 -> 0.137; softmax 0.259 -> 0.026, 2.311 -> 0.083, 108.7 -> 0.041,
// 69.3 -> 0.147.
constexpr int kSlabBlock = 256;
// Slabs of at most this many vectors take a warp each: (4096, 256, 4) (256 vectors a slab) on
// a block a slab -> a warp, rms_norm 0.021 -> 0.014 ms, softmax 0.053 -> 0.016.
#ifndef NORMSCAN_SLAB_WARP_VECS
#define NORMSCAN_SLAB_WARP_VECS 512
#endif
// Slabs fewer than the blocks the GPU holds at once are each summed by as many blocks as
// fill it (split_parts); spans of NORMSCAN_SLAB_SPAN_TILES tiles scale
// them. Spans of 1 -> 4 tiles, ms (measured while each scaling block merged its slab's parts
// itself): softmax (8, 16384, 64) 0.057 -> 0.041, (16, 32768, 32) 0.083 -> 0.075; rms_norm
// 0.038 -> 0.035, 0.073 -> 0.070; the rest within 0.004.
#ifndef NORMSCAN_SLAB_SPAN_TILES
#define NORMSCAN_SLAB_SPAN_TILES 4
#endif
// A slab is split into at least NORMSCAN_SLAB_MIN_PARTS parts, else one block reads it: 256
// slabs in two parts each took three launches and a merging block a column for two statistics.
// 2 -> 3, fp32 ms (H100, 2026-11-27, tools/tune.py): (256, 4096, 8) l1_normalize, l2_normalize,
// rms_norm 0.040 -> 0.030; l1_normalize (256, 4096, 12) 0.060 -> 0.051 (its summing kernel took 64
// registers, no longer 67, so four blocks a SM: two parts); 5 gave the same.
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

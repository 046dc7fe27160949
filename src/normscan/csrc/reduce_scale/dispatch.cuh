// Picks the reduce-scale kernel and configuration for a view, and launches it. Host only.
#pragma once

#include "../device/launch.cuh"
#include "reread.cuh"
#include "tuning.cuh"

namespace normscan {

template <typename T, typename Op, typename Cfg>
inline cudaError_t launch_rows(const ArgsFor<T, Op>& a, const DeviceInfo& d, int cluster, cudaStream_t stream) {
  constexpr auto kernel = reduce_scale_rows_kernel<T, Op, Cfg>;
  constexpr int V = vec16<T>();
  const int64_t units = cluster > 1 ? a.view.outer : ceil_div(a.view.outer, Cfg::kBlock / Cfg::kThreadsPerRow);
  const bool persistent = ((kRowsWeightedPersistent<Op> && a.w != nullptr) || rows_persistent_softmax<T, Op>(d)) &&
                          cluster > 1 && cluster <= kMaxPortableCluster;
  if (persistent && Cfg::kPipeline && a.view.x_so % V != 0) {
    // A pipelined cluster fills the next row's slots at this row's offsets, which hold only
    // where rows a grid's clusters apart split alike: rows not of whole vectors take a
    // multiple of V clusters (of the 30 clusters of 8 an H100 holds, 28; other counts raised
    // a misaligned address). In the kernel, a test of the rows' split spilled 24 bytes.
    int64_t fit = 0;
    const cudaError_t err = resident_units<kernel>(dim3(Cfg::kBlock), cluster, Cfg::kSmemBytes, &fit);
    if (err != cudaSuccess) return err;
    const int64_t clusters = fit >= V ? fit - fit % V : V;
    return launch_units<kernel>(Grid::PerUnit, dim3(Cfg::kBlock), cluster, min64(units, clusters), Cfg::kSmemBytes,
                                stream, a);
  }
  const Grid grid = persistent ? Grid::Persistent : Grid::PerUnit;
  return launch_units<kernel>(grid, dim3(Cfg::kBlock), cluster, units, Cfg::kSmemBytes, stream, a);
}

// Whether rows share statistics (a grouped op's batch_norm): only the split kernels merge them.
template <typename T, typename Op> inline bool rows_share_stats(const ArgsFor<T, Op>& a) {
  if constexpr (Op::kGrouped) return a.grouping.stat_groups != a.view.outer;
  else return false;
}

// Statistics shared by rows one a cluster of blocks of B threads (reduce_scale_group_reread_kernel),
// where GroupedPolicy::kRereadL2Percent's bounds allow: *launched tells whether they were.
template <typename T, typename Op, int B, int V>
inline cudaError_t launch_group_reread_of(const ArgsFor<T, Op>& a, const DeviceInfo& d, int most_cluster,
                                          cudaStream_t stream, bool* launched) {
  constexpr auto kernel = reduce_scale_group_reread_kernel<T, Op, B, V, false>;
  constexpr auto clustered = reduce_scale_group_reread_kernel<T, Op, B, V, true>;
  int64_t resident = 0;
  cudaError_t err = resident_units<kernel>(dim3(B), 1, 0, &resident);
  if (err != cudaSuccess) return err;
  const int64_t groups = a.grouping.stat_groups, bytes = a.view.outer / groups * a.view.length * int64_t(sizeof(T));
  const int64_t budget = GroupedPolicy::kRereadL2Percent * d.l2_bytes / 100;
  // The smallest cluster whose blocks fill the GPU and whose resident blocks' shares of their
  // statistics fit the bound; where one block a statistic fills it, 16-bit ones alone take a
  // cluster to fit (docs/design-notes.md, "Channels and split rows").
  const int max_cluster = d.major < 9 ? 1 : groups < resident || sizeof(T) <= 2 ? most_cluster : 1;
  for (int cluster = 1; cluster <= max_cluster; cluster *= 2) {
    if (groups * cluster >= resident && budget / ceil_div(bytes, int64_t(cluster)) >= resident) {
      if (cluster > 1) {
        int64_t fit = 0;  // clusters resident at once (0: none can run)
        err = resident_units<clustered>(dim3(B), cluster, 0, &fit);
        if (err != cudaSuccess || fit == 0) return err;
      }
      *launched = true;
      return cluster == 1 ? launch_units<kernel>(Grid::PerUnit, dim3(B), 1, groups, 0, stream, a)
                          : launch_units<clustered>(Grid::PerUnit, dim3(B), cluster, groups, 0, stream, a);
    }
  }
  return cudaSuccess;
}

// Statistics shared by rows held in shared memory (reduce_scale_group_reread_kernel's HELD),
// one a cluster of B-thread blocks: the fewest that hold a statistic's vectors and fill the
// GPU's resident blocks, where such a cluster can run: *launched tells whether they were.
// Larger clusters to fill the last round of clusters were slower (docs/design-notes.md).
// `vectors`: the most whole vectors a statistic has.
template <typename T, typename Op, int B, int V>
inline cudaError_t launch_group_held_of(const ArgsFor<T, Op>& a, const DeviceInfo& d, int64_t vectors,
                                        cudaStream_t stream, bool* launched) {
  constexpr int H = kGroupHeldVecs;
  constexpr auto kernel = reduce_scale_group_reread_kernel<T, Op, B, V, false, H>;
  constexpr auto clustered = reduce_scale_group_reread_kernel<T, Op, B, V, true, H>;
  constexpr size_t smem = size_t(B) * H * 16;
  const int64_t groups = a.grouping.stat_groups;
  int64_t resident = 0;
  cudaError_t err = resident_units<kernel>(dim3(B), 1, smem, &resident);
  if (err != cudaSuccess || resident == 0) return err;
  for (int cluster = 1; cluster <= (d.major < 9 ? 1 : kMaxCluster); cluster *= 2) {
    if (vectors > int64_t(cluster) * B * H || groups * cluster < resident) continue;
    if (cluster > 1) {
      int64_t fit = 0;  // clusters resident at once (0: none can run)
      err = resident_units<clustered>(dim3(B), cluster, smem, &fit);
      if (err != cudaSuccess || fit == 0) return err;
    }
    *launched = true;
    return cluster == 1 ? launch_units<kernel>(Grid::Persistent, dim3(B), 1, groups, smem, stream, a)
                        : launch_units<clustered>(Grid::Persistent, dim3(B), cluster, groups, smem, stream, a);
  }
  return cudaSuccess;
}

// The same on blocks of kGroupHeldSmallBlock threads for statistics that fill at most
// GroupedPolicy::kHeldSmallBlocks of them, else of kGroupHeldBlock.
template <typename T, typename Op, int V>
inline cudaError_t launch_group_held(const ArgsFor<T, Op>& a, const DeviceInfo& d, cudaStream_t stream,
                                     bool* launched) {
  if constexpr (kGroupHeldVecs > 0 && V * sizeof(T) == 16) {
    const int64_t vectors = a.view.outer / a.grouping.stat_groups * (a.view.length / V);
    if (vectors <= int64_t(GroupedPolicy::kHeldSmallBlocks) * kGroupHeldSmallBlock * kGroupHeldVecs) {
      const cudaError_t err = launch_group_held_of<T, Op, kGroupHeldSmallBlock, V>(a, d, vectors, stream, launched);
      if (err != cudaSuccess || *launched) return err;
    }
    return launch_group_held_of<T, Op, kGroupHeldBlock, V>(a, d, vectors, stream, launched);
  }
  return cudaSuccess;
}

// The same, blocks of kGroupRereadSmallBlock threads for statistics of few vectors, on
// clusters of fewer threads than a kGroupRereadBlock block has (bf16 (64, 256, 28, 28) on
// clusters of 4 of 128 threads took 0.046 ms, one block of 512 0.033), else (or where those
// do not fit) blocks of kGroupRereadBlock.
template <typename T, typename Op, int V>
inline cudaError_t launch_group_reread(const ArgsFor<T, Op>& a, cudaStream_t stream, bool* launched) {
  *launched = false;
  if constexpr (Op::kGrouped) {
    // The kernel walks a statistic's rows as one run, split as its first row is: rows a
    // fraction of a vector apart ((3, 601, 37) fp32) take it a scalar a load.
    if constexpr (V > 1) {
      const int64_t step = a.grouping.stat_groups;
      if ((step * a.view.x_so) % V != 0 || (step * a.view.y_so) % V != 0)
        return launch_group_reread<T, Op, 1>(a, stream, launched);
    }
    const int64_t elements = a.view.outer / a.grouping.stat_groups * a.view.length;
    if (elements > INT32_MAX) return cudaSuccess;
    DeviceInfo d;
    cudaError_t err = device_info(&d);
    if (err != cudaSuccess) return err;
    err = launch_group_held<T, Op, V>(a, d, stream, launched);
    if (err != cudaSuccess || *launched) return err;
    if (elements / V < int64_t(kGroupRereadBlock) * GroupedPolicy::kRereadSmallVectors) {
      constexpr int most = kGroupRereadBlock / kGroupRereadSmallBlock / 2;
      err = launch_group_reread_of<T, Op, kGroupRereadSmallBlock, V>(a, d, most, stream, launched);
      if (err != cudaSuccess || *launched) return err;
    }
    return launch_group_reread_of<T, Op, kGroupRereadBlock, V>(a, d, kMaxPortableCluster, stream, launched);
  }
  return cudaSuccess;
}

// Rows read twice (reread.cuh): one block a row, or a statistic shared by rows, or each row
// split across blocks where the rows are too few to fill the GPU or share statistics; the
// parts' statistics in alloc(bytes).
template <typename T, typename Op, int V, typename Alloc>
inline cudaError_t launch_reread(const ArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc) {
  constexpr auto reread = reduce_scale_reread_kernel<T, Op, kRereadBlock, V>;
  cudaError_t err = cudaSuccess;
  if (rows_share_stats<T, Op>(a)) {
    bool launched = false;
    err = launch_group_reread<T, Op, V>(a, stream, &launched);
    if (err != cudaSuccess || launched) return err;
  }
  int64_t resident = 0;
  err = resident_units<reread>(dim3(kRereadBlock), 1, 0, &resident);
  if (err != cudaSuccess) return err;
  const RowSplitting c = split_rows(a.view.outer, a.view.length / V, resident, Op::kGrouped);
  if (c.parts == 1 && !rows_share_stats<T, Op>(a))
    return launch_units<reread>(Grid::PerUnit, dim3(kRereadBlock), 1, a.view.outer, 0, stream, a);
  using Stat = RowStat<Op, acc_t<T>>;
  const int64_t groups = [&] {  // a grouped op's statistics, merged from their rows' parts
    if constexpr (Op::kGrouped) return a.grouping.stat_groups;
    else return int64_t(0);
  }();
  auto* stats = static_cast<Stat*>(alloc(sizeof(Stat) * (a.view.outer * c.parts + groups)));
  if (stats == nullptr) return cudaErrorMemoryAllocation;
  err = launch_units<reduce_scale_split_sum_kernel<T, Op, kRereadBlock, V>>(
      Grid::PerUnit, dim3(kRereadBlock), 1, a.view.outer * c.parts, 0, stream, a, c, stats);
  if (err != cudaSuccess) return err;
  const Stat* scaled_by = stats;
  if constexpr (Op::kGrouped) {  // each statistic's parts merged once, for the scaling blocks
    Stat* merged = stats + a.view.outer * c.parts;
    err = launch_units<reduce_scale_merge_stats_kernel<T, Op, kRereadBlock>>(
        Grid::PerUnit, dim3(kRereadBlock), 1, groups, 0, stream, a, c, static_cast<const Stat*>(stats), merged);
    if (err != cudaSuccess) return err;
    scaled_by = merged;
  }
  return launch_units<reduce_scale_split_scale_kernel<T, Op, kRereadBlock, V>>(
      Grid::PerUnit, dim3(kRereadBlock), 1, a.view.outer * c.spans, 0, stream, a, c, scaled_by);
}

// Tiles a block of `kernel` (B threads, one tile B 16-byte vectors) holds on this device, read
// once a device: as many as fit 1024 / B blocks a SM, each with the 1 KB the device reserves a
// block, at most GroupedPolicy::kChannelsMaxHeld.
template <auto kernel, int B> inline cudaError_t channels_held_tiles(int* out) {
  static int cache[kMaxDevices] = {};  // tiles + 1; 0 = not read yet
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices) return cudaErrorInvalidDevice;
  if (cache[dev] == 0) {
    DeviceInfo d;
    err = device_info(&d);
    cudaFuncAttributes attrs;
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&attrs, kernel);
    if (err != cudaSuccess) return err;
    const int64_t smem_block = min64(d.smem_optin, d.smem_sm / (1024 / B) - 1024) - attrs.sharedSizeBytes;
    const int64_t tiles = min64(smem_block / (int64_t(B) * 16), GroupedPolicy::kChannelsMaxHeld);
    cache[dev] = static_cast<int>(tiles > 0 ? tiles : 0) + 1;
  }
  *out = cache[dev] - 1;
  return cudaSuccess;
}

// Statistics shared by rows taken by the whole GPU one after another (channels.cuh), in
// Cfg's blocks and streams, where each is GroupedPolicy::kChannelsMinRatio times what the blocks
// hold or more: *launched tells whether they were. A block holds as many tiles as the
// device's shared memory takes. Doubles are read twice (channels.cuh's batches spilled).
template <typename T, typename Op, typename Cfg, typename Alloc>
inline cudaError_t launch_channels_of(const ArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc, bool* launched) {
  *launched = false;
  if constexpr (Op::kGrouped && sizeof(T) != 8) {
    constexpr int V = vec16<T>(), B = Cfg::kBlock;
    constexpr auto kernel = reduce_scale_channels_kernel<T, Op, B>;
    const View& v = a.view;
    const Grouping<acc_t<T>>& g = a.grouping;
    const bool whole_vectors = v.length % V == 0 && v.x_so % V == 0 && v.y_so % V == 0 &&
                               reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
    if (!whole_vectors || g.span != v.length || g.groups != g.stat_groups) return cudaSuccess;
    constexpr int64_t tile_bytes = int64_t(B) * 16;
    int held = 0;
    cudaError_t err = channels_held_tiles<kernel, B>(&held);
    if (err != cudaSuccess || held < 1) return err;
    const size_t smem = static_cast<size_t>(held * tile_bytes);
    int64_t resident = 0;
    err = resident_units<kernel>(dim3(B), 1, smem, &resident);
    if (err != cudaSuccess) return err;
    const int64_t row_tiles = ceil_div(v.length / V, B), tiles = v.outer / g.stat_groups * row_tiles;
    const int64_t streams = min64(Cfg::kStreams, g.stat_groups), blocks = resident / streams;
    if (blocks == 0 || tiles < GroupedPolicy::kChannelsMinRatio * held * blocks || tiles > UINT32_MAX - blocks)
      return cudaSuccess;
    using State = HeldState<RowStat<Op, acc_t<T>>>;
    void* workspace = alloc(State::bytes(g.stat_groups, blocks));
    if (workspace == nullptr) return cudaErrorMemoryAllocation;
    err = cudaMemsetAsync(workspace, 0, State::counter_bytes(g.stat_groups), stream);
    if (err != cudaSuccess) return err;
    *launched = true;
    const ChannelPlan p{static_cast<unsigned>(row_tiles), static_cast<unsigned>(tiles), held,
                        static_cast<unsigned>(streams)};
    return launch_units<kernel>(Grid::Cooperative, dim3(B), 1, resident, smem, stream, a, p,
                                State::in(workspace, g.stat_groups));
  }
  return cudaSuccess;
}
template <typename T, typename Op, typename Alloc>
inline cudaError_t launch_channels(const ArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc, bool* launched) {
  DeviceInfo d;
  const cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  return channels_two_streams(d) ? launch_channels_of<T, Op, ChannelsTwoStreams>(a, stream, alloc, launched)
                                 : launch_channels_of<T, Op, ChannelsOneStream>(a, stream, alloc, launched);
}

// The held kernels of a config (held.cuh): parts of kPart vectors in two buffers a block.
template <typename Cfg> constexpr int kHeldPart = Cfg::kBlock * Cfg::kVecs;
template <typename Cfg> constexpr size_t kHeldSmem = 2 * size_t(kHeldPart<Cfg>) * 16;
template <typename T, typename Op, typename Cfg>
constexpr auto held_serial = reduce_scale_held_kernel<T, Op, Cfg::kBlock, Cfg::kVecs>;
template <typename T, typename Op, typename Cfg>
constexpr auto held_split =
    reduce_scale_held_split_kernel<T, Op, Cfg::kSumming, Cfg::kBlock - Cfg::kSumming, kHeldPart<Cfg>>;

// Whether rows of `parts` parts go to the split kernel, `resident` of whose blocks fit.
inline bool held_split_rows(int64_t parts, int64_t resident) {
  return 100 * parts <= HeldPolicy::kSplitPercent * resident && parts <= 2 * resident;
}

// Launches the held kernel `kernel` of config Cfg over a's rows, `parts` parts a row.
template <auto kernel, typename Cfg, typename T, typename Op, typename Alloc>
inline cudaError_t launch_held_kernel(const ArgsFor<T, Op>& a, int64_t parts, cudaStream_t stream, Alloc&& alloc) {
  using State = HeldState<RowStat<Op, acc_t<T>>>;
  const int64_t rows = a.view.outer;
  const HeldPlan p{parts, ceil_div(a.view.length / vec16<T>(), parts), rows * parts};
  void* workspace = alloc(State::bytes(rows, parts));
  if (workspace == nullptr) return cudaErrorMemoryAllocation;
  const cudaError_t err = cudaMemsetAsync(workspace, 0, State::counter_bytes(rows), stream);
  if (err != cudaSuccess) return err;
  return launch_units<kernel>(Grid::Cooperative, dim3(Cfg::kBlock), 1, p.units, kHeldSmem<Cfg>, stream, a, p,
                              State::in(workspace, rows));
}

// Aligned rows held across the GPU (held.cuh), where every part of a row can be resident at
// once: *launched tells whether they were.
template <typename T, typename Op, typename Alloc>
inline cudaError_t launch_held(const ArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc, bool* launched) {
  *launched = false;
  const int64_t rows = a.view.outer, nvec = a.view.length / vec16<T>();
  cudaError_t err = cudaSuccess;
  if constexpr (kFp32Norm<T, Op>) {  // parts of 1024 threads (HeldSmParts)
    using Cfg = HeldSmParts;
    int64_t resident = 0;
    err = resident_units<held_split<T, Op, Cfg>>(dim3(Cfg::kBlock), 1, kHeldSmem<Cfg>, &resident);
    if (err != cudaSuccess) return err;
    const int64_t parts = ceil_div(nvec, kHeldPart<Cfg>);
    if (held_split_rows(parts, resident) && rows * parts >= HeldPolicy::kSmParts * resident) {
      *launched = true;
      return launch_held_kernel<held_split<T, Op, Cfg>, Cfg, T, Op>(a, parts, stream, alloc);
    }
  }
  using Cfg = HeldFor<T, Op>;
  const int64_t parts = ceil_div(nvec, kHeldPart<Cfg>);
  int64_t resident = 0, resident_split = 0;
  err = resident_units<held_serial<T, Op, Cfg>>(dim3(Cfg::kBlock), 1, kHeldSmem<Cfg>, &resident);
  if (err == cudaSuccess) err = resident_units<held_split<T, Op, Cfg>>(dim3(Cfg::kBlock), 1, kHeldSmem<Cfg>, &resident_split);
  if (err != cudaSuccess || parts > 2 * resident) return err;
  *launched = true;
  if (held_split_rows(parts, resident) && parts <= 2 * resident_split)
    return launch_held_kernel<held_split<T, Op, Cfg>, Cfg, T, Op>(a, parts, stream, alloc);
  return launch_held_kernel<held_serial<T, Op, Cfg>, Cfg, T, Op>(a, parts, stream, alloc);
}

template <typename T, typename Op, typename Alloc>
inline cudaError_t launch_reduce_scale_rows(const ArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc) {
  constexpr int V = vec16<T>();
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  const int64_t nvec = a.view.length / V;  // whole vectors in the worst-aligned row
  const bool aligned = a.view.rows_share_alignment(a.x, a.y);
  if (aligned && !rows_share_stats<T, Op>(a)) {
    if (nvec <= RowsOneWarp::kVecsPerBlock) return launch_rows<T, Op, RowsOneWarp>(a, d, 1, stream);
    if (nvec <= RowsTwoWarps::kVecsPerBlock) return launch_rows<T, Op, RowsTwoWarps>(a, d, 1, stream);
    if (nvec <= RowsFourWarps::kVecsPerBlock) return launch_rows<T, Op, RowsFourWarps>(a, d, 1, stream);
    if (nvec <= RowsEightWarps::kVecsPerBlock) return launch_rows<T, Op, RowsEightWarps>(a, d, 1, stream);
    if (nvec <= RowsOf2048<T, Op>::kVecsPerBlock) return launch_rows<T, Op, RowsOf2048<T, Op>>(a, d, 1, stream);
    if (nvec <= RowsOf4096<T, Op>::kVecsPerBlock) return launch_rows<T, Op, RowsOf4096<T, Op>>(a, d, 1, stream);
    using Cluster = RowsCluster<T, Op>;
    const int max_cluster = d.major >= 9 ? rows_max_cluster<T, Op>(a) : 1;
    if (nvec <= Cluster::kVecsPerBlock * max_cluster) {
      const int cluster = static_cast<int>(ceil_div(nvec, Cluster::kVecsPerBlock));
      int64_t fit = 1;
      if (cluster > kMaxPortableCluster) {  // a non-portable size the device may not run: then read twice
        err = resident_units<reduce_scale_rows_kernel<T, Op, Cluster>>(dim3(Cluster::kBlock), cluster,
                                                                        Cluster::kSmemBytes, &fit);
        if (err != cudaSuccess) return err;
      }
      if (fit > 0) return launch_rows<T, Op, Cluster>(a, d, cluster, stream);
    }
    bool launched = false;
    err = launch_held<T, Op>(a, stream, alloc, &launched);
    if (err != cudaSuccess || launched) return err;
  }
  if (rows_share_stats<T, Op>(a)) {
    bool launched = false;
    err = launch_channels<T, Op>(a, stream, alloc, &launched);
    if (err != cudaSuccess || launched) return err;
  }
  return aligned ? launch_reread<T, Op, V>(a, stream, alloc) : launch_reread<T, Op, 1>(a, stream, alloc);
}

template <typename T, typename Op, typename Cfg>
inline cudaError_t launch_strided(const ArgsFor<T, Op>& a, cudaStream_t stream, int cluster = 1) {
  const int64_t tiles = a.view.outer * ceil_div(a.view.inner, Cfg::kTile);
  // Clustered tiles hide their cross-block reduction behind the next tile's prefetch: a
  // grid of one cluster per tile (which prefetches nothing) ran 2-3% slower on
  // (8, 1024, 64, 64); unclustered, one block per tile ran 2% faster.
  const Grid grid = cluster > 1 ? Grid::Persistent : Grid::PerUnit;
  return launch_units<reduce_scale_strided_kernel<T, Op, Cfg>>(grid, dim3(Cfg::kBx, Cfg::kBy), cluster, tiles,
                                                               Cfg::template smem_bytes<T>(), stream, a);
}

// The strided config Cfg with as many blocks a cluster as its columns need.
template <typename T, typename Op, typename Cfg>
inline cudaError_t launch_strided_cluster(const ArgsFor<T, Op>& a, cudaStream_t stream) {
  static_assert(Cfg::kClustered, "a clustered launch of a config without the cluster's column sums");
  return launch_strided<T, Op, Cfg>(a, stream, static_cast<int>(ceil_div(a.view.length, Cfg::kHeld)));
}

// The column slots M a vector holds where the slab kernels (slab.cuh) take a view: 0 where
// they do not; 1 for single elements; 2, 4 or 8 for 16-byte vectors. They take 2 to
// SlabPolicy::kMaxColumns columns, a position's vectors no more than a block's threads: in
// 16-byte vectors where the slabs (one outer's (length, inner) block, in x and y) are
// contiguous, inner is a multiple of V or a power of two below it and the slabs hold whole
// vectors, each starting on a 16-byte boundary; else single elements, read where they lie (a
// slice of the columns, or every other one: rms_norm fp32 (1, 4194304, 4)[..., :2] took 53.8
// ms on the strided kernels, H100).
template <typename T, typename Op> inline int slab_slots(const ArgsFor<T, Op>& a) {
  constexpr int V = vec16<T>();
  static_assert(SlabPolicy::kMaxColumns <= kSlabMaxColumns, "columns a slab block's shared memory holds");
  const View& v = a.view;
  const int64_t k = v.inner;
  if (!kSlabOp<Op> || k < 2 || k > SlabPolicy::kMaxColumns) return 0;
  const bool vectors = v.x_si == 1 && v.y_si == 1 && v.x_sl == k && v.y_sl == k && (k % V == 0 || V % k == 0) &&
                       v.length * k % V == 0 &&
                       (v.outer == 1 || (v.x_so % V == 0 && v.y_so % V == 0)) &&
                       reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
  const int m = vectors ? static_cast<int>(k < V ? k : V) : 1;
  return k / m <= kSlabBlock ? m : 0;
}

// Slabs read in W-element vectors of M column slots (slab.cuh): a warp a short slab (16-byte
// vectors, a power-of-two CV up to 32); one block a slab where they fill the GPU; else split.
// WHOLE: every thread of a block at work (CV divides the block).
template <typename T, typename Op, int W, int M, bool WHOLE, typename Alloc>
inline cudaError_t launch_slabs(const ArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc) {
  constexpr int B = kSlabBlock;
  constexpr auto sum = reduce_scale_slab_sum_kernel<T, Op, B, W, M, WHOLE>;
  int64_t resident = 0;
  cudaError_t err = resident_units<sum>(dim3(B), 1, 0, &resident);
  if (err != cudaSuccess) return err;
  const int cvs = static_cast<int>(a.view.inner / M);
  const SlabSplitting s = split_slabs(a.view.outer, a.view.length * a.view.inner / W, W, cvs, resident);
  if constexpr (W > 1 && WHOLE) {
    if (cvs <= 32 && s.nvec <= SlabPolicy::kWarpVecs)  // lanes joined by shuffles
      return launch_units<reduce_scale_slab_warp_kernel<T, Op, B, W, M>>(Grid::PerUnit, dim3(B), 1,
                                                                          ceil_div(a.view.outer, B / 32), 0, stream, a, s);
  }
  if (s.parts == 1)
    return launch_units<reduce_scale_slab_reread_kernel<T, Op, B, W, M, WHOLE>>(Grid::PerUnit, dim3(B), 1,
                                                                                 a.view.outer, 0, stream, a, s);
  using Stat = RowStat<Op, acc_t<T>>;
  const int64_t columns = a.view.outer * a.view.inner;  // of every slab
  auto* stats = static_cast<Stat*>(alloc(sizeof(Stat) * columns * (s.parts + 1)));
  if (stats == nullptr) return cudaErrorMemoryAllocation;
  Stat* merged = stats + columns * s.parts;
  err = launch_units<sum>(Grid::PerUnit, dim3(B), 1, a.view.outer * s.parts, 0, stream, a, s, stats);
  if (err == cudaSuccess)
    err = launch_units<reduce_scale_slab_merge_kernel<T, Op, B>>(Grid::PerUnit, dim3(B), 1, columns, 0, stream, a, s,
                                                                 static_cast<const Stat*>(stats), merged);
  if (err != cudaSuccess) return err;
  return launch_units<reduce_scale_slab_scale_kernel<T, Op, B, W, M, WHOLE>>(
      Grid::PerUnit, dim3(B), 1, a.view.outer * s.spans, 0, stream, a, s, static_cast<const Stat*>(merged));
}

// alloc(bytes) -> void*: device memory the launches may use (stream-ordered; null if it
// cannot be had), for the partial statistics of rows split across blocks.
template <typename T, typename Op, typename Alloc>
inline cudaError_t launch_reduce_scale(const ArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc) {
  if (a.view.empty()) return cudaSuccess;
  if (a.view.rows()) return launch_reduce_scale_rows<T, Op>(a, stream, alloc);
  // A grouped op's strided columns are its channels, each its own statistic.
  if constexpr (Op::kGrouped) {
    const Grouping<acc_t<T>>& g = a.grouping;
    if (g.groups != a.view.inner || g.span != a.view.length || g.stat_groups != a.view.outer * a.view.inner)
      return cudaErrorInvalidValue;
  }
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  const int64_t n = a.view.length;
  const bool sm90 = d.major >= 9;  // clusters, and the configs built for sm_90 only
  const int64_t max_cluster = sm90 ? kStridedMaxCluster : 1;
  if constexpr (kSlabOp<Op>) {
    // Slabs, unless 32 columns or more that the strided kernels serve with a tile for every
    // SM: columns they hold on chip (fp32 rms_norm (64, 4096, 96) 0.075 ms strided, 0.106 as
    // slabs; (16, 32768, 32), read twice by 16 blocks, 1.820 strided, 0.072 as slabs) and past
    // 128 columns any ((64, 4096, 256) read twice, 0.207 ms, 87% of copy; (1, 2**20, 256) by
    // 2 blocks, 65.2 ms against torch.compile's 1.08).
    const bool strided_holds = a.view.inner >= 32 && a.view.outer * ceil_div(a.view.inner, 32) >= d.sms &&
                               (a.view.inner > 128 || n <= StridedCluster<T>::kHeld * max_cluster);
    constexpr int V = vec16<T>();
    const int m = strided_holds ? 0 : slab_slots<T, Op>(a);
    if (m == 1) return launch_slabs<T, Op, 1, 1, false>(a, stream, alloc);
    if (m > 1 && kSlabBlock % (a.view.inner / m) != 0) return launch_slabs<T, Op, V, V, false>(a, stream, alloc);
    if (m == 2) return launch_slabs<T, Op, V, 2, true>(a, stream, alloc);
    if constexpr (V >= 4) {
      if (m == 4) return launch_slabs<T, Op, V, 4, true>(a, stream, alloc);
    }
    if constexpr (V >= 8) {
      if (m == 8) return launch_slabs<T, Op, V, 8, true>(a, stream, alloc);
    }
  }
  const bool vec = a.view.inner_vectorizable(a.x, a.y, vec16<T>());
  if (vec) {
    if (n <= StridedVecFew<T>::kHeld) return launch_strided<T, Op, StridedVecFew<T>>(a, stream);
    if (n <= StridedVecShort<T>::kHeld) return launch_strided<T, Op, StridedVecShort<T>>(a, stream);
    if (n <= StridedVecMedium<T>::kHeld) return launch_strided<T, Op, StridedVecMedium<T>>(a, stream);
    if (sm90 && n <= StridedVecTall<T>::kHeld) return launch_strided<T, Op, StridedVecTall<T>>(a, stream);
    if (sm90 && n <= StridedVecTaller<T>::kHeld) return launch_strided<T, Op, StridedVecTaller<T>>(a, stream);
    if constexpr (sizeof(T) > 2) {
      if (!sm90 && n <= StridedVecPreSm90<T>::kHeld) return launch_strided<T, Op, StridedVecPreSm90<T>>(a, stream);
    }
  }
  if (n <= StridedFew<T, Op>::kHeld) return launch_strided<T, Op, StridedFew<T, Op>>(a, stream);
  if (n <= StridedShort<T>::kHeld) return launch_strided<T, Op, StridedShort<T>>(a, stream);
  if (n <= StridedCluster<T>::kHeld * max_cluster) return launch_strided_cluster<T, Op, StridedCluster<T>>(a, stream);
  if (vec) return launch_strided<T, Op, StridedVecReread<T>>(a, stream);
  return launch_strided<T, Op, StridedRereadOf<T, Op>>(a, stream);
}

}  // namespace normscan

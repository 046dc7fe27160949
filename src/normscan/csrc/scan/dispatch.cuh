// Picks the scan kernel and configuration for a view, and launches it.
// Host only.
#pragma once

#include <algorithm>

#include "../device/launch.cuh"
#include "tuning.cuh"

namespace normscan {

template <typename T, typename Op, int V, typename Cfg>
inline cudaError_t launch_scan_rows(const ScanArgsFor<T, Op>& a, cudaStream_t stream) {
  return launch_units<scan_rows_kernel<T, Op, V, Cfg>>(Grid::PerUnit, dim3(Cfg::kBlock), 1, a.view.outer, 0, stream, a);
}

// A unit a cluster, as many blocks a cluster as fill the device (up to the unit's tiles), at
// as few rounds as that many take.
template <typename T, typename Op, typename Cfg, int VI>
inline cudaError_t launch_scan_strided(const ScanArgsFor<T, Op>& a, const DeviceInfo& d, cudaStream_t stream) {
  constexpr auto kernel = scan_strided_kernel<T, Op, Cfg, VI>;
  const int cvs = Cfg::column_vectors(a.view.inner, VI);
  const int64_t units = a.view.outer * Cfg::units_inner(a.view.inner, VI);
  const int64_t tiles = ceil_div(a.view.length, Cfg::tile_length(cvs));
  const int64_t fill = int64_t(kScanStridedFill) * d.sms;
  const size_t smem = Cfg::template smem_bytes<T, VI>(d.major >= 9);
  int cluster = 1;
  if (d.major >= 9 && units < fill && tiles > 1) {
    const int64_t asked = min64(min64(ceil_div(fill, units), tiles), kMaxCluster);
    cluster = static_cast<int>(ceil_div(tiles, ceil_div(tiles, asked)));
    int64_t fit = 0;
    for (;; cluster = cluster > kMaxPortableCluster ? kMaxPortableCluster : cluster / 2) {
      const cudaError_t err = resident_units<kernel>(dim3(Cfg::kBlock), cluster, smem, &fit);
      if (err != cudaSuccess) return err;
      if (fit > 0 || cluster == 1) break;
    }
  }
  return launch_units<kernel>(Grid::PerUnit, dim3(Cfg::kBlock), cluster, units, smem, stream, a);
}

// Whether a masked op's mask elements of each n-element vector of x lie aligned to the n of
// them (x's and the mask's element offsets agree modulo n); true for others.
template <typename T, typename Op>
inline bool mask_vectors(const ScanArgsFor<T, Op>& a, int n) {
  if constexpr (!kMasked<Op>) {
    return true;
  } else {
    using M = mask_t<Op>;
    const auto x_elements = reinterpret_cast<uintptr_t>(a.x) / sizeof(T);
    const auto m_elements = reinterpret_cast<uintptr_t>(a.mask) / sizeof(M);
    return reinterpret_cast<uintptr_t>(a.mask) % sizeof(M) == 0 && (m_elements % n + n - x_elements % n) % n == 0;
  }
}

// Whether the strided kernel takes this view in 16-byte vectors along inner (ScanStridedVec),
// else an element at a time (ScanStrided).
template <typename T, typename Op>
inline bool strided_vectors(const ScanArgsFor<T, Op>& a) {
  return a.view.inner_vectorizable(a.x, a.y, vec16<T>()) && mask_vectors<T, Op>(a, vec16<T>());
}

// Tiles of the look-back kernel for these rows, or 0 when one block per row is the better
// plan: enough rows to fill the device, rows of one chunk, or too few elements.
template <typename T, typename Op>
inline int64_t scan_lookback_tiles_per_row(const ScanArgsFor<T, Op>& a, int sms) {
  constexpr int64_t chunk = ScanRowsLarge::kChunkVecs * vec16<T>();
  const View& v = a.view;
  if (!v.rows() || !v.rows_share_alignment(a.x, a.y) || !mask_vectors<T, Op>(a, vec16<T>())) return 0;
  if (v.outer >= int64_t(kLookbackMaxRowsPerSm) * sms || v.length <= chunk || v.outer * v.length < kLookbackMinElements)
    return 0;
  const int64_t nvec = v.length / vec16<T>();  // whole vectors in the best-aligned row
  return ceil_div(nvec > 0 ? nvec : 1, ScanLookback::kTileVecs);
}

// Whether each outer's (length, inner) block of a tensor with strides (sl, si) lies contiguous.
inline bool contiguous_slabs(const View& v, int64_t sl, int64_t si) { return si == 1 && sl == v.inner; }

// The same, each block starting 16-byte aligned, at p with outer stride so (V-element vectors).
inline bool aligned_slabs(const View& v, const void* p, int64_t so, int64_t sl, int64_t si, int V) {
  return contiguous_slabs(v, sl, si) && reinterpret_cast<uintptr_t>(p) % 16 == 0 && (v.outer == 1 || so % V == 0);
}

// A column scan's plan (0 slabs: not one) for unmasked slabs of at most a block's columns,
// contiguous, 16-byte aligned and of whole vectors in x and y, as many slabs as the GPU's
// resident blocks or more (tuning.cuh): a slab of kScanColumnsOwnBlock bytes or more a block
// of its own, else as few slabs a block as fill those blocks once (the copies use every
// thread); as many positions a chunk as its bytes hold; the slabs' pieces a vector's
// multiple apart in the buffer, spread over the banks (pieces of one warp start at most a
// vector's multiple past the columns': a bank conflict of 2 at most); and where the block's
// columns are a warp's or fewer, its threads spread over them in runs of 2 x UNROLL
// positions or more.
template <typename T, typename Op>
inline ScanColumnsPlan scan_columns_plan(const ScanArgsFor<T, Op>& a, int sms) {
  constexpr int V = vec16<T>(), B = ScanColumns::kBlock;
  const View& v = a.view;
  const int64_t k = v.inner;
  const int64_t fill = int64_t(ScanColumns::kMinBlocks) * sms;
  if (kMasked<Op> || k < 2 || k > B || v.outer < fill || (v.length * k) % V != 0 ||
      !aligned_slabs(v, a.x, v.x_so, v.x_sl, v.x_si, V) || !aligned_slabs(v, a.y, v.y_so, v.y_sl, v.y_si, V))
    return {};
  const bool own_block = v.length * k * int64_t(sizeof(T)) >= kScanColumnsOwnBlock;
  const int slabs = own_block ? 1 : static_cast<int>(min64(B / k, ceil_div(v.outer, fill)));
  if (ceil_div(v.outer, slabs) > 0x7fffffff) return {};
  constexpr int period = 128 / sizeof(T);  // elements across the 32 banks
  // A piece's elements (a slab alone in its block needs no padding: a 32 KB slab is one chunk).
  const int64_t room = ScanColumns::kChunkBytes / (slabs * int64_t(sizeof(T))) - (own_block ? 0 : period);
  const int64_t positions = min64(std::max<int64_t>(V, room / k / V * V), ceil_div(v.length, V) * V);
  const int64_t used = positions * k, spread = ceil_div(k, V) * V;
  const int64_t pitch = own_block ? used : used + ((spread - used % period) % period + period) % period;
  if (2 * slabs * pitch * int64_t(sizeof(T)) > int64_t(ScanColumns::kSmemBytes)) return {};  // not met: room holds it
  int splits = 1;  // threads a column
  while (slabs * k <= kScanColumnsSplitColumns && 2 * splits * slabs * k <= B &&
         2 * splits * 2 * ScanColumns::kUnroll <= positions && 2 * splits <= kScanColumnsSplits)
    splits *= 2;
  return {slabs, static_cast<int>(positions), static_cast<int>(pitch), splits};
}

template <typename T, typename Op>
inline cudaError_t launch_scan_columns(const ScanArgsFor<T, Op>& a, const ScanColumnsPlan& cols, cudaStream_t stream) {
  return launch_units<scan_columns_kernel<T, Op, ScanColumns>>(Grid::PerUnit, dim3(ScanColumns::kBlock), 1,
                                                               ceil_div(a.view.outer, cols.slabs),
                                                               ScanColumns::kSmemBytes, stream, a, cols);
}

// A slab scan's plan: tiles a slab (0 where the strided kernel takes the view), the columns
// of its tiles' layout, and how x's slab reaches shared memory.
struct ScanSlabPlan {
  int64_t tiles_per_slab = 0, columns = 0;
  SlabCopy copy = SlabCopy::Flat;
};

// The slab kernel takes inner of at most ScanSlab::kMaxColumns columns, and at least half a
// tile a slab (shorter slabs would each pay a tile's ticket, barriers and look-back); and
// either fewer columns than a vector holds (the strided kernel's scalar loads) or too few
// units for the strided kernel to fill the GPU without clusters (their blocks walk the whole
// dim: 256 slabs of 8 columns ran 0.031 ms strided, 0.040 as slabs). Inner a power of two
// with 32 vectors a position or fewer: y's (length, inner) block of each outer contiguous,
// 16-byte aligned and of whole vectors; x's alike (Flat), or gathered, a position's columns a
// copy where contiguous and aligned (Positions, unmasked), else an element a copy. Other
// inner: padded to a power of two, in the layout only where x's and y's slabs are contiguous
// and lie alike in their 16 bytes (Packed, unmasked, however many outers), else any strides
// (Padded) where the strided kernel's units times its largest cluster are fewer than the SMs,
// the dim is long, or there are fewer columns than a vector holds and the padded slab copies
// them by cp.async (tuning.cuh).
template <typename T, typename Op>
inline ScanSlabPlan scan_slab_plan(const ScanArgsFor<T, Op>& a, int sms) {
  constexpr int V = vec16<T>();
  const View& v = a.view;
  const int64_t k = v.inner;
  if (k < 2 || k > ScanSlab::kMaxColumns) return {};
  int64_t columns = 1;
  while (columns < k) columns *= 2;
  const bool packed = columns != k && !kMasked<Op> && contiguous_slabs(v, v.x_sl, v.x_si) &&
                      contiguous_slabs(v, v.y_sl, v.y_si) && v.rows_share_alignment(a.x, a.y);
  if (!packed && k >= V && v.outer * ScanStridedVec::units_inner(k, V) >= int64_t(kScanStridedFill) * sms) return {};
  if (columns / ScanSlab::slots(columns, V) > 32) return {};
  const int64_t nvec = ceil_div(v.length * columns, V);
  if (2 * nvec < ScanSlab::kTileVecs) return {};
  const int64_t tiles_per_slab = ceil_div(nvec, ScanSlab::kTileVecs);
  if (packed) return {tiles_per_slab, columns, SlabCopy::Packed};
  if (columns != k) {  // padded: tuning.cuh says where
    const int64_t units =
        v.outer * (strided_vectors<T, Op>(a) ? ScanStridedVec::units_inner(k, V) : ScanStrided::units_inner(k, 1));
    const bool copied_scalars = k < V && slab_copied<T, Op, 1, SlabCopy::Padded>();
    if (!copied_scalars && units * kMaxCluster >= sms && v.length < kScanPaddedMinLength) return {};
    return {tiles_per_slab, columns, SlabCopy::Padded};
  }
  if (!aligned_slabs(v, a.y, v.y_so, v.y_sl, v.y_si, V) || (v.length * k) % V != 0) return {};
  if (aligned_slabs(v, a.x, v.x_so, v.x_sl, v.x_si, V) && mask_vectors<T, Op>(a, V))
    return {tiles_per_slab, k, SlabCopy::Flat};
  const int64_t m = ScanSlab::slots(k, V);  // a gathered copy's elements: a vector's columns of one position
  const bool positions = !kMasked<Op> && v.x_si == 1 && reinterpret_cast<uintptr_t>(a.x) % (m * sizeof(T)) == 0 &&
                         v.x_sl % m == 0 && (v.outer == 1 || v.x_so % m == 0);
  return {tiles_per_slab, k, positions ? SlabCopy::Positions : SlabCopy::Elements};
}

template <typename T, typename Op, int M, SlabCopy COPY>
inline cudaError_t launch_scan_slabs(const ScanArgsFor<T, Op>& a, const ScanSlab::State<scan_acc_t<T>>& st,
                                     int64_t tiles_per_slab, cudaStream_t stream) {
  return launch_units<scan_slab_kernel<T, Op, M, COPY, ScanSlab>>(Grid::Persistent, dim3(ScanSlab::kBlock), 1,
                                                                    a.view.outer * tiles_per_slab,
                                                                    ScanSlab::kSmemBytes, stream, a, st,
                                                                    tiles_per_slab);
}

template <typename T, typename Op, SlabCopy COPY>
inline cudaError_t launch_scan_slabs(const ScanArgsFor<T, Op>& a, const ScanSlab::State<scan_acc_t<T>>& st,
                                     int64_t columns, int64_t tiles_per_slab, cudaStream_t stream) {
  constexpr int V = vec16<T>();
  const int64_t slots = ScanSlab::slots(columns, V);  // 2, 4 or 8, at most V
  if (slots == 2) return launch_scan_slabs<T, Op, 2, COPY>(a, st, tiles_per_slab, stream);
  if constexpr (V >= 4)
    if (slots == 4) return launch_scan_slabs<T, Op, 4, COPY>(a, st, tiles_per_slab, stream);
  if constexpr (V >= 8)
    if (slots == 8) return launch_scan_slabs<T, Op, 8, COPY>(a, st, tiles_per_slab, stream);
  return cudaErrorInvalidConfiguration;
}

// A look-back launch's workspace of `bytes` for `tiles` tiles (at most 2**31 - 1: the
// tickets), every bit one: nothing published, the ticket counter about to wrap to 0.
template <typename Alloc>
inline cudaError_t lookback_workspace(Alloc&& alloc, int64_t tiles, int64_t bytes, cudaStream_t stream, void** out) {
  if (tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  *out = alloc(bytes);
  if (*out == nullptr) return cudaErrorMemoryAllocation;
  return cudaMemsetAsync(*out, 0xff, bytes, stream);
}

// alloc(bytes) -> void*: device memory the launches may use (stream-ordered; null if it
// cannot be had), for the look-back kernel's tile states.
template <typename T, typename Op, typename Alloc>
inline cudaError_t launch_scan(const ScanArgsFor<T, Op>& a, cudaStream_t stream, Alloc&& alloc) {
  using State = ScanLookback::State<scan_acc_t<T>>;
  constexpr int V = vec16<T>();
  if (a.view.empty()) return cudaSuccess;
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  if (a.view.rows()) {
    const int64_t tiles_per_row = scan_lookback_tiles_per_row<T, Op>(a, d.sms);
    if (tiles_per_row > 0) {
      const int64_t tiles = a.view.outer * tiles_per_row;
      void* workspace = nullptr;
      err = lookback_workspace(alloc, tiles, State::bytes(tiles), stream, &workspace);
      if (err != cudaSuccess) return err;
      const State st = State::in(workspace, tiles);
      return launch_units<scan_lookback_kernel<T, Op, V, ScanLookback>>(
          Grid::Persistent, dim3(ScanLookback::kBlock), 1, tiles, ScanLookback::kSmemBytes, stream, a, st,
          tiles_per_row);
    }
    if (a.view.rows_share_alignment(a.x, a.y) && mask_vectors<T, Op>(a, V)) {
      const int64_t nvec = a.view.length / V;
      if (nvec <= ScanRowsSmall::kChunkVecs) return launch_scan_rows<T, Op, V, ScanRowsSmall>(a, stream);
      if (nvec <= ScanRowsMedium::kChunkVecs) return launch_scan_rows<T, Op, V, ScanRowsMedium>(a, stream);
      return launch_scan_rows<T, Op, V, ScanRowsLarge>(a, stream);
    }
    return launch_scan_rows<T, Op, 1, ScanRowsLarge>(a, stream);
  }
  if constexpr (!kMasked<Op>) {
    const ScanColumnsPlan cols = scan_columns_plan<T, Op>(a, d.sms);
    if (cols.slabs > 0) return launch_scan_columns<T, Op>(a, cols, stream);
  }
  const ScanSlabPlan plan = scan_slab_plan<T, Op>(a, d.sms);
  if (plan.tiles_per_slab > 0) {
    using SlabState = ScanSlab::State<scan_acc_t<T>>;
    const int64_t tiles = a.view.outer * plan.tiles_per_slab;
    void* workspace = nullptr;
    err = lookback_workspace(alloc, tiles, SlabState::bytes(tiles, plan.columns), stream, &workspace);
    if (err != cudaSuccess) return err;
    const SlabState st = SlabState::in(workspace, plan.columns);
    const auto launch = [&](auto copy) {
      return launch_scan_slabs<T, Op, decltype(copy)::value>(a, st, plan.columns, plan.tiles_per_slab, stream);
    };
    if (plan.copy == SlabCopy::Flat) return launch(std::integral_constant<SlabCopy, SlabCopy::Flat>{});
    if (plan.copy == SlabCopy::Padded) return launch(std::integral_constant<SlabCopy, SlabCopy::Padded>{});
    if constexpr (!kMasked<Op>) {  // masked gathers load element by element (slab.cuh)
      if (plan.copy == SlabCopy::Packed) return launch(std::integral_constant<SlabCopy, SlabCopy::Packed>{});
      if (plan.copy == SlabCopy::Positions) return launch(std::integral_constant<SlabCopy, SlabCopy::Positions>{});
    }
    return launch(std::integral_constant<SlabCopy, SlabCopy::Elements>{});
  }
  if (strided_vectors<T, Op>(a))
    return launch_scan_strided<T, Op, ScanStridedVec, V>(a, d, stream);
  return launch_scan_strided<T, Op, ScanStrided, 1>(a, d, stream);
}

}  // namespace normscan

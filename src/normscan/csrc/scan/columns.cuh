// Column scans of many slabs (inner >= 2, each outer's (length, inner) block contiguous in x
// and y, 16-byte aligned and of whole vectors): a block takes S whole slabs and G threads
// each of their S x inner columns, walking the dim in chunks of P positions staged through
// shared memory. A chunk's S slab pieces (P x inner elements each, contiguous) are copied in
// whole 16-byte vectors by cp.async, the next chunk in flight while this one is scanned and
// stored; a column's G threads each take a run of its P positions, fold it, and scan it in
// place from the column's running value and the runs' folds before it; the pieces are
// stored as they lie. No look-back: a column's threads carry its running value from the
// first position to the last, so the columns, not the positions, must fill the GPU (a scan
// over time of a (batch, time, features) tensor with many batches and few features). G
// shortens each thread's serial walk where a block has fewer columns than threads. The
// slab kernel (slab.cuh) splits the dim of fewer, longer slabs.
#pragma once

#include "../device/async.cuh"
#include "../device/memory.cuh"
#include "ops.cuh"

namespace normscan {

// A column scan's shape: BLOCK threads, MINB resident blocks a SM asked of the compiler, at
// most CHUNK_BYTES of shared memory a chunk (two chunks a block), a column's elements scanned
// UNROLL at a time. tuning.cuh names the one used.
template <int BLOCK, int MINB, int CHUNK_BYTES, int UNROLL> struct ScanColumnsConfig {
  static constexpr int kBlock = BLOCK, kMinBlocks = MINB, kChunkBytes = CHUNK_BYTES, kUnroll = UNROLL;
  static constexpr size_t kSmemBytes = size_t(2) * CHUNK_BYTES;  // every launch's (the plan's buffers fit)
};

// A launch's plan: slabs a block, positions a chunk (a multiple of a vector's elements),
// elements from one slab's piece to the next in a buffer (a multiple of a vector, which
// spreads a warp's columns over the banks), and threads a column (a power of two).
struct ScanColumnsPlan {
  int slabs, positions, pitch, splits;
};

template <typename T, typename Op, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, Cfg::kMinBlocks)
    scan_columns_kernel(ScanArgs<T> a, ScanColumnsPlan plan) {
  static_assert(!kMasked<Op>, "column scans are unmasked");
  constexpr int V = vec16<T>(), BLOCK = Cfg::kBlock, UNROLL = Cfg::kUnroll;
  using A = scan_acc_t<T>;
  using VT = Vec<T, V>;
  extern __shared__ uint4 smem[];
  T* const buffers = reinterpret_cast<T*>(smem);  // buffer b's slab s at (b * slabs + s) * pitch
  const int inner = static_cast<int>(a.view.inner), pitch = plan.pitch;
  const int64_t first_slab = int64_t(blockIdx.x) * plan.slabs, length = a.view.length;
  const int slabs = static_cast<int>(min64(plan.slabs, a.view.outer - first_slab));
  const int64_t chunks = ceil_div(length, plan.positions);
  // Chunk k in scan order: its first position, and the elements of each slab's piece.
  auto chunk = [&](int64_t k, int64_t* p0) {
    *p0 = (a.reverse ? chunks - 1 - k : k) * plan.positions;
    return static_cast<int>(min64(plan.positions, length - *p0)) * inner;
  };
  auto buffer = [&](int b) { return buffers + int64_t(b) * plan.slabs * pitch; };
  // Chunk k between buffer b and x (STORE: y), in whole vectors (a slab's length x inner is
  // a multiple of a vector: the dispatcher's condition), the block's threads striped over the
  // pieces' vectors.
  auto move = [&](auto store, int64_t k, int b) {
    int64_t p0;
    const int vecs = chunk(k, &p0) / V;
    for (int i = threadIdx.x; i < slabs * vecs; i += BLOCK) {
      const int piece = i / vecs, j = i - piece * vecs;
      T* const sm = buffer(b) + piece * pitch + j * V;
      const int64_t at = p0 * inner + j * V;
      if constexpr (decltype(store)::value)
        store_vec<T, V>(a.y + (first_slab + piece) * a.view.y_so + at, *reinterpret_cast<const VT*>(sm));
      else
        cp_async16(sm, a.x + (first_slab + piece) * a.view.x_so + at);
    }
  };
  const std::false_type load;
  const std::true_type store;
  // This thread's column q (slab s's column c) and its run g of the column's G = splits.
  const int columns = plan.slabs * inner, splits = plan.splits;
  const int g = threadIdx.x / columns, q = threadIdx.x - g * columns, s = q / inner, c = q - s * inner;
  const bool scans = g < splits && s < slabs;
  __shared__ A folds[BLOCK];  // run g of column q: at g * columns + q
  A run = Op::template identity<A>();  // the column's, before this chunk
  move(load, 0, 0);
  cp_async_commit();
  if (chunks > 1) move(load, 1, 1);
  cp_async_commit();
  for (int64_t k = 0; k < chunks; ++k) {
    const int b = static_cast<int>(k & 1);
    cp_async_wait_groups<1>();  // chunk k's copies (k + 1's may still land)
    __syncthreads();
    int64_t p0;
    const int positions = chunk(k, &p0) / inner;
    T* const column = buffer(b) + s * pitch + c;
    // A thread a column (SPREAD false) compiles to the walk alone.
    with_flag(splits > 1, [&](auto spread) {
      with_flag(a.reverse, [&](auto reverse) {
        constexpr bool SPREAD = decltype(spread)::value;
        auto at = [&](int i) -> T& { return column[(decltype(reverse)::value ? positions - 1 - i : i) * inner]; };
        // Run g: positions [lo, hi) in scan order. An odd run length puts a warp's runs of
        // one column in different banks.
        int lo = 0, hi = positions;
        A from = run;  // the column's value before run g; run becomes the value after the chunk
        if constexpr (SPREAD) {
          const int span = static_cast<int>(ceil_div(positions, splits)) | 1;
          lo = min(positions, g * span);
          hi = min(positions, lo + span);
          if (scans) {
            A fold = Op::template identity<A>();
            for (int i = lo; i < hi; ++i) fold = Op::apply(fold, to_scan<T>(at(i)));
            folds[threadIdx.x] = fold;
          }
          __syncthreads();
          if (!scans) return;
          for (int h = 0; h < splits; ++h) {
            if (h == g) from = run;
            run = Op::apply(run, folds[h * columns + q]);
          }
        } else if (!scans) {
          return;
        }
        // UNROLL elements loaded, then scanned, then stored: one at a time, each load waited
        // behind the store before it (they might alias).
        with_flag(a.exclusive, [&](auto exclusive) {
          int i = lo;
          for (; i + UNROLL <= hi; i += UNROLL) {
            T v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) v[u] = at(i + u);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
              from = scan_step<Op, T>(to_scan<T>(v[u]), from, decltype(exclusive)::value, true, v[u]);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) at(i + u) = v[u];
          }
          for (; i < hi; ++i)
            from = scan_step<Op, T>(to_scan<T>(at(i)), from, decltype(exclusive)::value, true, at(i));
        });
        if constexpr (!SPREAD) run = from;
      });
    });
    __syncthreads();
    move(store, k, b);
    __syncthreads();  // every store has read buffer b
    if (k + 2 < chunks) move(load, k + 2, b);
    cp_async_commit();
  }
}

}  // namespace normscan

// Row scans (inner == 1, many rows): one block per row walks it in register-held chunks:
// a serial scan per thread, a warp-shuffle scan, a block scan, a carry. ScanRow and
// ScanChunk are also the look-back kernel's view of a row.
#pragma once

#include <type_traits>

#include "../device/memory.cuh"
#include "../device/scan.cuh"
#include "ops.cuh"

namespace normscan {

// A contiguous row in scan order. Physically the row is [head | nvec vectors | tail]; in
// scan order it is [front | body vectors 0..nvec-1 | back], with front/back swapped and
// every vector read backwards when the scan runs in reverse. M (not void): x is read times
// the row's mask m (laid out as x: m[i] is x[i]'s). L2_LAST: its 16-byte vectors loaded and
// stored under an L2 evict_last policy.
// A masked row's mask m, elements of M (unmasked rows, M void, have none: a member they never
// read still moved the look-back kernel's register allocation).
template <typename M> struct RowMask {
  const M* m;
};
template <> struct RowMask<void> {};

template <typename T, int V, typename M = void, bool L2_LAST = false> struct ScanRow : RowMask<M> {
  static constexpr bool MASKED = !std::is_void<M>::value;
  const T* x;
  T* y;
  int64_t n;
  RowSplit s;
  bool reverse;

  __device__ __forceinline__ ScanRow(const T* x_, T* y_, int64_t n_, bool reverse_)
      : x(x_), y(y_), n(n_), s(split_row<T, V>(x_, n_)), reverse(reverse_) {}
  // Row `row` of a scan's view (its mask's row too, where masked), of n elements: its length,
  // or a slab's length x inner (slab.cuh).
  template <typename Args> static __device__ __forceinline__ ScanRow of(const Args& a, int64_t row) {
    return of(a, row, a.view.length);
  }
  template <typename Args> static __device__ __forceinline__ ScanRow of(const Args& a, int64_t row, int64_t n) {
    ScanRow r(a.x + row * a.view.x_so, a.y + row * a.view.y_so, n, a.reverse);
    if constexpr (MASKED) r.m = a.mask + row * a.view.x_so;
    return r;
  }
  __device__ __forceinline__ int64_t front() const { return reverse ? s.tail : s.head; }
  __device__ __forceinline__ int64_t back() const { return reverse ? s.head : s.tail; }
  // Physical index of the e-th element in scan order.
  __device__ __forceinline__ int64_t at(int64_t e) const { return reverse ? n - 1 - e : e; }
  __device__ __forceinline__ int64_t vec_start(int64_t j) const {
    return s.head + (reverse ? s.nvec - 1 - j : j) * V;
  }
  __device__ __forceinline__ const T* vec_ptr(int64_t j) const { return x + vec_start(j); }
  // Vector j in scan order (unmasked rows).
  __device__ __forceinline__ Vec<T, V> load(int64_t j) const {
    Vec<T, V> v = load_vec<T, V, L2_LAST>(vec_ptr(j));
    if (reverse) flip(&v);
    return v;
  }
  // A masked row's vector j as loaded, its mask elements apart; then masked and in scan
  // order. Apart so that a chunk issues all its loads before it uses one (ScanChunk::load).
  using Mask = LoadedMask<M, V>;
  __device__ __forceinline__ Mask mask_of(int64_t j) const { return Mask::load(this->m + vec_start(j)); }
  __device__ __forceinline__ Vec<T, V> fetch(int64_t j, Mask* mask) const {
    *mask = mask_of(j);
    return load_vec<T, V, L2_LAST>(vec_ptr(j));
  }
  __device__ __forceinline__ void mask_in_scan_order(Vec<T, V>* v, const Mask& mask) const {
    *v = masked_vec(*v, mask.values());
    if (reverse) flip(v);
  }
  __device__ __forceinline__ void store(int64_t j, Vec<T, V> v) const {
    if (reverse) flip(&v);
    store_vec_whole<T, V, L2_LAST>(y + vec_start(j), v);
  }
  // 16-bit elements are flipped a 32-bit word at a time (the words reversed, each word's
  // halves swapped): flipped element by element, they cost the 16-bit chunked cumprod
  // backward kernels 8 bytes of spills (sm_90).
  static __device__ __forceinline__ void flip(Vec<T, V>* v) {
    if constexpr (sizeof(T) == 2 && V % 2 == 0) {
      auto* w = reinterpret_cast<unsigned*>(v->v);
#pragma unroll
      for (int i = 0; i < V / 4; ++i) {
        const unsigned t = w[i];
        w[i] = __byte_perm(w[V / 2 - 1 - i], 0, 0x1032);
        w[V / 2 - 1 - i] = __byte_perm(t, 0, 0x1032);
      }
    } else {
#pragma unroll
      for (int i = 0; i < V / 2; ++i) {
        const T t = v->v[i];
        v->v[i] = v->v[V - 1 - i];
        v->v[V - 1 - i] = t;
      }
    }
  }
  // Running value over the front elements, computed by every caller; `writer` writes them.
  template <typename Op>
  __device__ __forceinline__ scan_acc_t<T> scan_front(scan_acc_t<T> run, bool exclusive, bool writer) const {
    for (int64_t e = 0; e < front(); ++e) run = scan_one<Op>(at(e), run, exclusive, writer);
    return run;
  }
  // The back elements, after everything else, written by `writer`.
  template <typename Op>
  __device__ __forceinline__ void scan_back(scan_acc_t<T> run, bool exclusive, bool writer) const {
    for (int64_t e = n - back(); e < n; ++e) run = scan_one<Op>(at(e), run, exclusive, writer);
  }
  // scan_step written out: through the call, the fp64 row and look-back kernels compiled
  // to other machine code (the rest did not), and this form is the one measured.
  template <typename Op>
  __device__ __forceinline__ scan_acc_t<T> scan_one(int64_t p, scan_acc_t<T> run, bool exclusive, bool writer) const {
    scan_acc_t<T> v;
    if constexpr (MASKED) v = to_scan<T>(masked(x[p], this->m[p]));
    else v = to_scan<T>(x[p]);
    if (exclusive && writer) y[p] = from_scan<T>(run);
    run = Op::apply(run, v);
    if (!exclusive && writer) y[p] = from_scan<T>(run);
    return run;
  }
};

// One chunk of BLOCK * NV body vectors held in registers, warp-striped so that loads are
// coalesced: warp w holds vectors first + w*32*NV + k*32 + lane, k < NV. Running values in A.
template <typename T, typename Op, int V, int BLOCK, int NV, typename A_ = scan_acc_t<T>> struct ScanChunk {
  using A = A_;
  static constexpr int WARPS = BLOCK / 32;
  static constexpr int64_t VECS = int64_t(BLOCK) * NV;
  Vec<T, V> buf[NV];
  A pre[NV];      // exclusive prefix of each held vector within the warp's share
  A warp_total;   // the warp's share combined
  A warp_prefix;  // shares of earlier warps combined
  A total;        // the whole chunk combined

  __device__ __forceinline__ static int64_t index(int64_t first, int k) {
    return first + (threadIdx.x / 32) * 32 * NV + k * 32 + threadIdx.x % 32;
  }
  template <typename Row> __device__ __forceinline__ void load(const Row& r, int64_t first, int64_t end) {
    if constexpr (!Row::MASKED) {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (index(first, k) < end) buf[k] = r.load(index(first, k));
    } else {
      // Every load issued before any mask is applied, and a whole chunk's unguarded: with the
      // mask applied at each load, or with guards, the compiler waited for each vector's
      // mask before the next loads (KernelBench 93 at 89% of copy, the unmasked scans 99%).
      // Unmasked kernels through this path ran 0.7% slower (89-92).
      typename Row::Mask ms[NV] = {};
      const bool whole = first + VECS <= end;
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (whole || index(first, k) < end) buf[k] = r.fetch(index(first, k), &ms[k]);
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (index(first, k) < end) r.mask_in_scan_order(&buf[k], ms[k]);
    }
  }
  // Warp-level scans of the held vectors (invalid ones count as the identity).
  __device__ __forceinline__ void scan_warp(int64_t first, int64_t end) {
    const int lane = threadIdx.x % 32;
    A run = Op::template identity<A>();
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const A t = index(first, k) < end ? combine<Op, T, V, A>(buf[k]) : Op::template identity<A>();
      const A inc = warp_inclusive_scan<Op>(t, lane);
      const A up = __shfl_up_sync(kFullMask, inc, 1);
      pre[k] = Op::apply(run, lane == 0 ? Op::template identity<A>() : up);
      run = Op::apply(run, __shfl_sync(kFullMask, inc, 31));
    }
    warp_total = run;
  }
  // Block-level: each warp's prefix and the chunk total. One barrier; `totals` has WARPS
  // entries and must not be rewritten before the next barrier.
  __device__ __forceinline__ void scan_block(A* totals) {
    warp_prefix = block_exclusive_scan_warps<Op, WARPS>(warp_total, totals, &total);
  }
  template <typename Row>
  __device__ __forceinline__ void store(const Row& r, int64_t first, int64_t end, A carry, bool exclusive) {
    const A base = Op::apply(carry, warp_prefix);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (index(first, k) < end) {
        Vec<T, V> out;
        scan_items<Op>(buf[k], &out, Op::apply(base, pre[k]), exclusive);
        r.store(index(first, k), out);
      }
    }
  }
};

// A row scan's shape: BLOCK threads holding NV vectors each a chunk; MINB resident blocks a
// SM asked of the compiler. tuning.cuh names the ones used.
template <int BLOCK, int NV, int MINB> struct ScanRowsConfig {
  static constexpr int kBlock = BLOCK, kVecs = NV, kMinBlocks = MINB;
  static constexpr int64_t kChunkVecs = int64_t(BLOCK) * NV;
};

template <typename T, typename Op, int V, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, (scan_min_blocks<T, Op>(Cfg::kMinBlocks))) scan_rows_kernel(ScanArgsFor<T, Op> a) {
  using A = scan_acc_t<T>;
  using Chunk = ScanChunk<T, Op, V, Cfg::kBlock, Cfg::kVecs>;
  __shared__ A totals[2][Chunk::WARPS];  // double-buffered: one barrier per chunk
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.view.outer; row += gridDim.x) {
    // x loaded and y stored under an L2 evict_last policy, as the unclustered reduce-scale rows
    // do (measured: docs/tuning-record.md, scan-rows-l2-last).
    const auto r = ScanRow<T, V, mask_t<Op>, sizeof(T) * V == 16>::of(a, row);
    A carry = r.template scan_front<Op>(Op::template identity<A>(), a.exclusive, threadIdx.x == 0);
    for (int64_t first = 0; first < r.s.nvec; first += Chunk::VECS, parity ^= 1) {
      Chunk c;
      c.load(r, first, r.s.nvec);
      c.scan_warp(first, r.s.nvec);
      c.scan_block(totals[parity]);
      c.store(r, first, r.s.nvec, carry, a.exclusive);
      carry = Op::apply(carry, c.total);
    }
    r.template scan_back<Op>(carry, a.exclusive, threadIdx.x == 0);
  }
}

}  // namespace normscan

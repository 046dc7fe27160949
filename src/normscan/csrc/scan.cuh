// Scan family: inclusive or exclusive, forward or reverse scans with an associative op
// (ProdOp: cumprod, SumOp: cumsum) over one dim of a tensor seen as (outer, length, inner).
// The running value is kept in scan_acc_t<T>: fp32 for 16-bit types, as PyTorch does; fp64
// for fp32 and fp64. A product's rounding error grows with the number of multiplications
// on its path, and a parallel scan has more of them than PyTorch's mostly-sequential one:
// in fp32 it measured 2.7x PyTorch's error on 65539-long rows; in fp64 it is one final rounding.
//
// Kernels, by layout:
//   rows      (inner == 1, many rows): one block per row walks it in register-held chunks:
//             a serial scan per thread, a warp-shuffle scan, a block scan, a carry.
//   lookback  (inner == 1, few long rows): the row is cut into tiles spread over the whole
//             GPU, chained by a single-pass decoupled look-back.
//   strided   (inner > 1): threads along inner (coalesced, 16-byte vectors of adjacent
//             columns where the layout allows), each scanning a run of its columns; the
//             runs are joined through shared memory, then carried on.
#pragma once

#include "launch.cuh"

// Tuning knobs (tools/tune.py builds variants with -D); the defaults are the measured best.
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
#ifndef NORMSCAN_SCAN_STRIDED_ITEMS  // consecutive positions per thread in the strided scan
#define NORMSCAN_SCAN_STRIDED_ITEMS 16
#endif
#ifndef NORMSCAN_SCAN_STRIDED_VEC_ITEMS  // the same, when each position is a 16-byte vector
#define NORMSCAN_SCAN_STRIDED_VEC_ITEMS 8
#endif

namespace normscan {

// The scan ops by the name the binding dispatches on.
#define NORMSCAN_FOR_EACH_SCAN_OP(X) X("prod", ProdOp) X("sum", SumOp)

template <typename T> struct ScanAccType { using type = acc_t<T>; };
template <> struct ScanAccType<float> { using type = double; };
template <typename T> using scan_acc_t = typename ScanAccType<T>::type;

template <typename T>
__device__ __forceinline__ scan_acc_t<T> to_scan(T v) { return static_cast<scan_acc_t<T>>(Convert<T>::to_acc(v)); }
template <typename T>
__device__ __forceinline__ T from_scan(scan_acc_t<T> v) { return Convert<T>::from_acc(static_cast<acc_t<T>>(v)); }

// Look-back values between blocks. A value is its own flag: the workspace starts all ones
// (a NaN that no published value has: NaNs are published as the canonical NaN), so one
// load, single-copy atomic for each value, both tests and reads it (a separate flag would
// put a second dependent round trip to L2 on every step of the look-back).
__device__ __forceinline__ bool unpublished(double v) { return __double_as_longlong(v) == -1ll; }
__device__ __forceinline__ bool unpublished(float v) { return __float_as_uint(v) == 0xffffffffu; }
// A tile's inclusive prefix and aggregate, side by side, in one load.
__device__ __forceinline__ void load_published(const double* p, double* inclusive, double* aggregate) {
  unsigned long long i, g;
  asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];" : "=l"(i), "=l"(g) : "l"(p) : "memory");
  *inclusive = __longlong_as_double(static_cast<long long>(i));
  *aggregate = __longlong_as_double(static_cast<long long>(g));
}
__device__ __forceinline__ void load_published(const float* p, float* inclusive, float* aggregate) {
  unsigned i, g;
  asm volatile("ld.relaxed.gpu.global.v2.b32 {%0, %1}, [%2];" : "=r"(i), "=r"(g) : "l"(p) : "memory");
  *inclusive = __uint_as_float(i);
  *aggregate = __uint_as_float(g);
}
__device__ __forceinline__ void publish(double* p, double v) {
  if (v != v) v = __longlong_as_double(0x7ff8000000000000ll);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(__double_as_longlong(v)) : "memory");
}
__device__ __forceinline__ void publish(float* p, float v) {
  if (v != v) v = __uint_as_float(0x7fc00000u);
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(__float_as_uint(v)) : "memory");
}

template <typename T> struct ScanArgs {
  const T* x;
  T* y;
  int64_t outer, length, inner;
  int64_t x_so, x_sl, x_si;  // element strides of x in the (outer, length, inner) view
  int64_t y_so, y_sl, y_si;
  bool reverse;    // scan from the last element to the first
  bool exclusive;  // y[i] combines x[0..i) instead of x[0..i]
};

// Look-back state, one entry per tile: its inclusive prefix, then its aggregate, read in one
// load. Entries are spaced out: every block polls the latest tiles' entries while their
// owners publish, and tiles sharing a line slow each other. One row of 2**28, kernel only:
// two arrays of packed values 0.823 ms; pairs every 16 bytes 0.786, 32 0.770, 64 0.764,
// 128 0.765, 256 0.775 (a larger memset). At launch every bit of it is one (one memset):
// nothing is published, and the ticket counter holds 2**64 - 1, so that the first ticket
// taken wraps to 0.
template <typename A> struct LookbackState {
  static constexpr int64_t kEntry = NORMSCAN_LOOKBACK_ENTRY;
  static_assert(kEntry % (2 * sizeof(A)) == 0, "an entry holds a pair, aligned for one load");
  static constexpr int64_t kHeader = kEntry > 16 ? kEntry : 16;  // the ticket's own room
  A* entries;
  unsigned long long* ticket;  // hands out tiles in launch order, so predecessors always run
  __device__ __forceinline__ int64_t take_ticket() const { return static_cast<int64_t>(atomicAdd(ticket, 1ull) + 1ull); }
  __device__ __forceinline__ A* inclusive(int64_t tile) const { return entries + tile * (kEntry / sizeof(A)); }
  __device__ __forceinline__ A* aggregate(int64_t tile) const { return inclusive(tile) + 1; }

  static constexpr int64_t bytes(int64_t tiles) { return kHeader + tiles * kEntry; }
  static LookbackState in(void* workspace, int64_t tiles) {
    auto* base = static_cast<char*>(workspace);
    LookbackState st;
    st.ticket = reinterpret_cast<unsigned long long*>(base);
    st.entries = reinterpret_cast<A*>(base + kHeader);
    return st;
  }
};

// All N values of a vector combined, in the running value's type.
template <typename Op, typename T, int N>
__device__ __forceinline__ scan_acc_t<T> combine(const Vec<T, N>& in) {
  scan_acc_t<T> t = Op::template identity<scan_acc_t<T>>();
#pragma unroll
  for (int i = 0; i < N; ++i) t = Op::apply(t, to_scan<T>(in.v[i]));
  return t;
}

// Writes the scan of `n` values starting from `run`; returns the running value after them.
// Inclusive: out[i] = run . v[0..i]; exclusive: out[i] = run . v[0..i).
template <typename Op, typename T, int N>
__device__ __forceinline__ scan_acc_t<T> scan_items(const Vec<T, N>& in, Vec<T, N>* out, scan_acc_t<T> run, bool exclusive) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const scan_acc_t<T> v = to_scan<T>(in.v[i]);
    if (exclusive) out->v[i] = from_scan<T>(run);
    run = Op::apply(run, v);
    if (!exclusive) out->v[i] = from_scan<T>(run);
  }
  return run;
}

// A contiguous row in scan order. Physically the row is [head | nvec vectors | tail]; in
// scan order it is [front | body vectors 0..nvec-1 | back], with front/back swapped and
// every vector read backwards when the scan runs in reverse.
template <typename T, int V> struct ScanRow {
  const T* x;
  T* y;
  int64_t n;
  RowSplit s;
  bool reverse;

  __device__ __forceinline__ ScanRow(const T* x_, T* y_, int64_t n_, bool reverse_)
      : x(x_), y(y_), n(n_), s(split_row<T, V>(x_, n_)), reverse(reverse_) {}
  __device__ __forceinline__ int64_t front() const { return reverse ? s.tail : s.head; }
  __device__ __forceinline__ int64_t back() const { return reverse ? s.head : s.tail; }
  // Physical index of the e-th element in scan order.
  __device__ __forceinline__ int64_t at(int64_t e) const { return reverse ? n - 1 - e : e; }
  __device__ __forceinline__ int64_t vec_start(int64_t j) const {
    return s.head + (reverse ? s.nvec - 1 - j : j) * V;
  }
  __device__ __forceinline__ const T* vec_ptr(int64_t j) const { return x + vec_start(j); }
  __device__ __forceinline__ Vec<T, V> load(int64_t j) const {
    Vec<T, V> v = load_vec<T, V>(vec_ptr(j));
    if (reverse) flip(&v);
    return v;
  }
  __device__ __forceinline__ void store(int64_t j, Vec<T, V> v) const {
    if (reverse) flip(&v);
    store_vec<T, V>(y + vec_start(j), v);
  }
  static __device__ __forceinline__ void flip(Vec<T, V>* v) {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      const T t = v->v[i];
      v->v[i] = v->v[V - 1 - i];
      v->v[V - 1 - i] = t;
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
  template <typename Op>
  __device__ __forceinline__ scan_acc_t<T> scan_one(int64_t p, scan_acc_t<T> run, bool exclusive, bool writer) const {
    const scan_acc_t<T> v = to_scan<T>(x[p]);
    if (exclusive && writer) y[p] = from_scan<T>(run);
    run = Op::apply(run, v);
    if (!exclusive && writer) y[p] = from_scan<T>(run);
    return run;
  }
};

// One chunk of BLOCK * NV body vectors held in registers, warp-striped so that loads are
// coalesced: warp w holds vectors first + w*32*NV + k*32 + lane, k < NV.
template <typename T, typename Op, int V, int BLOCK, int NV> struct ScanChunk {
  using A = scan_acc_t<T>;
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
  __device__ __forceinline__ void load(const ScanRow<T, V>& r, int64_t first, int64_t end) {
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (index(first, k) < end) buf[k] = r.load(index(first, k));
  }
  // Warp-level scans of the held vectors (invalid ones count as the identity).
  __device__ __forceinline__ void scan_warp(int64_t first, int64_t end) {
    const int lane = threadIdx.x % 32;
    A run = Op::template identity<A>();
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const A t = index(first, k) < end ? combine<Op>(buf[k]) : Op::template identity<A>();
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
  __device__ __forceinline__ void store(const ScanRow<T, V>& r, int64_t first, int64_t end, A carry,
                                        bool exclusive) {
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

// ---------------------------------------------------------------- rows
template <typename T, typename Op, int V, int BLOCK, int NV>
__global__ void __launch_bounds__(BLOCK, NORMSCAN_SCAN_THREADS / BLOCK) scan_rows_kernel(ScanArgs<T> a) {
  using A = scan_acc_t<T>;
  using Chunk = ScanChunk<T, Op, V, BLOCK, NV>;
  __shared__ A totals[2][Chunk::WARPS];  // double-buffered: one barrier per chunk
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.outer; row += gridDim.x) {
    const ScanRow<T, V> r(a.x + row * a.x_so, a.y + row * a.y_so, a.length, a.reverse);
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

// ---------------------------------------------------------------- rows, look-back
// Tile t is chunk (t % tiles_per_row) of row (t / tiles_per_row); a ticket counter hands the
// tiles out in order. Blocks are persistent and hold two tiles in shared memory: warp 0
// looks back for the older tile while the other (data) warps take in the newer one and
// publish its aggregate, so a block keeps loading while it waits on its predecessors. (One
// row of 2**28, kernel only: one tile a block, waiting idle, 0.92 ms; two, 0.82; with the
// waits removed, 0.75; two, with each tile's look-back entry in its own 64 bytes, 0.765.)
// A tile's aggregate waits on nothing but its own loads, and the smallest unfinished
// ticket is always a tile being looked back: the chain progresses whichever blocks are
// resident. The data warps meet on arrive/wait barriers, not on a named bar.sync of part
// of the block, which compute-sanitizer's racecheck misreads (it reported a hazard between
// a write and a read on either side of a __syncthreads). The first tile of a row also
// scans the front elements, the last one the back elements.
template <typename T, typename Op, int V, int BLOCK, int NV, int MINB>
__global__ void __launch_bounds__(BLOCK, MINB)
    scan_lookback_kernel(ScanArgs<T> a, LookbackState<scan_acc_t<T>> st, int64_t tiles_per_row) {
  using A = scan_acc_t<T>;
  using VT = Vec<T, V>;
  constexpr int DATA = BLOCK - 32;  // threads of the data warps, 1..
  constexpr int DATA_WARPS = DATA / 32;
  constexpr int64_t VECS = int64_t(DATA) * NV;  // body vectors of a tile
  // Each data warp's total, by the block's tile count mod 3: a tile's set is written while
  // the previous tile's is still being read, and the one before that is free since the
  // block barrier between.
  __shared__ A s_wtot[3][DATA_WARPS];
  __shared__ A s_front[2], s_agg[2], s_prefix[2];  // by buffer
  __shared__ int64_t s_ticket[2];
  // Data-thread barriers, a phase a tile (arrive/wait, so warp 0 is not held): every data
  // thread has its warp's total, then every total is in s_wtot.
  __shared__ uint64_t s_reduced, s_joined;
  extern __shared__ uint4 slots[];  // buffer b, vector k of data thread d at [(b * NV + k) * DATA + d]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = threadIdx.x - 32;
  const int64_t tiles = a.outer * tiles_per_row;
  auto row_of = [&](int64_t tile) {
    const int64_t row = tile / tiles_per_row;
    return ScanRow<T, V>(a.x + row * a.x_so, a.y + row * a.y_so, a.length, a.reverse);
  };
  // Data thread d's vector k, warp-striped: data warp w holds [w * 32 * NV, (w + 1) * 32 * NV).
  auto vindex = [&](int64_t first, int k) { return first + (warp - 1) * 32 * NV + k * 32 + lane; };
  auto held = [&](const ScanRow<T, V>& r, int b, int k) {  // in scan order
    VT v = *reinterpret_cast<const VT*>(&slots[(b * NV + k) * DATA + d]);
    if (r.reverse) ScanRow<T, V>::flip(&v);
    return v;
  };
  // Data warps: start copying `tile` into buffer b.
  auto stage = [&](int64_t tile, int b) {
    if (tile >= tiles) return;
    const ScanRow<T, V> r = row_of(tile);
    const int64_t first = (tile % tiles_per_row) * VECS, end = min(r.s.nvec, first + VECS);
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (vindex(first, k) < end) cp_async16(&slots[(b * NV + k) * DATA + d], r.vec_ptr(vindex(first, k)));
  };
  // Data warps: once buffer b has landed, publish its tile's aggregate (its inclusive prefix
  // for a row's first tile) and take the next ticket into s_ticket[next].
  unsigned phase = 0;
  auto take_in = [&](int64_t tile, int b, int set, int next) {
    const ScanRow<T, V> r = row_of(tile);
    const int64_t c_idx = tile % tiles_per_row, first = c_idx * VECS, end = min(r.s.nvec, first + VECS);
    cp_async_wait_all();  // only this tile's copies are in flight; each thread reads its own
    A mine = Op::template identity<A>();
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (vindex(first, k) < end) mine = Op::apply(mine, combine<Op>(held(r, b, k)));
    mine = warp_reduce<Op>(mine);
    // (The first barrier is not needed for correctness: s_wtot has three sets. Without it
    // one row of 2**28 measured 0.889 ms, with it 0.832; and with it but two sets (by
    // buffer), 0.859 against 0.822. Reasons not understood: see NOTES.md.)
    mbarrier_arrive(&s_reduced);
    mbarrier_wait(&s_reduced, phase);
    if (lane == 0) s_wtot[set][warp - 1] = mine;
    mbarrier_arrive(&s_joined);  // every data thread: also its reads of the previous tile are done
    const bool last = d == 0;  // the one data thread that sums the totals
    if (last) mbarrier_wait(&s_joined, phase);
    phase ^= 1;
    if (last) {
      const A front = c_idx == 0 ? r.template scan_front<Op>(Op::template identity<A>(), a.exclusive, true)
                                 : Op::template identity<A>();
      A total = Op::template identity<A>();
      for (int w = 0; w < DATA_WARPS; ++w) total = Op::apply(total, s_wtot[set][w]);
      const A aggregate = Op::apply(front, total);
      s_front[b] = front;
      s_agg[b] = aggregate;
      publish(c_idx == 0 ? st.inclusive(tile) : st.aggregate(tile), aggregate);
      s_ticket[next] = st.take_ticket();
    }
  };
  // Warp 0: the prefix of everything before `tile`, whose aggregate is in s_agg[b].
  auto look_back = [&](int64_t tile, int b) {
    const int64_t c_idx = tile % tiles_per_row;
    A prefix = Op::template identity<A>();
    if (c_idx > 0) {
      // Walk back 32 predecessors at a time, up to the nearest inclusive prefix.
      // Chunk j < c_idx of this row is tile row_tile0 + j.
      const int64_t row_tile0 = tile - c_idx;
      for (int j = static_cast<int>(c_idx) - 1 - lane;; j -= 32) {
        bool inclusive = true;
        A v = Op::template identity<A>();
        if (j >= 0) {
          A agg;
          do load_published(st.inclusive(row_tile0 + j), &v, &agg);
          while (unpublished(v) && unpublished(agg));
          inclusive = !unpublished(v);
          if (!inclusive) v = agg;
        }
        const unsigned inclusive_lanes = __ballot_sync(kFullMask, inclusive);
        const int stop = inclusive_lanes ? __ffs(inclusive_lanes) - 1 : 31;
        prefix = Op::apply(warp_reduce<Op>(lane <= stop ? v : Op::template identity<A>()), prefix);
        if (inclusive_lanes) break;
      }
      if (lane == 0) publish(st.inclusive(tile), Op::apply(prefix, s_agg[b]));
    }
    if (lane == 0) s_prefix[b] = prefix;
  };
  // Data warps: scan buffer b's tile from its prefix and store it.
  auto scan_out = [&](int64_t tile, int b, int set) {
    const ScanRow<T, V> r = row_of(tile);
    const int64_t c_idx = tile % tiles_per_row, first = c_idx * VECS, end = min(r.s.nvec, first + VECS);
    const A carry = Op::apply(s_prefix[b], s_front[b]);
    A run = carry, total = Op::template identity<A>();
    for (int w = 0; w < DATA_WARPS; ++w) {
      if (w < warp - 1) run = Op::apply(run, s_wtot[set][w]);
      total = Op::apply(total, s_wtot[set][w]);
    }
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const bool valid = vindex(first, k) < end;
      const VT v = valid ? held(r, b, k) : VT{};
      const A inc = warp_inclusive_scan<Op>(valid ? combine<Op>(v) : Op::template identity<A>(), lane);
      const A before = __shfl_up_sync(kFullMask, inc, 1);
      if (valid) {
        VT out;
        scan_items<Op>(v, &out, Op::apply(run, lane == 0 ? Op::template identity<A>() : before), a.exclusive);
        r.store(vindex(first, k), out);
      }
      run = Op::apply(run, __shfl_sync(kFullMask, inc, 31));
    }
    if (c_idx == tiles_per_row - 1) r.template scan_back<Op>(Op::apply(carry, total), a.exclusive, d == 0);
  };

  if (threadIdx.x == 0) {
    mbarrier_init(&s_reduced, DATA);
    mbarrier_init(&s_joined, DATA);
  }
  if (threadIdx.x == 32) s_ticket[0] = st.take_ticket();
  __syncthreads();
  int64_t older = s_ticket[0];
  int set = 0;  // s_wtot set of the older tile
  if (warp > 0 && older < tiles) {
    stage(older, 0);
    take_in(older, 0, set, 1);
  }
  __syncthreads();
  int64_t newer = older < tiles ? s_ticket[1] : tiles;
  if (warp > 0) stage(newer, 1);
  for (int b = 0; older < tiles; b ^= 1) {
    const int newer_set = set == 2 ? 0 : set + 1;
    if (warp == 0) {
      look_back(older, b);
    } else if (newer < tiles) {
      take_in(newer, b ^ 1, newer_set, b);
    } else if (d == 0) {
      s_ticket[b] = tiles;
    }
    __syncthreads();
    const int64_t next = s_ticket[b];
    if (warp > 0) {
      scan_out(older, b, set);
      stage(next, b);  // each thread overwrites only the slots it has just read
    }
    older = newer;
    newer = next;
    set = newer_set;
  }
}

// ---------------------------------------------------------------- strided (inner > 1)
// A block is BX threads along inner (coalesced), each taking VI adjacent columns (one
// 16-byte vector when VI > 1: inner contiguous and aligned), by BY runs of ITEMS
// consecutive positions along the scanned dim; it walks the dim in tiles of BY * ITEMS,
// carrying each column's value.
template <typename T, typename Op, int BX, int BY, int ITEMS, int VI>
__global__ void __launch_bounds__(BX * BY, 2) scan_strided_kernel(ScanArgs<T> a) {
  using A = scan_acc_t<T>;
  using VT = Vec<T, VI>;
  constexpr int64_t TILE = int64_t(BY) * ITEMS;
  constexpr int COLS = BX * VI;
  __shared__ A totals[2][BY][COLS];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles_inner = (a.inner + COLS - 1) / COLS;
  const int64_t ncols = a.outer * tiles_inner;
  int parity = 0;
  for (int64_t col = blockIdx.x; col < ncols; col += gridDim.x) {
    const int64_t o = col / tiles_inner;
    const int64_t i = (col % tiles_inner) * COLS + tx * VI;
    const bool active = i < a.inner;  // the whole vector: inner is a multiple of VI
    const T* xc = a.x + o * a.x_so + (active ? i : 0) * a.x_si;
    T* yc = a.y + o * a.y_so + (active ? i : 0) * a.y_si;
    A carry[VI];
#pragma unroll
    for (int v = 0; v < VI; ++v) carry[v] = Op::template identity<A>();
    for (int64_t l0 = 0; l0 < a.length; l0 += TILE, parity ^= 1) {
      VT vals[ITEMS];
      A t[VI];
#pragma unroll
      for (int v = 0; v < VI; ++v) t[v] = Op::template identity<A>();
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + ty * ITEMS + k;
        if (active && l < a.length)
          vals[k] = load_vec<T, VI>(xc + (a.reverse ? a.length - 1 - l : l) * a.x_sl);
      }
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + ty * ITEMS + k;
        if (active && l < a.length) {
#pragma unroll
          for (int v = 0; v < VI; ++v) t[v] = Op::apply(t[v], to_scan<T>(vals[k].v[v]));
        }
      }
#pragma unroll
      for (int v = 0; v < VI; ++v) totals[parity][ty][tx * VI + v] = t[v];
      __syncthreads();
      A run[VI];
#pragma unroll
      for (int v = 0; v < VI; ++v) {
        A before = Op::template identity<A>();
#pragma unroll
        for (int j = 0; j < BY; ++j)
          if (j < ty) before = Op::apply(before, totals[parity][j][tx * VI + v]);
        run[v] = Op::apply(carry[v], before);
      }
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t l = l0 + ty * ITEMS + k;
        if (active && l < a.length) {
          VT out;
#pragma unroll
          for (int v = 0; v < VI; ++v) {
            const A x = to_scan<T>(vals[k].v[v]);
            if (a.exclusive) out.v[v] = from_scan<T>(run[v]);
            run[v] = Op::apply(run[v], x);
            if (!a.exclusive) out.v[v] = from_scan<T>(run[v]);
          }
          store_vec<T, VI>(yc + (a.reverse ? a.length - 1 - l : l) * a.y_sl, out);
        }
      }
      // The tile's totals are read again rather than held (registers): the next tile writes
      // the other buffer.
#pragma unroll
      for (int v = 0; v < VI; ++v)
#pragma unroll
        for (int j = 0; j < BY; ++j) carry[v] = Op::apply(carry[v], totals[parity][j][tx * VI + v]);
    }
  }
}

// ---------------------------------------------------------------- launchers
constexpr int kScanBlock = NORMSCAN_SCAN_BLOCK;
constexpr int kScanVecs = NORMSCAN_SCAN_VECS;
constexpr int kLookbackBlock = NORMSCAN_LOOKBACK_BLOCK;
constexpr int kLookbackVecs = NORMSCAN_LOOKBACK_VECS;
// Body vectors of a look-back tile: warp 0 looks back and holds none.
constexpr int64_t kLookbackTileVecs = int64_t(kLookbackBlock - 32) * kLookbackVecs;

template <typename T, typename Op, int V, int BLOCK>
inline cudaError_t launch_scan_rows(const ScanArgs<T>& a, cudaStream_t stream) {
  return launch_units<scan_rows_kernel<T, Op, V, BLOCK, kScanVecs>>(Grid::PerUnit, dim3(BLOCK), 1, a.outer, 0, stream,
                                                                     a);
}

template <typename T, typename Op, int ITEMS, int VI>
inline cudaError_t launch_scan_strided(const ScanArgs<T>& a, cudaStream_t stream) {
  const int64_t cols = a.outer * ceil_div(a.inner, 32 * VI);
  return launch_units<scan_strided_kernel<T, Op, 32, 8, ITEMS, VI>>(Grid::PerUnit, dim3(32, 8), 1, cols, 0, stream, a);
}

// Tiles of the look-back kernel for these rows, or 0 when one block per row is the better
// plan: enough rows to fill the device, rows of one chunk, or under 2**22 elements, where a
// workspace and its memset are not worth it.
template <typename T>
inline int64_t scan_lookback_tiles_per_row(const ScanArgs<T>& a, int sms) {
  constexpr int64_t chunk = int64_t(kScanBlock) * kScanVecs * vec16<T>();
  if (a.inner != 1 || a.x_sl != 1 || a.y_sl != 1 || !rows_share_alignment(a.x, a.y, a.x_so, a.y_so, a.outer)) return 0;
  if (a.outer >= int64_t(4) * sms || a.length <= chunk || a.outer * a.length < (int64_t(1) << 22)) return 0;
  const int64_t nvec = a.length / vec16<T>();  // whole vectors in the best-aligned row
  return ceil_div(nvec > 0 ? nvec : 1, kLookbackTileVecs);
}

// Bytes of look-back workspace for these arguments (0: none needed).
template <typename T>
inline cudaError_t scan_workspace_bytes(const ScanArgs<T>& a, int64_t* bytes) {
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  const int64_t tiles = a.outer * scan_lookback_tiles_per_row(a, d.sms);
  *bytes = tiles == 0 ? 0 : LookbackState<scan_acc_t<T>>::bytes(tiles);
  return cudaSuccess;
}

// `workspace` holds scan_workspace_bytes(a) bytes of device memory (may be null if 0).
template <typename T, typename Op>
inline cudaError_t launch_scan(const ScanArgs<T>& a, void* workspace, cudaStream_t stream) {
  using A = scan_acc_t<T>;
  constexpr int V = vec16<T>();
  if (a.outer == 0 || a.length == 0 || a.inner == 0) return cudaSuccess;
  DeviceInfo d;
  cudaError_t err = device_info(&d);
  if (err != cudaSuccess) return err;
  if (a.inner == 1 && a.x_sl == 1 && a.y_sl == 1) {
    const int64_t tiles_per_row = scan_lookback_tiles_per_row(a, d.sms);
    if (tiles_per_row > 0) {
      const int64_t tiles = a.outer * tiles_per_row;
      if (tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
      const LookbackState<A> st = LookbackState<A>::in(workspace, tiles);
      err = cudaMemsetAsync(workspace, 0xff, LookbackState<A>::bytes(tiles), stream);
      if (err != cudaSuccess) return err;
      constexpr size_t smem = size_t(2) * kLookbackTileVecs * 16;  // two tiles
      return launch_units<scan_lookback_kernel<T, Op, V, kLookbackBlock, kLookbackVecs, NORMSCAN_LOOKBACK_MINB>>(
          Grid::Persistent, dim3(kLookbackBlock), 1, tiles, smem, stream, a, st, tiles_per_row);
    }
    if (rows_share_alignment(a.x, a.y, a.x_so, a.y_so, a.outer)) {
      // The smallest block whose chunk holds the row: a chunk half empty halves the bytes
      // in flight.
      const int64_t nvec = a.length / V;
      if (nvec <= 128 * kScanVecs) return launch_scan_rows<T, Op, V, 128>(a, stream);
      if (nvec <= 256 * kScanVecs) return launch_scan_rows<T, Op, V, 256>(a, stream);
      return launch_scan_rows<T, Op, V, kScanBlock>(a, stream);
    }
    return launch_scan_rows<T, Op, 1, kScanBlock>(a, stream);
  }
  if (inner_vectorizable(a, V)) return launch_scan_strided<T, Op, NORMSCAN_SCAN_STRIDED_VEC_ITEMS, V>(a, stream);
  return launch_scan_strided<T, Op, NORMSCAN_SCAN_STRIDED_ITEMS, 1>(a, stream);
}

}  // namespace normscan

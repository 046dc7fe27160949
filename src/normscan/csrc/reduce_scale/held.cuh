// Rows held on chip across the GPU: y = apply(x, scale(sum over the row)) [* w] [+ b] for
// aligned rows longer than a cluster holds but shorter than the GPU's shared memory
// (KernelBench 35's groups of 8 MB, 40's rows of 16 MB). Each row is split into `parts`
// parts; a part is copied into one of a block's two shared-memory buffers while it is
// summed, its statistic published, and once every part of its row has published, the part
// is scaled from the buffer: x is read from DRAM once. Parts are taken in ticket order, a
// ticket only into a free buffer, and a part's statistic is published without waiting: a
// waiting part needs parts with later tickets, so the launch is cooperative (every block
// resident at once) and a row has no more parts than the blocks' buffers, so every part a
// waiting block needs is published or will be. Two kernels walk the parts:
//   - serial: the whole block sums a part into one buffer, then waits for the part before
//     it (in the other buffer) and scales it;
//   - split: the block's warps are two groups that run apart, one summing parts into free
//     buffers, the other scaling full ones (handed over through mbarriers; each group's
//     reductions meet at a named barrier of its own), so that a part lands while another
//     is scaled. It pays where rows complete while the block works on others (a row of
//     fewer parts than blocks); a row of more parts than blocks is complete only once
//     nearly all buffers hold it, and its parts' latency, which the half-block groups
//     lengthen, is what counts (docs/design-notes.md, "Rows held across the GPU").
// Every part's statistics are merged in part order: every block, and every run, gets the
// same bits.
#pragma once

#include "../device/async.cuh"
#include "reread.cuh"

namespace normscan {

struct HeldPlan {
  int64_t parts;  // a row's: at most twice the resident blocks
  int64_t span;   // vectors a part (at most a part's threads x vectors)
  int64_t units;  // rows * parts
};

// The launch's shared state: a ticket counter, each row's count of published parts, and the
// parts' statistics. The counters start at zero (one memset of counter_bytes). The channels
// kernel (channels.cuh) keeps a statistic's blocks' parts in it likewise.
template <typename Stat> struct HeldState {
  unsigned long long* ticket;
  unsigned* published;
  Stat* part_stats;

  static constexpr int64_t kHeader = 16;
  static int64_t counter_bytes(int64_t rows) { return kHeader + ceil_div(rows * 4, 16) * 16; }
  static int64_t bytes(int64_t rows, int64_t parts) {
    return counter_bytes(rows) + rows * parts * static_cast<int64_t>(sizeof(Stat));
  }
  static HeldState in(void* workspace, int64_t rows) {
    auto* base = static_cast<char*>(workspace);
    HeldState st;
    st.ticket = reinterpret_cast<unsigned long long*>(base);
    st.published = reinterpret_cast<unsigned*>(base + kHeader);
    st.part_stats = reinterpret_cast<Stat*>(base + counter_bytes(rows));
    return st;
  }
};

// A part's work, by THREADS threads of VECS vectors each (a block, or a group of its warps,
// which meet at Barrier). Vector k of thread t of a part sits at buffer[k * THREADS + t].
template <typename T, typename Op, int THREADS, int VECS, typename Barrier> struct HeldParts {
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  static constexpr int V = vec16<T>();
  // Vectors a batch of the accumulator: 16 fp32 values, 8 doubles, one 16-bit vector (two
  // spilled fp16 group_norm's kernel on sm_90).
  static constexpr int U = V == 8 ? 1 : 4;
  using VT = Vec<T, V>;

  const ArgsFor<T, Op>& a;
  const HeldPlan& p;
  const HeldState<Stat>& st;
  uint4* held;
  unsigned t;  // this thread's place among the THREADS
  WarpPlace me;
  int first_warp;  // of the THREADS, in the block
  Barrier bar;

  // Part j of the rows: its row, and this thread's vectors of it, first, first + THREADS,
  // ..., `count` vectors from first on. In-row offsets fit 32 bits: the row is held on chip.
  struct Place {
    int64_t row, part;
    int first, count;
  };
  __device__ __forceinline__ Place place_of(int64_t j, const RereadRow<T, V>& r) const {
    Place q;
    q.row = j / p.parts;
    q.part = j % p.parts;
    const int start = static_cast<int>(min64(q.part * p.span, r.s.nvec));
    q.first = start + static_cast<int>(t);
    q.count = static_cast<int>(min64(start + p.span, r.s.nvec)) - q.first;
    return q;
  }
  __device__ __forceinline__ VT* slot(int b, int k) const {
    return reinterpret_cast<VT*>(&held[(b * VECS + k) * THREADS + t]);
  }

  // The next part's ticket: thread 0 takes it into `slot`, every thread reads it after the
  // barrier.
  __device__ __forceinline__ int64_t take(int64_t* slot) const {
    if (t == 0) *slot = static_cast<int64_t>(atomicAdd(st.ticket, 1ull));
    bar.sync();
    return *slot;
  }

  // Copies part j into buffer b while summing it, and publishes its statistic: nothing
  // waits. `scratch` (an entry a warp of the block) is free until the reduction's barrier.
  __device__ __forceinline__ void sum(int64_t j, int b, Stat* scratch) const {
    const RereadRow<T, V> r(a, j / p.parts, Op{});
    const Place q = place_of(j, r);
    const T* xp = r.xr + r.s.head + int64_t(q.first) * V;
    // Two groups of copies, the first batch and the rest: the first is summed while the
    // rest land (a thread reads only the slots it filled).
#pragma unroll
    for (int k = 0; k < VECS; ++k) {
      if (k * THREADS < q.count) cp_async16(slot(b, k), xp + k * THREADS * V);
      if (k == U - 1 || k == VECS - 1) cp_async_commit();
    }
    auto acc = r.template accumulator<Op>();
    if (q.part == 0 && r.has_edge(t)) r.add_edge(acc, t);
    cp_async_wait_groups<(VECS > U ? 1 : 0)>();
#pragma unroll 1
    for (int k0 = 0; k0 < VECS; k0 += U) {
      A vals[U * V];
      int n = 0;  // the present vectors are the first ones
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (k0 + u < VECS && (k0 + u) * THREADS < q.count) {
          const VT v = *slot(b, k0 + u);
#pragma unroll
          for (int i = 0; i < V; ++i) vals[u * V + i] = Convert<T>::to_acc(v.v[i]);
          n += V;
        }
      if (n > 0) acc.add(vals, n);
      if (k0 == 0) cp_async_wait_groups<0>();
    }
    const Stat stat = block_group_reduce<RowStatOp<Op>, THREADS / 32>(acc.stat(), scratch, first_warp, me, bar);
    if (t == 0) {
      st.part_stats[j] = stat;
      add_release(st.published + q.row, 1u);
    }
  }

  // Waits until every part of part j's row has published, merges their statistics, and
  // scales part j from buffer b into y.
  __device__ __forceinline__ void scale(int64_t j, int b, Stat* scratch) const {
    const RereadRow<T, V> r(a, j / p.parts, Op{});
    const Place q = place_of(j, r);
    if (t == 0) {
      while (load_acquire(st.published + q.row) < p.parts) __nanosleep(64);
    }
    bar.sync();
    Stat stat = RowStatOp<Op>::template identity<Stat>();
    for (int64_t i = t; i < p.parts; i += THREADS)
      stat = RowStatOp<Op>::apply(stat, load_from_l2(st.part_stats + q.row * p.parts + i));
    stat = block_group_reduce<RowStatOp<Op>, THREADS / 32>(stat, scratch, first_warp, me, bar);
    const RowScale<A> rs = row_scale<Op, A>(stat, a.view.length, a.eps, r.template pilot<Op>());
    if constexpr (kWritesStats<Op>) {
      // m2 read only where written: read for layer_norm too (unused), its 16-bit scaling
      // spilled 40 bytes (sm_90).
      if (q.part == 0 && t == 0) write_stat(a, q.row, rs, Op::kGrouped ? stat.m2 : A(0));
    }
    const auto ch = r.template channels<Op, false>(a, q.row);
    T* yp = r.yr + r.s.head + int64_t(q.first) * V;
    const int l = static_cast<int>(r.s.head) + q.first * V;
    if constexpr (Op::kGrouped || !Op::kWeighted) {
#pragma unroll 1  // stores need no loads in flight; unrolled, the scaling's registers spilled
      for (int k = 0; k < VECS; ++k)
        if (k * THREADS < q.count)
          store_vec_whole<T, V>(yp + k * THREADS * V, r.template scaled<Op>(*slot(b, k), l + k * THREADS * V, rs, a, ch));
    } else {
      // The weight's and bias's vectors of a batch loaded before its stores (which might alias
      // them): a round trip to L2 a batch. Two fp32 vectors a batch: layer_norm + w + b (4096,
      // 131072) 1.626 -> 1.558 ms (one 16-byte vector a batch: 1.665; an element at a time as
      // before: 1.626), KernelBench 40 level (0.222 -> 0.221); a batch of three spilled. One
      // 16-bit vector (two spilled): bf16 level (0.80 ms).
      constexpr int BATCH = sizeof(T) == 2 ? 1 : 2;
      const bool weighted = a.w != nullptr, biased = Op::kBiased && a.b != nullptr;
#pragma unroll 1
      for (int k0 = 0; k0 < VECS; k0 += BATCH) {
        Vec<param_t<T, Op>, V> wv[BATCH] = {}, bv[BATCH] = {};
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          const int k = k0 + u;
          if (k < VECS && k * THREADS < q.count) {
            if (weighted) wv[u] = param_vec<param_t<T, Op>, V>(a.w, l + k * THREADS * V);
            if (biased) bv[u] = param_vec<param_t<T, Op>, V>(a.b, l + k * THREADS * V);
          }
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
          const int k = k0 + u;
          if (k < VECS && k * THREADS < q.count)
            store_vec_whole<T, V>(yp + k * THREADS * V, scale_by<Op>(*slot(b, k), rs.scale, rs.shift, weighted,
                                                                     wv[u], biased, bv[u]));
        }
      }
    }
    if (q.part == 0 && r.has_edge(t)) r.template scale_edge<Op>(rs, a, q.row, t);
  }
};

// Resident blocks a SM: doubles spilled at twice.
template <typename T, int BLOCK> constexpr int held_min_blocks() { return (sizeof(T) == 8 ? 512 : 1024) / BLOCK; }

// The serial kernel: parts of BLOCK * HELD vectors. Each part is summed (into one buffer)
// before the part before it is scaled (from the other): the wait for a row's last parts
// overlaps the next part's loads.
template <typename T, typename Op, int BLOCK, int HELD>
__global__ void __launch_bounds__(BLOCK, held_min_blocks<T, BLOCK>())
    reduce_scale_held_kernel(ArgsFor<T, Op> a, HeldPlan p, HeldState<RowStat<Op, acc_t<T>>> st) {
  using Parts = HeldParts<T, Op, BLOCK, HELD, BlockBarrier>;
  extern __shared__ uint4 held[];
  __shared__ typename Parts::Stat warp_stat[2][BLOCK / 32];  // alternated: one barrier a reduction
  __shared__ int64_t ticket[2];
  const Parts parts{a, p, st, held, threadIdx.x, WarpPlace::of_thread(), 0, {}};
  int64_t j = parts.take(&ticket[0]);
  if (j >= p.units) return;
  parts.sum(j, 0, warp_stat[0]);
  for (int b = 0, parity = 1;; b ^= 1, parity ^= 1) {
    const int64_t next = parts.take(&ticket[parity]);
    if (next < p.units) parts.sum(next, b ^ 1, warp_stat[parity]);
    parts.scale(j, b, warp_stat[parity]);
    if (next >= p.units) return;
    j = next;
  }
}

// The split kernel: a summing group of SUMMING threads and a scaling group of SCALING, on
// parts of PART vectors (a vector's place in its buffer is its place in the part, whichever
// group's thread holds it).
template <typename T, typename Op, int SUMMING, int SCALING, int PART>
__global__ void __launch_bounds__(SUMMING + SCALING, held_min_blocks<T, SUMMING + SCALING>())
    reduce_scale_held_split_kernel(ArgsFor<T, Op> a, HeldPlan p, HeldState<RowStat<Op, acc_t<T>>> st) {
  static_assert(PART % SUMMING == 0 && PART % SCALING == 0, "whole vectors a thread");
  using Stat = RowStat<Op, acc_t<T>>;
  extern __shared__ uint4 held[];
  // The summing group's warps, then the scaling group's: each group meets at another
  // barrier (its ticket's, its row wait's) between two reductions, so one scratch suffices.
  __shared__ Stat warp_stat[(SUMMING + SCALING) / 32];
  __shared__ int64_t ticket;      // the summing group's latest
  __shared__ int64_t part_in[2];  // the part each buffer holds (p.units and more: the end)
  __shared__ uint64_t full[2], freed[2];  // a buffer's handover: each group's threads arrive
  const WarpPlace me = WarpPlace::of_thread();
  if (threadIdx.x < 2) {
    mbarrier_init(&full[threadIdx.x], SUMMING);
    mbarrier_init(&freed[threadIdx.x], SCALING);
  }
  __syncthreads();
  if (me.warp < SUMMING / 32) {
    const HeldParts<T, Op, SUMMING, PART / SUMMING, GroupBarrier<1, SUMMING>> parts{a, p, st, held, threadIdx.x, me,
                                                                                    0, {}};
    for (int n = 0;; ++n) {  // the n-th part: buffer n % 2, its (n / 2)-th use
      const int b = n & 1;
      mbarrier_wait(&freed[b], (n >> 1) & 1);
      const int64_t j = parts.take(&ticket);
      if (j < p.units) parts.sum(j, b, warp_stat);
      if (parts.t == 0) part_in[b] = j;
      mbarrier_arrive(&full[b]);
      if (j >= p.units) return;
    }
  } else {
    const HeldParts<T, Op, SCALING, PART / SCALING, GroupBarrier<2, SCALING>> parts{
        a, p, st, held, threadIdx.x - SUMMING, me, SUMMING / 32, {}};
    mbarrier_arrive(&freed[0]);  // both buffers start free
    mbarrier_arrive(&freed[1]);
    for (int n = 0;; ++n) {
      const int b = n & 1;
      mbarrier_wait(&full[b], (n >> 1) & 1);
      const int64_t j = part_in[b];
      if (j >= p.units) return;
      parts.scale(j, b, warp_stat);
      mbarrier_arrive(&freed[b]);
    }
  }
}

}  // namespace normscan

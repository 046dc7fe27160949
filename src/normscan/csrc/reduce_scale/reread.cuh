// Rows read twice: y = apply(x, scale(sum over the row)) [* w] [+ b] for rows too long to hold on
// chip, or whose x and y rows are aligned differently (then V == 1), in V-element vectors: a
// pass that sums, then a pass that scales. The scaling pass walks backwards, so it starts
// with the lines the summing pass read last: those most likely still in L2.
// - reduce_scale_reread_kernel: one block a row, for rows enough to fill the GPU.
// - reduce_scale_split_sum_kernel, then reduce_scale_split_scale_kernel: each row read by
//   several blocks, for rows too few to fill the GPU (KernelBench 37's one row of 1.9e9
//   floats). The first kernel's part p of a row's `parts` sums its tiles (one loop trip of
//   the block each) p, p + parts, p + 2 parts, ..., so that the blocks at work read
//   neighbouring tiles, and writes its statistic. The second scales spans of contiguous
//   vectors, one block each, the last first (the last read, in L2), each combining its
//   row's statistics in the same order (the same bits); where rows share a statistic
//   (batch_norm's), reduce_scale_merge_stats_kernel merges each one's parts in between.
//   Part and span 0 also take the row's unaligned edges.
// - reduce_scale_group_reread_kernel: one block, or a cluster of blocks (sm_90), a statistic
//   shared by rows (batch_norm's channel: its rows, one a sample), held in its blocks' shared
//   memory where they hold it, else where what the resident blocks read stays in L2 from one
//   pass to the next.
// A max-shifted op keeps a running maximum with its sum, rescaling the sum when the maximum
// grows (once per kRereadUnroll vectors), so it too reads x twice; a centered op merges each
// such batch's mean and squared deviations into its running ones (MeanM2).
#pragma once

#include <type_traits>

#include "../device/cluster.cuh"
#include "../device/memory.cuh"
#include "../device/reduce.cuh"
#include "ops.cuh"
#include "policy.cuh"

namespace normscan {

constexpr int kRereadUnroll = 4;  // vectors in flight per thread

// A row's statistic, as threads hold and combine it: the sum of map(x), for max-shifted
// ops the maximum with the sum of map(x - maximum), for centered ops the count, mean and
// sum of squared deviations (map(x - mean): x * x).
template <typename Op, typename A>
using RowStat = std::conditional_t<Op::kMaxShifted, MaxSum<A>, std::conditional_t<Op::kCentered, MeanM2<A>, A>>;
template <typename Op>
using RowStatOp = std::conditional_t<Op::kMaxShifted, MaxSumOp, std::conditional_t<Op::kCentered, MeanM2Op, SumOp>>;

// One thread's running statistic of values of a row.
template <typename Op, typename A> struct RowAccumulator {
  A sum = A(0);
  // Max-shifted: this thread's running maximum, sum being of map(x - shift). While it is
  // -inf every value seen was -inf and adds nothing (their NaN, if the row's maximum is -inf
  // too, comes from apply).
  A shift = MaxOp::identity<A>();
  MeanM2<A> moments{0, 0, 0};  // centered ops: of x - pilot, the row's first element (RereadRow::pilot)
  A pilot = A(0);

  // Adds the first n (> 0) of vals.
  template <int N> __device__ __forceinline__ void add(const A (&vals)[N], int n) {
    if constexpr (Op::kCentered) {
      A s = A(0), q = A(0);
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (i < n) s += vals[i] - pilot;
      const A mean = ratio(s, A(n));
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (i < n) q += Op::map(vals[i] - pilot - mean);
      moments = MeanM2Op::apply(moments, MeanM2<A>{A(n), mean, q});
      return;
    }
    if constexpr (Op::kMaxShifted) {
      A m = shift;
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (i < n) m = MaxOp::apply(m, vals[i]);
      if (!(m <= shift)) {
        sum *= Op::map(shift - m);
        shift = m;
      }
      if (shift == MaxOp::identity<A>()) return;
    }
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (i < n) sum += Op::map(shifted<Op>(vals[i], shift));
  }
  __device__ __forceinline__ RowStat<Op, A> stat() const {
    if constexpr (Op::kMaxShifted) return RowStat<Op, A>{shift, sum};
    else if constexpr (Op::kCentered) return moments;
    else return sum;
  }
};

// A row's factor and shift (0 unless max-shifted or centered) from its statistic.
template <typename Op, typename A>
__device__ __forceinline__ RowScale<A> row_scale(RowStat<Op, A> stat, int64_t n, double eps, A pilot) {
  if constexpr (Op::kMaxShifted) return RowScale<A>{Op::scale(stat.sum, n, eps), stat.max};
  else if constexpr (Op::kCentered) return RowScale<A>{Op::scale(stat.m2, n, eps), pilot + stat.mean};
  else return RowScale<A>{Op::scale(stat, n, eps), A(0)};
}

// Rows whose statistics merge (a grouped op's stat_groups; every row its own otherwise):
// row r's statistic is that of rows r % groups, r % groups + groups, ...
template <typename Op, typename T> __device__ __forceinline__ int64_t stat_groups(const ArgsFor<T, Op>& a) {
  if constexpr (Op::kGrouped) return a.grouping.stat_groups;
  else return a.view.outer;
}

// A row as these kernels walk it: whole V-element vectors from xb / yb, and fewer than
// 2 * V unaligned edge elements (head, then tail), edge e being thread e's (of the block, or
// of the group of warps that walks the row).
template <typename T, int V> struct RereadRow {
  const T* xr;
  T* yr;
  const T* pilot_x;  // the first element of the first row of this row's statistic
  RowSplit s;
  template <typename Op>
  __device__ __forceinline__ RereadRow(const ArgsFor<T, Op>& a, int64_t row, Op)
      : xr(a.x + row * a.view.x_so),
        yr(a.y + row * a.view.y_so),
        pilot_x(Op::kGrouped ? a.x + row % stat_groups<Op, T>(a) * a.view.x_so : xr),
        s(split_row<T, V>(xr, a.view.length)) {}
  // A centered op's statistics are of x less the row's first element (of its statistic's
  // first row, where rows share one): its mean then loses no digits to the mean's own size
  // (as the rows kernel's), and partial statistics of several rows merge.
  template <typename Op> __device__ __forceinline__ acc_t<T> pilot() const {
    return Op::kCentered ? Convert<T>::to_acc(pilot_x[0]) : acc_t<T>(0);
  }
  template <typename Op> __device__ __forceinline__ RowAccumulator<Op, acc_t<T>> accumulator() const {
    RowAccumulator<Op, acc_t<T>> acc;
    acc.pilot = pilot<Op>();
    return acc;
  }
  __device__ __forceinline__ bool has_edge(unsigned t) const { return t < s.head + s.tail; }
  __device__ __forceinline__ int64_t edge_at(unsigned t) const { return t < s.head ? t : s.nvec * V + t; }

  // Adds edge t's element to acc (has_edge(t) only).
  template <typename Op>
  __device__ __forceinline__ void add_edge(RowAccumulator<Op, acc_t<T>>& acc, unsigned t) const {
    const acc_t<T> e[1] = {Convert<T>::to_acc(xr[edge_at(t)])};
    acc.add(e, 1);
  }
  template <typename Op>
  __device__ __forceinline__ void scale_edge(RowScale<acc_t<T>> rs, const ArgsFor<T, Op>& a, int64_t row,
                                             unsigned t) const {
    if constexpr (Op::kGrouped)
      yr[edge_at(t)] = channels<Op>(a, row).template scale<Op>(xr[edge_at(t)], rs.scale, rs.shift, edge_at(t));
    else yr[edge_at(t)] = scale_one<Op>(xr[edge_at(t)], rs.scale, rs.shift, a.w, a.b, edge_at(t));
  }

  // Adds vectors [begin, end) to acc, BLOCK threads a stride.
  template <int BLOCK, typename Op, int U = kRereadUnroll>
  __device__ __forceinline__ void add_vectors(int64_t begin, int64_t end, RowAccumulator<Op, acc_t<T>>& acc) const {
    const T* xb = xr + s.head;
    for (int64_t j = begin + threadIdx.x; j < end; j += int64_t(BLOCK) * U) {
      Vec<T, V> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (j + u * BLOCK < end) v[u] = load_vec<T, V>(xb + (j + u * BLOCK) * V);
      acc_t<T> vals[U * V];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < V; ++i) vals[u * V + i] = Convert<T>::to_acc(v[u].v[i]);
      // The present vectors are the first ones.
      acc.add(vals, static_cast<int>(min64(U, (end - j + BLOCK - 1) / BLOCK)) * V);
    }
  }

  // Scales vectors [begin, end) of row `row` into y, walking backwards.
  template <int BLOCK, typename Op>
  __device__ __forceinline__ void scale_vectors(int64_t begin, int64_t end, RowScale<acc_t<T>> rs,
                                                const ArgsFor<T, Op>& a, int64_t row) const {
    // A grouped op's channel looked up in 32 bits where the row allows: a 64-bit division a
    // vector held KernelBench 33's scaling kernel at 84% of copy.
    if constexpr (Op::kGrouped) {
      if (a.view.length <= INT32_MAX) return scale_vectors_of<BLOCK, Op>(begin, end, rs, a, channels<Op, false>(a, row));
    }
    scale_vectors_of<BLOCK, Op>(begin, end, rs, a, channels<Op, true>(a, row));
  }
  // The same, a grouped op's weight and bias from ch.
  template <int BLOCK, typename Op, bool WIDE>
  __device__ __forceinline__ void scale_vectors_of(int64_t begin, int64_t end, RowScale<acc_t<T>> rs,
                                                   const ArgsFor<T, Op>& a,
                                                   const ChannelRow<T, WIDE, param_t<T, Op>>& ch) const {
    constexpr int U = kRereadUnroll;
    const T* xb = xr + s.head;
    T* yb = yr + s.head;
    for (int64_t j = end - 1 - threadIdx.x; j >= begin; j -= int64_t(BLOCK) * U) {
      Vec<T, V> v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (j - u * BLOCK >= begin) v[u] = load_vec<T, V>(xb + (j - u * BLOCK) * V);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (j - u * BLOCK >= begin)
          store_vec<T, V>(yb + (j - u * BLOCK) * V, scaled<Op>(v[u], s.head + (j - u * BLOCK) * V, rs, a, ch));
    }
  }

  // y of the V elements from l (a grouped op's weight and bias from ch).
  template <typename Op, bool WIDE>
  __device__ __forceinline__ Vec<T, V> scaled(const Vec<T, V>& x, int64_t l, RowScale<acc_t<T>> rs,
                                              const ArgsFor<T, Op>& a,
                                              const ChannelRow<T, WIDE, param_t<T, Op>>& ch) const {
    Vec<T, V> out;
    if constexpr (Op::kGrouped) {
      out = ch.template scale<Op>(x, rs.scale, rs.shift, l);
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = scale_one<Op>(x.v[i], rs.scale, rs.shift, a.w, a.b, l + i);
    }
    return out;
  }
  // A grouped op's weight and bias along the row; WIDE: rows of 2**31 elements and more.
  template <typename Op, bool WIDE = true>
  __device__ __forceinline__ ChannelRow<T, WIDE, param_t<T, Op>> channels(const ArgsFor<T, Op>& a, int64_t row) const {
    using Channels = ChannelRow<T, WIDE, param_t<T, Op>>;
    if constexpr (Op::kGrouped) return Channels::at(a, row);
    else return Channels{};
  }
};

// Max-shifted ops hold a maximum and rescale: up to 128 registers (at 64 they spill); so do
// centered ops (16-bit layer_norm's summing kernel spilled 4 bytes) and doubles (the split
// scaling kernel of rms_norm and l1_normalize spilled 24 bytes on sm_80).
template <typename T, typename Op> constexpr int reread_min_blocks() {
  return kShifted<Op> || sizeof(T) == 8 ? 1 : 2;
}

template <typename T, typename Op, int BLOCK, int V>
__global__ void __launch_bounds__(BLOCK, reread_min_blocks<T, Op>()) reduce_scale_reread_kernel(ArgsFor<T, Op> a) {
  using A = acc_t<T>;
  __shared__ RowStat<Op, A> warp_stat[2][BLOCK / 32];
  const WarpPlace me = WarpPlace::of_thread();
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.view.outer; row += gridDim.x, parity ^= 1) {
    const RereadRow<T, V> r(a, row, Op{});
    auto acc = r.template accumulator<Op>();
    if (r.has_edge(threadIdx.x)) r.add_edge(acc, threadIdx.x);
    r.template add_vectors<BLOCK>(0, r.s.nvec, acc);
    const auto stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(acc.stat(), warp_stat[parity], 0, me);
    const RowScale<A> rs = row_scale<Op, A>(stat, a.view.length, a.eps, acc.pilot);
    if constexpr (kWritesStats<Op>) {
      if (threadIdx.x == 0) write_stat(a, row, rs, stat.m2);
    }
    if (r.has_edge(threadIdx.x)) r.template scale_edge<Op>(rs, a, row, threadIdx.x);
    r.template scale_vectors<BLOCK, Op>(0, r.s.nvec, rs, a, row);
  }
}

// A split of rows across blocks: `parts` blocks sum a row (unit u: part u % parts of row
// u / parts), `spans` blocks of `span` vectors each scale it (likewise).
struct RowSplitting {
  int64_t parts, spans, span;
};
template <int BLOCK> constexpr int64_t kRereadTile = int64_t(BLOCK) * kRereadUnroll;  // vectors
// The split summing kernel's vectors in flight per thread, and so its tiles: its pass only
// reads, and twice the loads a trip reach the read rate (docs/design-notes.md, "Channels and
// split rows").
template <int BLOCK> constexpr int64_t kSplitSumTile = int64_t(BLOCK) * RowsPolicy::kSplitSumUnroll;

template <typename T, typename Op, int BLOCK, int V>
__global__ void __launch_bounds__(BLOCK, reread_min_blocks<T, Op>())
    reduce_scale_split_sum_kernel(ArgsFor<T, Op> a, RowSplitting c, RowStat<Op, acc_t<T>>* stats) {
  using A = acc_t<T>;
  constexpr int64_t TILE = kSplitSumTile<BLOCK>;
  __shared__ RowStat<Op, A> warp_stat[2][BLOCK / 32];
  const WarpPlace me = WarpPlace::of_thread();
  int parity = 0;
  for (int64_t u = blockIdx.x; u < a.view.outer * c.parts; u += gridDim.x, parity ^= 1) {
    const int64_t part = u % c.parts;
    const RereadRow<T, V> r(a, u / c.parts, Op{});
    auto acc = r.template accumulator<Op>();
    if (part == 0 && r.has_edge(threadIdx.x)) r.add_edge(acc, threadIdx.x);
    for (int64_t t = part; t * TILE < r.s.nvec; t += c.parts)
      r.template add_vectors<BLOCK, Op, RowsPolicy::kSplitSumUnroll>(t * TILE, min64((t + 1) * TILE, r.s.nvec), acc);
    const auto stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(acc.stat(), warp_stat[parity], 0, me);
    if (threadIdx.x == 0) stats[u] = stat;
  }
}

// A grouped op's statistics, from the parts of the rows that share each (batch_norm's: a
// channel's rows, one a sample): merged once, in one order, into merged[statistic] (and
// written out, where asked), for the scaling kernel. Merging a channel's 64 parts in each
// of its scaling blocks (131072 blocks of 32 KB) took KernelBench 33 to 5.65 ms against
// torch.compile's 4.23.
template <typename T, typename Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_scale_merge_stats_kernel(ArgsFor<T, Op> a, RowSplitting c,
                                                                         const RowStat<Op, acc_t<T>>* stats,
                                                                         RowStat<Op, acc_t<T>>* merged) {
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  __shared__ Stat warp_stat[2][BLOCK / 32];
  const WarpPlace me = WarpPlace::of_thread();
  const int64_t groups = a.grouping.stat_groups, count = a.view.outer / groups * c.parts;
  int parity = 0;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x, parity ^= 1) {
    Stat stat = RowStatOp<Op>::template identity<Stat>();
    for (int64_t k = threadIdx.x; k < count; k += BLOCK)
      stat = RowStatOp<Op>::apply(stat, stats[(g + k / c.parts * groups) * c.parts + k % c.parts]);
    stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(stat, warp_stat[parity], 0, me);
    if (threadIdx.x == 0) {
      merged[g] = stat;
      write_pair(a.grouping.stats, g, Convert<T>::to_acc(a.x[g * a.view.x_so]) + stat.mean, stat.m2);  // row g's pilot
    }
  }
}

// reread_min_blocks's bound (set for blocks of 512) for blocks of BLOCK threads: as many
// registers a thread.
template <typename T, typename Op, int BLOCK> constexpr int reread_min_blocks_of() {
  return reread_min_blocks<T, Op>() * 512 / BLOCK;
}

// Blocks a SM whose HELD vectors a thread of shared memory fit beside each other (a block's
// 1 KB reserve with each; 228 KB a SM on sm_90, 164 KB on sm_80: the bound asks only the
// registers that the larger allows).
template <int BLOCK, int HELD> constexpr int group_held_min_blocks() {
  constexpr int fit = (228 * 1024) / (BLOCK * HELD * 16 + 1024);
  return fit > 0 ? fit : 1;
}

// Vector t + k * threads of a statistic's run of rows x nvec vectors (nvec > 0) as (row, o),
// stepped from k to k + 1 without a division: the held kernel's store loop, two 32-bit
// divisions a vector and its channel's a third, issued 68% of its instructions, its issue
// slots 64% busy, batch_norm fp32 (8, 1024, 64, 64) at 63% of copy on the H200 (ncu).
struct RunPlace {
  uint32_t nvec, row_step, o_step, row, o;
  __device__ __forceinline__ RunPlace(uint32_t t, uint32_t threads, uint32_t nvec_)
      : nvec(nvec_), row_step(threads / nvec_), o_step(threads - row_step * nvec_), row(t / nvec_),
        o(t - row * nvec_) {}
  __device__ __forceinline__ void step() {
    o += o_step;
    row += row_step;
    if (o >= nvec) {
      o -= nvec;
      ++row;
    }
  }
};

// A cluster of blocks (one block where there are no clusters) sums every row of its
// statistic, then scales them, the last vector first. The rows (sharing their alignment) are
// walked as one run of rows x nvec vectors, the cluster's threads a stride, so that a
// thread's loads of a trip are in flight together whatever the rows' length: the split
// kernels' block a row of 1024 vectors held two 16-byte loads a thread in flight, batch_norm
// fp32 (8, 1024, 64, 64) at 31% of copy on the H200 (torch.compile 0.081 ms, ours 0.300).
// The rows' unaligned edge elements are spread over the threads too (thread t edge t % E of
// rows t / E, t / E + threads / E, ...): one thread an edge walking every row held
// (256, 1024, 7, 7) at 8% of warps active. The statistic's elements fit 32 bits (the
// dispatch's choice): its vectors are found by 32-bit division.
// HELD > 0: each thread's vectors of a statistic (vector t + k * threads in slot k < HELD of
// its block's dynamic shared memory, so the dispatch sees that the most vectors a statistic
// has fit) are copied in by cp.async and summed and scaled from there: x read once, from
// DRAM, with every byte of a block's share in flight at once without registers. The slots
// are refilled with the next statistic's vectors as soon as this one's are stored (the thread
// reads only the slots it filled), so the next statistic's loads land during this one's stores.
// Vectors are found by RunPlace's steps, and a row of one channel takes its weight once.
template <typename T, typename Op, int BLOCK, int V, bool CLUSTERED, int HELD = 0>
__global__ void __launch_bounds__(BLOCK, (HELD > 0 ? group_held_min_blocks<BLOCK, HELD>()
                                                   : reread_min_blocks_of<T, Op, BLOCK>()))
    reduce_scale_group_reread_kernel(ArgsFor<T, Op> a) {
  static_assert(Op::kGrouped, "rows share statistics only in a grouped op");
  static_assert(HELD == 0 || V * sizeof(T) == 16, "held slots of 16-byte vectors");
  if constexpr (!built_here(CLUSTERED ? LaunchedOn::kSm90On : LaunchedOn::kEvery)) return;  // launched on clusters
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  // The summing pass's loads in flight a thread: fp32's as the split summing kernel's, the
  // others' as the scaling pass's (8 vectors a trip spilled 16-bit 16 bytes on sm_80, fp64 44
  // on sm_90).
  constexpr int SUM_U = sizeof(T) == 4 ? RowsPolicy::kSplitSumUnroll : kRereadUnroll, SCALE_U = kRereadUnroll;
  __shared__ Stat warp_stat[2][BLOCK / 32];
  __shared__ Stat cta_stat[2];  // this block's statistic, for the cluster's others to read
  const WarpPlace me = WarpPlace::of_thread();
  // A cluster's size known to be 1 where it is: a stride of the cluster's threads read at run
  // time held fp32 (8, 1024, 64, 64) and (32, 512, 32, 32) 3% slower.
  const int2 place = CLUSTERED ? cluster_place() : make_int2(1, 0);
  const int csize = place.x;
  const uint32_t threads = uint32_t(BLOCK) * csize, t = uint32_t(BLOCK) * place.y + threadIdx.x;
  const int64_t groups = a.grouping.stat_groups, clusters = gridDim.x / csize;
  const uint32_t rows = static_cast<uint32_t>(a.view.outer / groups);
  const int64_t x_step = groups * a.view.x_so, y_step = groups * a.view.y_so;  // row k to k + 1
  extern __shared__ uint4 held[];  // HELD > 0: slot k of this thread at held[k * BLOCK + threadIdx.x]
  const auto slot = [&](int k) { return reinterpret_cast<Vec<T, V>*>(&held[k * BLOCK + threadIdx.x]); };
  // Copies this thread's vectors of statistic g (those it has) into its slots.
  const auto copy_in = [&](int64_t g) {
    const RereadRow<T, V> r(a, g, Op{});
    if (r.s.nvec == 0) return;  // rows shorter than their edges (bf16 rows of 7)
    const T* xb = r.xr + r.s.head;
    RunPlace p(t, threads, static_cast<uint32_t>(r.s.nvec));
#pragma unroll 1  // cp.async keeps no registers: every copy is in flight unrolled or not
    for (int k = 0; k < HELD; ++k, p.step())
      if (p.row < rows) cp_async16(slot(k), xb + p.row * x_step + int64_t(p.o) * V);
  };
  if constexpr (HELD > 0) {
    if (blockIdx.x / csize < groups) copy_in(blockIdx.x / csize);
  }
  int parity = 0;
  for (int64_t g = blockIdx.x / csize; g < groups; g += clusters, parity ^= 1) {
    const RereadRow<T, V> first(a, g, Op{});
    const uint32_t nvec = static_cast<uint32_t>(first.s.nvec), total = rows * nvec;
    const uint32_t edges = first.s.head + first.s.tail, edge_rows = edges > 0 ? threads / edges : 0;
    const T* xb = first.xr + first.s.head;
    T* yb = first.yr + first.s.head;
    auto acc = first.template accumulator<Op>();
    if (t < edge_rows * edges)
      for (uint32_t k = t / edges; k < rows; k += edge_rows)
        RereadRow<T, V>(a, g + k * groups, Op{}).add_edge(acc, t % edges);
    if constexpr (HELD > 0) {
      // A batch of the accumulator: 16 fp32 values, or 16-bit ones; 4 fp64 ones (at 8 its
      // kernel spilled 4 bytes beside RunPlace's registers).
      constexpr int HU = V == 4 ? 4 : 2;
      static_assert(HELD % HU == 0, "whole batches of slots");
      cp_async_wait_all();
      // Every slot filled (most threads): batches of a known count, without a test a value.
      const auto sum_slots = [&](auto every) {
        constexpr bool every_slot = decltype(every)::value;
#pragma unroll
        for (int k0 = 0; k0 < HELD; k0 += HU) {
          A vals[HU * V];
          int n = 0;  // the present vectors are the first ones
#pragma unroll
          for (int u = 0; u < HU; ++u)
            if (every_slot || t + uint32_t(k0 + u) * threads < total) {
              const Vec<T, V> v = *slot(k0 + u);
#pragma unroll
              for (int e = 0; e < V; ++e) vals[u * V + e] = Convert<T>::to_acc(v.v[e]);
              n += V;
            }
          if constexpr (every_slot) acc.add(vals, HU * V);
          else if (n > 0) acc.add(vals, n);
        }
      };
      if (t + uint32_t(HELD - 1) * threads < total) sum_slots(std::true_type{});
      else sum_slots(std::false_type{});
    }
    for (uint32_t j = t; HELD == 0 && j < total; j += threads * SUM_U) {
      Vec<T, V> v[SUM_U];
#pragma unroll
      for (int u = 0; u < SUM_U; ++u) {
        const uint32_t i = j + u * threads, k = i / nvec;
        if (i < total) v[u] = load_vec<T, V>(xb + k * x_step + int64_t(i - k * nvec) * V);
      }
      A vals[SUM_U * V];
#pragma unroll
      for (int u = 0; u < SUM_U; ++u)
#pragma unroll
        for (int e = 0; e < V; ++e) vals[u * V + e] = Convert<T>::to_acc(v[u].v[e]);
      acc.add(vals, static_cast<int>(min64(SUM_U, (total - j + threads - 1) / threads)) * V);  // the present ones first
    }
    Stat stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(acc.stat(), warp_stat[parity], 0, me);
#ifdef NORMSCAN_CLUSTERS
    if constexpr (CLUSTERED) stat = cluster_reduce<RowStatOp<Op>>(stat, &cta_stat[parity], csize);
#endif
    const RowScale<A> rs = row_scale<Op, A>(stat, a.view.length * rows, a.eps, acc.pilot);
    if (t == 0) write_stat(a, g, rs, stat.m2);
    if (t < edge_rows * edges)
      for (uint32_t k = t / edges; k < rows; k += edge_rows)
        RereadRow<T, V>(a, g + k * groups, Op{}).template scale_edge<Op>(rs, a, g + k * groups, t % edges);
    const auto ch = first.template channels<Op, false>(a, g);  // every row's: one channel
    if constexpr (HELD > 0) {
      // Stores slot by slot, y of vector o of a row by scaled(x, o); then the slots are refilled.
      const auto store_held = [&](auto scaled) {
        if (nvec == 0) return;
        RunPlace p(t, threads, nvec);
#pragma unroll 1  // stores need no loads in flight
        for (int k = 0; k < HELD; ++k, p.step())
          if (p.row < rows) store_vec_whole<T, V>(yb + p.row * y_step + int64_t(p.o) * V, scaled(*slot(k), p.o));
      };
      if (ch.span >= a.view.length) {  // every row one channel (batch_norm's, instance_norm's)
        using P = param_t<T, Op>;
        const A wc = ch.w ? Convert<P>::to_acc(ch.w[0]) : A(1), bc = ch.b ? Convert<P>::to_acc(ch.b[0]) : A(0);
        store_held([&](const Vec<T, V>& v, uint32_t) { return scaled_in_channel<Op>(v, rs.scale, rs.shift, wc, bc); });
      } else {
        store_held([&](const Vec<T, V>& v, uint32_t o) {
          return first.template scaled<Op>(v, first.s.head + int64_t(o) * V, rs, a, ch);
        });
      }
      if (g + clusters < groups) copy_in(g + clusters);
    }
    for (int64_t j = int64_t(total) - 1 - t; HELD == 0 && j >= 0; j -= int64_t(threads) * SCALE_U) {
      Vec<T, V> v[SCALE_U];
      uint32_t k[SCALE_U], o[SCALE_U];
#pragma unroll
      for (int u = 0; u < SCALE_U; ++u) {
        const int64_t i = j - int64_t(u) * threads;
        k[u] = i >= 0 ? static_cast<uint32_t>(i) / nvec : 0;
        o[u] = static_cast<uint32_t>(i) - k[u] * nvec;
        if (i >= 0) v[u] = load_vec<T, V>(xb + k[u] * x_step + int64_t(o[u]) * V);
      }
#pragma unroll
      for (int u = 0; u < SCALE_U; ++u)
        if (j - int64_t(u) * threads >= 0)
          store_vec_whole<T, V>(yb + k[u] * y_step + int64_t(o[u]) * V,
                                first.template scaled<Op>(v[u], first.s.head + int64_t(o[u]) * V, rs, a, ch));
    }
  }
#ifdef NORMSCAN_CLUSTERS
  if constexpr (CLUSTERED) cg::this_cluster().sync();  // no block's cta_stat read after it has gone
#endif
}

template <typename T, typename Op, int BLOCK, int V>
__global__ void __launch_bounds__(BLOCK, reread_min_blocks<T, Op>())
    reduce_scale_split_scale_kernel(ArgsFor<T, Op> a, RowSplitting c, const RowStat<Op, acc_t<T>>* stats) {
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  __shared__ Stat warp_stat[2][BLOCK / 32];
  const WarpPlace me = WarpPlace::of_thread();
  int parity = 0;
  const int64_t units = a.view.outer * c.spans;
  for (int64_t i = blockIdx.x; i < units; i += gridDim.x, parity ^= 1) {
    const int64_t u = units - 1 - i, row = u / c.spans, span = u % c.spans;
    Stat stat = RowStatOp<Op>::template identity<Stat>();
    int64_t n = a.view.length;  // the statistic's elements
    if constexpr (Op::kGrouped) {  // merged by group (reduce_scale_merge_stats_kernel): every thread reads it
      stat = stats[row % a.grouping.stat_groups];
      n *= a.view.outer / a.grouping.stat_groups;
    } else {
      for (int64_t k = threadIdx.x; k < c.parts; k += BLOCK) stat = RowStatOp<Op>::apply(stat, stats[row * c.parts + k]);
      stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(stat, warp_stat[parity], 0, me);
    }
    const RereadRow<T, V> r(a, row, Op{});
    const RowScale<A> rs = row_scale<Op, A>(stat, n, a.eps, r.template pilot<Op>());
    if constexpr (Op::kRowStats) {  // a grouped op's, merged by group: written there
      if (span == 0 && threadIdx.x == 0) write_stat(a, row, rs, stat.m2);
    }
    if (span == 0 && r.has_edge(threadIdx.x)) r.template scale_edge<Op>(rs, a, row, threadIdx.x);
    r.template scale_vectors<BLOCK, Op>(span * c.span, min64((span + 1) * c.span, r.s.nvec), rs, a, row);
  }
}

}  // namespace normscan

// Statistics shared by rows and too large for a block (batch_norm's channels: a row a
// (sample, channel), a channel's rows sharing one mean and variance), taken by the whole GPU
// one after another: every resident block sums its tiles of the statistic, publishes its
// part (HeldState: a statistic's count of published blocks, and each block's part; the
// ticket unused), waits for the others' (a cooperative launch), merges them all in one order (every
// block the same bits), and scales its tiles. A block's first `held` tiles are copied into
// shared memory as they are summed and scaled from there (read once); the rest are summed
// from DRAM and re-read to be scaled. The rest of the next statistic is summed before this
// one's wait, which it hides; its held tiles are copied once this one's have been scaled
// (interleaving the copies with the stores measured slower: docs/design-notes.md).
// Tile q of a statistic: BLOCK vectors of row q / row_tiles of it; block b takes tiles b,
// b + blocks, b + 2 blocks, ... (the blocks at work read neighbouring tiles).
#pragma once

#include "held.cuh"

namespace normscan {

struct ChannelPlan {
  unsigned row_tiles;  // tiles of a row: BLOCK vectors each, the last maybe fewer
  unsigned tiles;      // of a statistic: its rows * row_tiles
  int held;            // tiles a block holds in shared memory
  unsigned streams;    // groups of blocks, group s taking statistics s, s + streams, ...
};

// Vectors a batch of the accumulator: fp32's 4 spilled 72 bytes (1024 threads have 64
// registers each); doubles spilled at 2 (24 bytes) and take the split kernels.
template <typename T> constexpr int kChannelsBatch = sizeof(T) == 2 ? 2 : 3;

// Rows of a statistic whose row r is statistic r % stat_groups's and whose channel is its
// statistic (batch_norm's: groups == stat_groups, one channel a row), every row whole vectors
// from a 16-byte boundary in x and y.
template <typename T, typename Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK, 1024 / BLOCK)
    reduce_scale_channels_kernel(ArgsFor<T, Op> a, ChannelPlan p, HeldState<RowStat<Op, acc_t<T>>> st) {
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  constexpr int V = vec16<T>(), U = kChannelsBatch<T>;
  using VT = Vec<T, V>;
  extern __shared__ uint4 held[];  // this thread's vector of held tile k at held[k * BLOCK + threadIdx.x]
  __shared__ Stat warp_stat[2][BLOCK / 32];  // [0]: the block's part, [1]: the merge
  const WarpPlace me = WarpPlace::of_thread();
  // The groups take consecutive blocks: the first wave, one block a SM, spans them all.
  const unsigned blocks = gridDim.x / p.streams, stream = blockIdx.x / blocks, b = blockIdx.x % blocks;
  const int64_t groups = a.grouping.stat_groups, nvec = a.view.length / V;
  const int mine = p.tiles > b ? static_cast<int>((p.tiles - 1 - b) / blocks + 1) : 0;
  const int kept = min(mine, p.held);
  VT* const slots = reinterpret_cast<VT*>(held) + threadIdx.x;

  if (stream >= p.streams) return;  // blocks beyond whole groups
  // This thread's vector of the block's k-th tile of statistic g: its offsets in x and y, or
  // false past its row.
  const auto at = [&](int64_t g, int k, int64_t* xo, int64_t* yo) {
    const unsigned q = b + static_cast<unsigned>(k) * blocks, r = q / p.row_tiles;
    const int64_t v = int64_t(q - r * p.row_tiles) * BLOCK + threadIdx.x, row = g + int64_t(r) * groups;
    *xo = row * a.view.x_so + v * V;
    *yo = row * a.view.y_so + v * V;
    return v < nvec;
  };
  // Adds the vectors v[u] where ok[u] to acc: all U at once but where a row's end or the
  // block's last tile leaves some out.
  const auto add = [&](RowAccumulator<Op, A>& acc, const Vec<T, vec16<T>()> (&v)[kChannelsBatch<T>],
                       const bool (&ok)[kChannelsBatch<T>]) {
    bool all = true;
#pragma unroll
    for (int u = 0; u < U; ++u) all = all && ok[u];
    if (all) {
      A vals[U * V];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < V; ++i) vals[u * V + i] = Convert<T>::to_acc(v[u].v[i]);
      acc.add(vals, U * V);
      return;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (ok[u]) {
        A vals[V];
#pragma unroll
        for (int i = 0; i < V; ++i) vals[i] = Convert<T>::to_acc(v[u].v[i]);
        acc.add(vals, V);
      }
  };
  const auto accumulator = [&](int64_t g) {
    RowAccumulator<Op, A> acc;
    acc.pilot = Convert<T>::to_acc(a.x[g * a.view.x_so]);  // the statistic's first element (RereadRow::pilot)
    return acc;
  };
  // Sums the tiles past the held ones, from x.
  const auto sum_rest = [&](int64_t g, RowAccumulator<Op, A>& acc) {
    int64_t xo, yo;
    for (int k0 = kept; k0 < mine; k0 += U) {
      VT v[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if ((ok[u] = k0 + u < mine && at(g, k0 + u, &xo, &yo))) v[u] = load_vec<T, V>(a.x + xo);
      add(acc, v, ok);
    }
  };
  // Copies the held tiles into shared memory, sums them, and publishes the block's part.
  const auto sum_held_and_publish = [&](int64_t g, RowAccumulator<Op, A>& acc) {
    int64_t xo, yo;
    for (int k = 0; k < kept; ++k)
      if (at(g, k, &xo, &yo)) cp_async16(slots + k * BLOCK, a.x + xo);
    cp_async_wait_all();
    for (int k0 = 0; k0 < kept; k0 += U) {
      VT v[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if ((ok[u] = k0 + u < kept && at(g, k0 + u, &xo, &yo))) v[u] = slots[(k0 + u) * BLOCK];
      add(acc, v, ok);
    }
    const Stat part = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(acc.stat(), warp_stat[0], 0, me);
    if (threadIdx.x == 0) {
      st.part_stats[g * blocks + b] = part;
      add_release(st.published + g, 1u);
    }
  };
  // Waits for every block's part, merges them, and scales the block's tiles: the re-read
  // ones, last first, then the held ones.
  const auto scale = [&](int64_t g, A pilot) {
    if (threadIdx.x == 0) {
      while (load_acquire(st.published + g) < blocks) __nanosleep(64);
    }
    __syncthreads();
    Stat stat = RowStatOp<Op>::template identity<Stat>();
    for (unsigned i = threadIdx.x; i < blocks; i += BLOCK)
      stat = RowStatOp<Op>::apply(stat, load_from_l2(st.part_stats + g * blocks + i));
    stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(stat, warp_stat[1], 0, me);
    const RowScale<A> rs = row_scale<Op, A>(stat, a.view.length * (a.view.outer / groups), a.eps, pilot);
    if (b == 0 && threadIdx.x == 0) write_stat(a, g, rs, stat.m2);
    using P = param_t<T, Op>;
    const A wc = a.w ? Convert<P>::to_acc(a.w[g]) : A(1), bias = a.b ? Convert<P>::to_acc(a.b[g]) : A(0);
    int64_t xo, yo;
    for (int k0 = mine - 1; k0 >= kept; k0 -= U) {
      VT v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (k0 - u >= kept && at(g, k0 - u, &xo, &yo)) v[u] = load_vec<T, V>(a.x + xo);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (k0 - u >= kept && at(g, k0 - u, &xo, &yo))
          store_vec_whole<T, V>(a.y + yo, scaled_in_channel<Op>(v[u], rs.scale, rs.shift, wc, bias));
    }
#pragma unroll 1  // stores need no loads in flight
    for (int k = 0; k < kept; ++k)
      if (at(g, k, &xo, &yo))
        store_vec_whole<T, V>(a.y + yo, scaled_in_channel<Op>(slots[k * BLOCK], rs.scale, rs.shift, wc, bias));
  };
  // Statistic g's wait hides behind the next one's re-read tiles: they are summed before g
  // is scaled, its held tiles after (they need the shared memory g's occupy).
  int64_t g = stream;
  auto acc = accumulator(g);
  sum_rest(g, acc);
  sum_held_and_publish(g, acc);
  for (; g < groups; g += p.streams) {
    const A pilot = acc.pilot;
    const int64_t next = g + p.streams;
    if (next < groups) {
      acc = accumulator(next);
      sum_rest(next, acc);
    }
    scale(g, pilot);
    if (next < groups) sum_held_and_publish(next, acc);
  }
}

}  // namespace normscan

// Rows held on chip across the GPU: y = apply(x, scale(sum over the row)) [* w] [+ b] for
// aligned rows longer than a cluster holds but shorter than the GPU's shared memory
// (KernelBench 35's groups of 8 MB, 40's rows of 16 MB). Each row is split into `parts`
// parts of up to BLOCK * HELD vectors; a block takes a part (in ticket order), copies it into
// one of its two shared-memory buffers while summing it and publishes its statistic; then it
// takes the next part into the other buffer likewise, and only then waits until every part
// of the first one's row has published, merges them (in part order: every block, and every
// run, gets the same bits) and scales the first part from shared memory: x is read from DRAM
// once. A waiting part needs parts with later tickets: the launch is cooperative (every block
// resident at once), publishing waits for nothing, and a row has no more parts than the
// blocks' buffers, so every part a waiting block needs is published or will be.
#pragma once

#include "../device/async.cuh"
#include "reread.cuh"

namespace normscan {

struct HeldPlan {
  int64_t parts;  // a row's: at most twice the resident blocks
  int64_t span;   // vectors a part (<= BLOCK * HELD)
  int64_t units;  // rows * parts
};

// The launch's shared state: a ticket counter, each row's count of published parts, and the
// parts' statistics. The counters start at zero (one memset of counter_bytes).
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

template <typename T, typename Op, int BLOCK, int HELD>
__global__ void __launch_bounds__(BLOCK, (sizeof(T) == 8 ? 512 : 1024) / BLOCK)  // doubles spilled at twice
    reduce_scale_held_kernel(ArgsFor<T, Op> a, HeldPlan p, HeldState<RowStat<Op, acc_t<T>>> st) {
  using A = acc_t<T>;
  using Stat = RowStat<Op, A>;
  constexpr int V = vec16<T>();
  // Vectors a batch of the accumulator: 16 fp32 values, 8 doubles, one 16-bit vector (two
  // spilled fp16 group_norm's kernel on sm_90).
  constexpr int U = V == 8 ? 1 : 4;
  using VT = Vec<T, V>;
  extern __shared__ uint4 held[];  // two buffers; vector k of thread i at buffer[k * BLOCK + i]
  __shared__ Stat warp_stat[2][BLOCK / 32];
  __shared__ int64_t ticket[2];
  const WarpPlace me = WarpPlace::of_thread();
  // Part j of the rows: its row, and this thread's vectors of it, first, first + BLOCK, ...,
  // `count` vectors from first on. In-row offsets fit 32 bits: the row is held on chip.
  struct Place {
    int64_t row, part;
    int first, count;
  };
  auto place_of = [&](int64_t j, const RereadRow<T, V>& r) {
    Place q;
    q.row = j / p.parts;
    q.part = j % p.parts;
    const int start = static_cast<int>(min64(q.part * p.span, r.s.nvec));
    q.first = start + static_cast<int>(threadIdx.x);
    q.count = static_cast<int>(min64(start + p.span, r.s.nvec)) - q.first;
    return q;
  };
  auto slot = [&](int b, int k) { return reinterpret_cast<VT*>(&held[(b * HELD + k) * BLOCK + threadIdx.x]); };
  auto take = [&](int parity) {
    if (threadIdx.x == 0) ticket[parity] = static_cast<int64_t>(atomicAdd(st.ticket, 1ull));
    __syncthreads();
    return ticket[parity];
  };
  // Copies part j into buffer b while summing it, and publishes its statistic: nothing waits.
  auto sum_part = [&](int64_t j, int b, int parity) {
    const RereadRow<T, V> r(a, j / p.parts, Op{});
    const Place q = place_of(j, r);
    const T* xp = r.xr + r.s.head + int64_t(q.first) * V;
    // Two groups of copies, the first batch and the rest: the first is summed while the
    // rest land (a thread reads only the slots it filled).
#pragma unroll
    for (int k = 0; k < HELD; ++k) {
      if (k * BLOCK < q.count) cp_async16(slot(b, k), xp + k * BLOCK * V);
      if (k == U - 1 || k == HELD - 1) cp_async_commit();
    }
    auto acc = r.template accumulator<Op>();
    if (q.part == 0 && r.has_edge()) r.add_edge(acc);
    cp_async_wait_groups<(HELD > U ? 1 : 0)>();
#pragma unroll 1
    for (int k0 = 0; k0 < HELD; k0 += U) {
      A vals[U * V];
      int n = 0;  // the present vectors are the first ones
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (k0 + u < HELD && (k0 + u) * BLOCK < q.count) {
          const VT v = *slot(b, k0 + u);
#pragma unroll
          for (int i = 0; i < V; ++i) vals[u * V + i] = Convert<T>::to_acc(v.v[i]);
          n += V;
        }
      if (n > 0) acc.add(vals, n);
      if (k0 == 0) cp_async_wait_groups<0>();
    }
    const Stat stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(acc.stat(), warp_stat[parity], 0, me);
    if (threadIdx.x == 0) {
      st.part_stats[j] = stat;
      add_release(st.published + q.row, 1u);
    }
  };
  // Waits until every part of part j's row has published, merges their statistics, and
  // scales part j from buffer b into y.
  auto scale_part = [&](int64_t j, int b, int parity) {
    const RereadRow<T, V> r(a, j / p.parts, Op{});
    const Place q = place_of(j, r);
    if (threadIdx.x == 0) {
      while (load_acquire(st.published + q.row) < p.parts) __nanosleep(64);
    }
    __syncthreads();
    Stat stat = RowStatOp<Op>::template identity<Stat>();
    for (int64_t i = threadIdx.x; i < p.parts; i += BLOCK)
      stat = RowStatOp<Op>::apply(stat, load_from_l2(st.part_stats + q.row * p.parts + i));
    stat = block_group_reduce<RowStatOp<Op>, BLOCK / 32>(stat, warp_stat[parity], 0, me);
    const RowScale<A> rs = row_scale<Op, A>(stat, a.view.length, a.eps, r.template pilot<Op>());
    if constexpr (Op::kGrouped) {
      if (q.part == 0 && threadIdx.x == 0) write_stat(a.grouping, q.row, rs.shift, stat.m2);
    }
    const ChannelRow<T, false> ch = r.template channels<Op, false>(a, q.row);
    T* yp = r.yr + r.s.head + int64_t(q.first) * V;
    const int l = static_cast<int>(r.s.head) + q.first * V;
#pragma unroll 1  // stores need no loads in flight; unrolled, the scaling's registers spilled
    for (int k = 0; k < HELD; ++k)
      if (k * BLOCK < q.count)
        store_vec<T, V>(yp + k * BLOCK * V, r.template scaled<Op>(*slot(b, k), l + k * BLOCK * V, rs, a, ch));
    if (q.part == 0 && r.has_edge()) r.template scale_edge<Op>(rs, a, q.row);
  };
  // Each part is summed (into one buffer) before the part before it is scaled (from the
  // other): the wait for a row's last parts overlaps the next part's loads.
  int64_t j = take(0);
  if (j >= p.units) return;
  sum_part(j, 0, 0);
  for (int b = 0, parity = 1;; b ^= 1, parity ^= 1) {
    const int64_t next = take(parity);
    if (next < p.units) sum_part(next, b ^ 1, parity);
    scale_part(j, b, parity);
    if (next >= p.units) return;
    j = next;
  }
}

}  // namespace normscan

// Look-back row scans (inner == 1, few long rows): each row is cut into tiles spread over
// the whole GPU, chained by a single-pass decoupled look-back.
//
// Tile t is chunk (t % tiles_per_row) of row (t / tiles_per_row); a ticket counter hands the
// tiles out in order. Blocks are persistent and hold two tiles in shared memory: warp 0
// looks back for the older tile while the other (data) warps take in the newer one and
// publish its aggregate, so a block keeps loading while it waits on its predecessors.
// A tile's aggregate waits on nothing but its own loads, and the smallest unfinished
// ticket is always a tile being looked back: the chain progresses whichever blocks are
// resident. The data warps meet on arrive/wait barriers, not on a named bar.sync of part
// of the block, which compute-sanitizer's racecheck misreads (it reported a hazard between
// a write and a read on either side of a __syncthreads). The first tile of a row also
// scans the front elements, the last one the back elements.
#pragma once

#include "../device/async.cuh"
#include "../device/lookback.cuh"
#include "rows.cuh"

namespace normscan {

// A look-back scan's shape: BLOCK threads (warp 0 looks back, the rest hold tiles), NV
// vectors a data thread a tile, MINB resident blocks a SM asked of the compiler, look-back
// entries ENTRY bytes apart. tuning.cuh names the one used.
template <int BLOCK, int NV, int MINB, int64_t ENTRY> struct ScanLookbackConfig {
  static constexpr int kBlock = BLOCK, kVecs = NV, kMinBlocks = MINB;
  static constexpr int64_t kTileVecs = int64_t(BLOCK - 32) * NV;  // body vectors of a tile
  static constexpr size_t kSmemBytes = size_t(2) * kTileVecs * 16;  // two tiles
  template <typename A> using State = LookbackState<A, ENTRY>;
};

template <typename T, typename Op, int V, typename Cfg>
__global__ void __launch_bounds__(Cfg::kBlock, (scan_min_blocks<T, Op>(Cfg::kMinBlocks)))
    scan_lookback_kernel(ScanArgsFor<T, Op> a, typename Cfg::template State<scan_acc_t<T>> st, int64_t tiles_per_row) {
  constexpr int NV = Cfg::kVecs;
  using A = scan_acc_t<T>;
  using VT = Vec<T, V>;
  constexpr int DATA = Cfg::kBlock - 32;  // threads of the data warps, 1..
  constexpr int DATA_WARPS = DATA / 32;
  constexpr int64_t VECS = Cfg::kTileVecs;  // body vectors of a tile
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
  const int64_t tiles = a.view.outer * tiles_per_row;
  using Row = ScanRow<T, V, mask_t<Op>>;
  auto row_of = [&](int64_t tile) { return Row::of(a, tile / tiles_per_row); };
  // Data thread d's vector k, warp-striped: data warp w holds [w * 32 * NV, (w + 1) * 32 * NV).
  auto vindex = [&](int64_t first, int k) { return first + (warp - 1) * 32 * NV + k * 32 + lane; };
  auto held = [&](const Row& r, int b, int k) {  // in scan order
    VT v = *reinterpret_cast<const VT*>(&slots[(b * NV + k) * DATA + d]);
    if (r.reverse) Row::flip(&v);
    return v;
  };
  // Data warps: start copying `tile` into buffer b; a masked tile's mask elements are loaded
  // into `staged` after every copy is issued (interleaved with the copies, each mask load
  // stalled the next: one row of 2**28 took 1.047 ms, against 0.839 so).
  typename Row::Mask staged[NV];
  auto stage = [&](int64_t tile, int b) {
    if (tile >= tiles) return;
    const Row r = row_of(tile);
    const int64_t first = (tile % tiles_per_row) * VECS, end = min(r.s.nvec, first + VECS);
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (vindex(first, k) < end) cp_async16(&slots[(b * NV + k) * DATA + d], r.vec_ptr(vindex(first, k)));
    if constexpr (kMasked<Op>) {
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (vindex(first, k) < end) staged[k] = r.mask_of(vindex(first, k));
    }
  };
  // Data warps: once buffer b has landed, publish its tile's aggregate (its inclusive prefix
  // for a row's first tile) and take the next ticket into s_ticket[next].
  unsigned phase = 0;
  auto take_in = [&](int64_t tile, int b, int set, int next) {
    const Row r = row_of(tile);
    const int64_t c_idx = tile % tiles_per_row, first = c_idx * VECS, end = min(r.s.nvec, first + VECS);
    cp_async_wait_all();  // only this tile's copies are in flight; each thread reads its own
    if constexpr (kMasked<Op>) {  // x times its mask, in place: scan_out reads the slots again
#pragma unroll
      for (int k = 0; k < NV; ++k)
        if (vindex(first, k) < end) {
          VT* slot = reinterpret_cast<VT*>(&slots[(b * NV + k) * DATA + d]);
          *slot = masked_vec(*slot, staged[k].values());
        }
    }
    A mine = Op::template identity<A>();
#pragma unroll
    for (int k = 0; k < NV; ++k)
      if (vindex(first, k) < end) mine = Op::apply(mine, combine<Op>(held(r, b, k)));
    mine = warp_reduce<Op>(mine);
    // (The first barrier is not needed for correctness: s_wtot has three sets. It measured
    // faster kept, for reasons not understood: docs/design-notes.md, "Scans".)
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
    const Row r = row_of(tile);
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

}  // namespace normscan

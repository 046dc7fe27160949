// The one view every kernel takes: a tensor's dims folded to (outer, length, inner), the
// scanned or reduced dim being `length`, with x's and y's element strides. Built on the
// Python side (normscan/view.py, `View.fields`, in this order); host checks of what the
// kernels may assume about it are members.
#pragma once

#include "types.cuh"

namespace normscan {

struct View {
  int64_t outer, length, inner;
  int64_t x_so, x_sl, x_si;  // element strides of x along outer, length, inner
  int64_t y_so, y_sl, y_si;  // and of y
  static constexpr int kFields = 9;

  static View from(const int64_t* f) { return View{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]}; }
  bool empty() const { return outer == 0 || length == 0 || inner == 0; }
  // The reduced dim is contiguous in x and y, and nothing lies inside it: rows.
  bool rows() const { return inner == 1 && x_sl == 1 && y_sl == 1; }
  // Rows may use 16-byte vectors only if every x row and its y row share their alignment:
  // the same head is then peeled from both.
  template <typename T>
  bool rows_share_alignment(const T* x, const T* y) const {
    const auto dx = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(x) - reinterpret_cast<uintptr_t>(y));
    const auto ds = static_cast<uint64_t>((x_so - y_so) * static_cast<int64_t>(sizeof(T)));
    return dx % 16 == 0 && (outer == 1 || ds % 16 == 0);
  }
  // Whether every (outer, l) line of x and y along inner starts 16-byte aligned and holds
  // whole vectors of n elements, contiguous.
  template <typename T>
  bool inner_vectorizable(const T* x, const T* y, int n) const {
    const auto aligned = [n](int64_t stride, int64_t extent) { return extent == 1 || stride % n == 0; };
    return x_si == 1 && y_si == 1 && inner % n == 0 && aligned(x_so, outer) && aligned(y_so, outer) &&
           aligned(x_sl, length) && aligned(y_sl, length) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(y) % 16 == 0;
  }
};

}  // namespace normscan

// FP8 elements (e4m3fn, e5m2) as outputs: rounded to nearest even, saturated to the format's
// finite range (a NaN stays NaN), two at a time; each format's largest finite value.
#pragma once

#include <cuda_fp8.h>

#include "types.cuh"

namespace normscan {

template <typename F, __nv_fp8_interpretation_t KIND> struct Fp8Convert {
  static __device__ __forceinline__ float to_acc(F v) { return static_cast<float>(v); }
  static __device__ __forceinline__ F from_acc(float v) {
    F out;
    out.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, KIND);
    return out;
  }
  static __device__ __forceinline__ void from_acc2(float lo, float hi, F* out) {
    *reinterpret_cast<__nv_fp8x2_storage_t*>(out) = __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, KIND);
  }
};
template <> struct Convert<__nv_fp8_e4m3> : Fp8Convert<__nv_fp8_e4m3, __NV_E4M3> {};
template <> struct Convert<__nv_fp8_e5m2> : Fp8Convert<__nv_fp8_e5m2, __NV_E5M2> {};

template <> struct OutFormat<__nv_fp8_e4m3> {
  static constexpr bool kFp8 = true;
  static constexpr float kMax = 448.0f;
};
template <> struct OutFormat<__nv_fp8_e5m2> {
  static constexpr bool kFp8 = true;
  static constexpr float kMax = 57344.0f;
};

}  // namespace normscan

// Persistent-grid launches, with or without a thread-block cluster. Host only.
#pragma once

#include "primitives.cuh"

namespace normscan {

// Launch `kernel` with `threads` threads per block over `units` independent work units
// (each unit is one cluster of `cluster` blocks), on a grid no larger than what is
// resident at once; the kernel loops over the remaining units. Residency is measured once
// per kernel, device and cluster size.
template <auto kernel, typename Args>
inline cudaError_t launch_persistent(dim3 threads, int cluster, int64_t units, cudaStream_t stream,
                                     const Args& args) {
  constexpr int kMaxDevices = 64;
  constexpr int kMaxCluster = 8;
  // Resident clusters per device and cluster size; 0 = not measured yet.
  static int64_t resident[kMaxDevices][kMaxCluster + 1] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices || cluster < 1 || cluster > kMaxCluster) return cudaErrorInvalidValue;
  const int nthreads = static_cast<int>(threads.x * threads.y * threads.z);

  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.blockDim = threads;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  if (cluster > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  int64_t& fit = resident[dev][cluster];
  if (fit == 0) {
    if (cluster == 1) {
      err = resident_blocks(kernel, nthreads, &fit);
    } else {
      int n = 0;
      cfg.gridDim = dim3(cluster, 1, 1);
      err = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
      fit = n > 0 ? n : 1;
    }
    if (err != cudaSuccess) {
      fit = 0;
      return err;
    }
  }
  const int64_t grid_units = min64(units, fit);
  cfg.gridDim = dim3(static_cast<unsigned>(grid_units * cluster), 1, 1);
  err = cudaLaunchKernelEx(&cfg, kernel, args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace normscan

// kforge's stand-in for torch's header of this name, so that FlashAttention-2's launch template
// builds without torch (benchmarks/fa2_tiles/fa2_tiles.cu): its two macros, checking as torch's do
// but aborting with the error's name instead of throwing.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define C10_CUDA_CHECK(expr)                                                        \
  do {                                                                              \
    cudaError_t kforge_e_ = (expr);                                                 \
    if (kforge_e_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "fa2_tiles: %s\n", cudaGetErrorString(kforge_e_));      \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_CUDA_CHECK(cudaGetLastError())

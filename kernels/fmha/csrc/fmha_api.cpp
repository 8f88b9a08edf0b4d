// The C API: argument validation, device checks, error text and kernel dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fmha_params.h"
#include "kforge_fmha.h"

#ifndef KFORGE_FMHA_ARCHS
#define KFORGE_FMHA_ARCHS "unknown"
#endif

namespace {

thread_local std::string g_last_error;

kforge_fmha_status fail(kforge_fmha_status status, const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  g_last_error = buf;
  return status;
}

kforge_fmha_status ok() {
  g_last_error.clear();
  return KFORGE_FMHA_SUCCESS;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Checks the driver, a GPU, and the current device's compute capability.
kforge_fmha_status check_device(int* major_out, int* minor_out) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
    cudaGetLastError();
    return fail(KFORGE_FMHA_ERROR_NO_DEVICE,
                "no CUDA GPU is visible (cudaGetDeviceCount: %s); kforge_fmha needs an NVIDIA GPU "
                "of compute capability 8.0 or newer; check nvidia-smi and CUDA_VISIBLE_DEVICES",
                err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
  }
  if (err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError ||
      err == cudaErrorSystemDriverMismatch || err == cudaErrorCompatNotSupportedOnDevice ||
      err == cudaErrorStubLibrary) {
    cudaGetLastError();
    return fail(KFORGE_FMHA_ERROR_NO_DEVICE,
                "no usable CUDA driver (cudaGetDeviceCount: %s); install an NVIDIA driver that "
                "supports CUDA %d.%d or newer",
                cudaGetErrorString(err), CUDART_VERSION / 1000, (CUDART_VERSION % 1000) / 10);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(KFORGE_FMHA_ERROR_CUDA, "cudaGetDeviceCount failed: %s", cudaGetErrorString(err));
  }
  int dev = 0;
  err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    return fail(KFORGE_FMHA_ERROR_CUDA, "cudaGetDevice failed: %s", cudaGetErrorString(err));
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major_out) *major_out = major;
  if (minor_out) *minor_out = minor;
  if (major < 8) {
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "GPU %d has compute capability %d.%d; kforge_fmha needs 8.0 or newer", dev, major,
                minor);
  }
  return ok();
}

// A pointer the GPU can read: device memory or mapped/managed host memory.
kforge_fmha_status check_device_pointer(const char* name, const void* ptr) {
  cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "%s: cannot query the pointer (%s)", name,
                cudaGetErrorString(err));
  }
  if (attr.type == cudaMemoryTypeUnregistered ||
      (attr.type == cudaMemoryTypeHost && attr.devicePointer == nullptr)) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "%s is a host pointer; pass GPU memory (a CUDA tensor)", name);
  }
  return KFORGE_FMHA_SUCCESS;
}

kforge_fmha_status check_stride(const char* name, const char* dim, int64_t stride) {
  if (stride < 0 || stride % 8 != 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "%s: the %s stride is %lld elements; it must be >= 0 and a multiple of 8 (16-byte "
                "aligned rows); make the tensor contiguous",
                name, dim, static_cast<long long>(stride));
  }
  return KFORGE_FMHA_SUCCESS;
}

struct Shapes {
  kforge_fmha_dtype dtype;
  int head_dim;
  int batch, seqlen_q, seqlen_k, num_heads, num_heads_k;
  float softmax_scale;
};

kforge_fmha_status check_common(const Shapes& s, const void* q, const void* k, const void* v,
                                const void* o, const float* lse) {
  if (s.dtype != KFORGE_FMHA_FP16 && s.dtype != KFORGE_FMHA_BF16) {
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "dtype %d is not supported; use KFORGE_FMHA_FP16 (0) or KFORGE_FMHA_BF16 (1)",
                static_cast<int>(s.dtype));
  }
  if (s.head_dim != 64 && s.head_dim != 128) {
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED, "head_dim %d is not supported; use 64 or 128",
                s.head_dim);
  }
  const struct {
    const char* name;
    const void* ptr;
  } ptrs[] = {{"q", q}, {"k", k}, {"v", v}, {"o", o}};
  for (const auto& p : ptrs) {
    if (p.ptr == nullptr) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "%s is NULL", p.name);
    }
    if (!aligned16(p.ptr)) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                  "%s is not 16-byte aligned (%p); pass the start of an allocation or a view "
                  "whose offset is a multiple of 8 elements",
                  p.name, p.ptr);
    }
  }
  if (lse != nullptr && (reinterpret_cast<uintptr_t>(lse) & 3u) != 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse is not 4-byte aligned (%p)",
                static_cast<const void*>(lse));
  }
  if (s.batch < 0 || s.batch > 65535) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "batch is %d; it must be in [0, 65535]",
                s.batch);
  }
  if (s.seqlen_q < 0 || s.seqlen_k < 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "sequence lengths must be >= 0 (got seqlen_q=%d, seqlen_k=%d)", s.seqlen_q,
                s.seqlen_k);
  }
  if (s.num_heads < 1 || s.num_heads > 65535 || s.num_heads_k < 1) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "num_heads must be in [1, 65535] and num_heads_k >= 1 (got %d and %d)",
                s.num_heads, s.num_heads_k);
  }
  if (s.num_heads % s.num_heads_k != 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "num_heads (%d) is not a multiple of num_heads_k (%d); GQA/MQA needs the kv "
                "heads to divide the query heads",
                s.num_heads, s.num_heads_k);
  }
  if (!std::isfinite(s.softmax_scale) || !(s.softmax_scale > 0.f)) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "softmax_scale is %g; it must be finite and > 0 (usually 1/sqrt(head_dim))",
                static_cast<double>(s.softmax_scale));
  }
  return KFORGE_FMHA_SUCCESS;
}

// The sm_90a kernels (the TMA path of KFORGE_FMHA_SM90_PATH below, by default one per shape) run on
// compute capability 9.0 when the build holds 90a code; KFORGE_FMHA_SM90=0 forces the mma.sync
// kernel, =1 asks for the sm_90a kernels (still only where they can run). The compile-time
// default is KFORGE_FMHA_SM90_DEFAULT.
#ifndef KFORGE_FMHA_SM90_DEFAULT
#define KFORGE_FMHA_SM90_DEFAULT 1
#endif
bool sm90_wanted() {
  static const bool wanted = [] {
    const char* e = std::getenv("KFORGE_FMHA_SM90");
    if (e == nullptr || *e == '\0') return KFORGE_FMHA_SM90_DEFAULT != 0;
    return std::strcmp(e, "0") != 0;
  }();
  return wanted;
}
bool built_with_90a() { return std::strstr(KFORGE_FMHA_ARCHS, "90a") != nullptr; }

// Which sm_90a kernel a call asks for: KFORGE_FMHA_SM90_PATH, read at every call (so one process
// can compare the paths). Unset, empty or "default": the path default_tma_path() picks per shape
// from the TMA tuning runs (docs/benchmarks.md). "wgmma": the cp.async wgmma kernel (hdim 128;
// hdim 64 runs the mma.sync kernel). The TMA paths (fmha_fwd_sm90_tma.cuh), each a (MODE, VAR) pair of its
// kernel: "tma-basic" (no overlap), "tma-overlap" (intra-warpgroup overlap), "tma" (overlap +
// ping-pong), and the tuning variants "tma-lpt" (tma-overlap in longest-first L2-section
// order), "tma-pp-lpt" (tma in that order), "tma-stages" (tma-overlap with one more K/V
// stage), "tma-m192" (tma-overlap with 3 consumer warpgroups, hdim 64; at hdim 128 it runs
// tma-overlap), "tma-m192-lpt" (hdim 64; at hdim 128 tma-lpt), "tma-persist" (tma-overlap
// as a persistent kernel, one CTA per SM, in the lpt order, Q double-buffered), "tma-pp-stages"
// (tma with one more K/V stage), "tma-n176" and "tma-pp-n176" (tma-overlap and tma with 176-key
// tiles, hdim 128; at hdim 64 they run tma-overlap and tma), "tma-dyn" and "tma-pp-dyn"
// (tma-overlap and tma as persistent kernels with a dynamic scheduler: a global tile counter,
// lpt order when causal; when no counter can be had, e.g. during stream capture, they run
// tma-lpt and tma-pp-lpt), "tma-dyn-xt" (tma-dyn with each tile's first Q K^T issued before
// the previous tile's epilogue; falls back like tma-dyn), "tma-dyn-n176" and
// "tma-pp-dyn-n176" (tma-dyn and tma-pp-dyn with 176-key tiles and one Q buffer, hdim 128; at
// hdim 64 they run tma-dyn and tma-pp-dyn; with no counter they run tma-n176 and tma-pp-n176,
// the same tiles in a static order), and "tma-dyn-skew", "tma-dyn-n176-skew" and
// "tma-pp-dyn-skew" (the kernels of tma-dyn, tma-dyn-n176 and tma-pp-dyn, whose producer loads
// K of key tile i + 1 before V of key tile i), "tma-dyn-fe" (tma-dyn-skew with a shorter
// epilogue: stmatrix staging, unchecked full-tile stores), "tma-dyn-ts" (tma-dyn-fe with a TMA
// store of O and the tile's coordinates from the producer) and "tma-dyn-fs" (tma-dyn-ts with a
// lighter first key tile per tile); all three fall back like tma-dyn. A TMA path runs head dims
// 64 and 128 with fixed-length batches; a call it cannot take (varlen, strides a tensor map cannot
// describe) runs the wgmma kernel (hdim 128) or the mma.sync kernel (hdim 64);
// kforge_fmha_last_kernel() says which ran.
struct TmaKernel {
  const char* path;    // KFORGE_FMHA_SM90_PATH value
  int mode, var64, var128;
  const char* name64;  // kforge_fmha_last_kernel() at head dim 64
  const char* name128;
  int kv_skew = 0;     // the producer's load order (FwdParams::kv_skew)
};
constexpr TmaKernel kTmaKernels[] = {
    {"tma-basic", 0, 0, 0, "sm90_tma_basic", "sm90_tma_basic"},
    {"tma-overlap", 1, 0, 0, "sm90_tma_overlap", "sm90_tma_overlap"},
    {"tma", 2, 0, 0, "sm90_tma", "sm90_tma"},
    {"tma-lpt", 1, 1, 1, "sm90_tma_overlap_lpt", "sm90_tma_overlap_lpt"},
    {"tma-pp-lpt", 2, 1, 1, "sm90_tma_lpt", "sm90_tma_lpt"},
    {"tma-stages", 1, 2, 2, "sm90_tma_overlap_stages", "sm90_tma_overlap_stages"},
    {"tma-m192", 1, 3, 0, "sm90_tma_overlap_m192", "sm90_tma_overlap"},
    {"tma-m192-lpt", 1, 4, 1, "sm90_tma_overlap_m192_lpt", "sm90_tma_overlap_lpt"},
    {"tma-persist", 1, 5, 5, "sm90_tma_overlap_persist", "sm90_tma_overlap_persist"},
    {"tma-pp-stages", 2, 2, 2, "sm90_tma_stages", "sm90_tma_stages"},
    {"tma-n176", 1, 0, 6, "sm90_tma_overlap", "sm90_tma_overlap_n176"},
    {"tma-pp-n176", 2, 0, 6, "sm90_tma", "sm90_tma_n176"},
    {"tma-dyn", 1, 7, 7, "sm90_tma_overlap_dyn", "sm90_tma_overlap_dyn"},
    {"tma-pp-dyn", 2, 7, 7, "sm90_tma_dyn", "sm90_tma_dyn"},
    {"tma-dyn-xt", 1, 8, 8, "sm90_tma_overlap_dyn_xt", "sm90_tma_overlap_dyn_xt"},
    {"tma-dyn-n176", 1, 7, 9, "sm90_tma_overlap_dyn", "sm90_tma_overlap_dyn_n176"},
    {"tma-pp-dyn-n176", 2, 7, 9, "sm90_tma_dyn", "sm90_tma_dyn_n176"},
    {"tma-dyn-skew", 1, 7, 7, "sm90_tma_overlap_dyn", "sm90_tma_overlap_dyn", 1},
    {"tma-dyn-n176-skew", 1, 7, 9, "sm90_tma_overlap_dyn", "sm90_tma_overlap_dyn_n176", 1},
    {"tma-pp-dyn-skew", 2, 7, 7, "sm90_tma_dyn", "sm90_tma_dyn", 1},
    {"tma-dyn-fe", 1, 13, 13, "sm90_tma_overlap_dyn_fe", "sm90_tma_overlap_dyn_fe", 1},
    {"tma-dyn-ts", 1, 14, 14, "sm90_tma_overlap_dyn_ts", "sm90_tma_overlap_dyn_ts", 1},
    {"tma-dyn-fs", 1, 15, 15, "sm90_tma_overlap_dyn_fs", "sm90_tma_overlap_dyn_fs", 1},
};
constexpr int kNumTma = sizeof(kTmaKernels) / sizeof(kTmaKernels[0]);
constexpr int kPathDefault = -3;  // resolved per call by default_tma_path()
constexpr int kPathWgmma = -1;
constexpr int kPathInvalid = -2;

// The kTmaKernels index of the path with this name (a name of the table: checked at compile time).
constexpr int tma_index(const char* name) {
  for (int i = 0; i < kNumTma; ++i) {
    const char* a = kTmaKernels[i].path;
    const char* b = name;
    while (*a != '\0' && *a == *b) ++a, ++b;
    if (*a == *b) return i;
  }
  return kPathInvalid;
}

// The default path per shape: the fastest path of the TMA tuning runs (NVIDIA H200,
// docs/benchmarks.md: every column of a shape timed in rotating rounds, 20 rounds), bf16 and
// fp16, seqlen 2k-16k at batch x seqlen = 16384 tokens, 16 heads. x cuDNN of the same run,
// bf16 / fp16:
//  - hdim 64 (run 5, 2026-11-23 11:08 UTC), non-causal: tma-m192 at every seqlen (1.04-1.13 /
//    1.04-1.13; tma-dyn 0.89-0.91).
//  - hdim 64, causal, seqlen_k <= 2048: tma-dyn-skew (run 11, 15:32 UTC: 0.97 / 0.98; tma-dyn,
//    the default of runs 6-11 there, 0.94 / 0.95; tma-m192-lpt 0.94 / 0.95). Above: tma-m192-lpt
//    (run 5: 1.04-1.20 / 1.04-1.20; tma-dyn 0.98-0.99).
//  - hdim 128 (run 10, 15:26 UTC), non-causal, seqlen_k <= 4096: tma-dyn-skew (0.98, 1.01 /
//    0.99, 0.99; tma-dyn 0.97, 0.97 / 0.98, 0.97; tma-dyn-n176 0.97, 0.99 / 0.97, 0.99). Above:
//    tma-dyn-n176 (1.01, 1.03 / 1.02, 1.02; tma-dyn-skew 0.99, 1.00 / 1.00, 1.01; its skewed
//    order is slower there: 0.98, 0.99 / 0.99, 0.98).
//  - hdim 128, causal, seqlen_k <= 8192: tma-dyn-skew (1.09-1.12 / 1.07-1.11; tma-dyn 1.08-1.10
//    / 1.07-1.09). Above: tma-dyn-n176 (1.10 / 1.12; tma-dyn-skew 1.08 / 1.10; runs 7 and 8 had
//    tma-dyn-n176 at 1.09-1.12 against tma-dyn's 1.06-1.09).
// Where the rule above picks tma-dyn-skew, the default runs tma-dyn-fe: the same kernel with a
// shorter epilogue, measured against tma-dyn-skew in the same rounds (H200, 30 rounds, runs 20
// and 21 of docs/benchmarks.md, 2026-11-23 18:23 and 18:28 UTC), bf16 / fp16: hdim 64 causal 2k
// 1.03 / 1.03 and 1.02 / 1.01 x tma-dyn-skew; hdim 128 at the points it takes 0.998-1.006 and
// 0.998-1.013 (within the readings' spread).
// Since run 23 those points run tma-dyn-fs instead: tma-dyn-fe's kernel with a TMA store of O,
// the tile's coordinates from the producer (tma-dyn-ts) and a lighter first key tile. H200, 30
// rounds each, bf16 / fp16: in run 22 (2026-11-23 21:24 UTC) tma-dyn-ts read 1.008 / 1.010 x
// tma-dyn-fe at hdim 128 non-causal 2k, 1.009-1.023 causal, 1.04 / 1.04 at hdim 64 causal 2k;
// in run 23 (21:33 UTC) tma-dyn-fs read 1.008 / 1.008 x tma-dyn-ts at hdim 128 non-causal 2k,
// 1.005 / 1.005 at 4k, 0.996-1.003 causal to 8k, 1.010 / 1.008 at hdim 64 causal 2k.
// The benchmark ties seqlen to batch (16384 tokens), so shorter or longer batches were not
// measured; seqlen_k < 2k takes the <= 2048 / <= 4096 / <= 8192 branches unmeasured.
int default_tma_path(int head_dim, bool causal, int seqlen_k) {
  constexpr int kM192 = tma_index("tma-m192"), kM192Lpt = tma_index("tma-m192-lpt");
  constexpr int kDynN176 = tma_index("tma-dyn-n176"), kDynFs = tma_index("tma-dyn-fs");
  static_assert(kM192 >= 0 && kM192Lpt >= 0 && kDynN176 >= 0 && kDynFs >= 0,
                "default_tma_path names a path that kTmaKernels lacks");
  if (head_dim == 64) {
    if (!causal) return kM192;
    return seqlen_k <= 2048 ? kDynFs : kM192Lpt;
  }
  if (causal) return seqlen_k <= 8192 ? kDynFs : kDynN176;
  return seqlen_k <= 4096 ? kDynFs : kDynN176;
}

// The kTmaKernels index the call asks for, kPathWgmma or kPathInvalid.
int sm90_path(const char** raw) {
  const char* e = std::getenv("KFORGE_FMHA_SM90_PATH");
  *raw = e;
  if (e == nullptr || *e == '\0' || std::strcmp(e, "default") == 0) return kPathDefault;
  if (std::strcmp(e, "wgmma") == 0) return kPathWgmma;
  for (int i = 0; i < kNumTma; ++i) {
    if (std::strcmp(e, kTmaKernels[i].path) == 0) return i;
  }
  return kPathInvalid;
}

// The kernel the last successful launch on this thread ran (kforge_fmha_last_kernel).
thread_local const char* g_last_kernel = "";

// Launches one TMA kernel if this build has it and the call suits it; false when nothing ran.
template <typename T, int HDIM, bool CAUSAL, int MODE, int VAR>
bool try_tma_one(const kforge_fmha::FwdParams& p, cudaStream_t stream, const char* name,
                 cudaError_t* err) {
  if (!kforge_fmha::sm90_tma_available<T, HDIM, CAUSAL, MODE, VAR>()) return false;
  const cudaError_t e = kforge_fmha::launch_fwd_sm90_tma<T, HDIM, CAUSAL, MODE, VAR>(p, stream);
  if (e == cudaErrorNotSupported) return false;  // nothing launched: another kernel runs
  g_last_kernel = name;
  *err = e;
  return true;
}
template <typename T, int HDIM, int MODE, int VAR>
bool try_tma(const kforge_fmha::FwdParams& p, bool causal, cudaStream_t stream, const char* name,
             cudaError_t* err) {
  return causal ? try_tma_one<T, HDIM, true, MODE, VAR>(p, stream, name, err)
                : try_tma_one<T, HDIM, false, MODE, VAR>(p, stream, name, err);
}
// A kernel instantiated non-causal only.
template <typename T, int HDIM, int MODE, int VAR>
bool try_tma_nc(const kforge_fmha::FwdParams& p, cudaStream_t stream, const char* name,
                cudaError_t* err) {
  return try_tma_one<T, HDIM, false, MODE, VAR>(p, stream, name, err);
}

// Runs the TMA kernel of kTmaKernels[index] at this head dim (the instantiations of
// KFORGE_FMHA_INSTANTIATE_SM90_TMA and, at hdim 64, ..._HDIM64).
template <typename T, int HDIM>
bool try_tma_path(int index, const kforge_fmha::FwdParams& p, bool causal, cudaStream_t stream,
                  cudaError_t* err) {
  const TmaKernel& k = kTmaKernels[index];
  const int var = HDIM == 64 ? k.var64 : k.var128;
  const char* name = HDIM == 64 ? k.name64 : k.name128;
  switch (k.mode * 100 + var) {  // (not mode * 10: a VAR past 9 would meet another mode)
    case 0: return try_tma<T, HDIM, 0, 0>(p, causal, stream, name, err);
    case 100: return try_tma<T, HDIM, 1, 0>(p, causal, stream, name, err);
    case 200: return try_tma<T, HDIM, 2, 0>(p, causal, stream, name, err);
    case 101: return try_tma<T, HDIM, 1, 1>(p, causal, stream, name, err);
    case 201: return try_tma<T, HDIM, 2, 1>(p, causal, stream, name, err);
    case 102: return try_tma<T, HDIM, 1, 2>(p, causal, stream, name, err);
    case 202: return try_tma<T, HDIM, 2, 2>(p, causal, stream, name, err);
    case 105: return try_tma<T, HDIM, 1, 5>(p, causal, stream, name, err);
    case 107:
    case 108:
    case 113:
    case 114:
    case 115:
    case 207: {
      // The dynamic scheduler needs its counter (none during stream capture): else the same
      // mode in the static lpt order.
      const bool pp = k.mode == 2;
      if (pp ? try_tma<T, HDIM, 2, 7>(p, causal, stream, name, err)
             : var == 8  ? try_tma<T, HDIM, 1, 8>(p, causal, stream, name, err)
             : var == 13 ? try_tma<T, HDIM, 1, 13>(p, causal, stream, name, err)
             : var == 14 ? try_tma<T, HDIM, 1, 14>(p, causal, stream, name, err)
             : var == 15 ? try_tma<T, HDIM, 1, 15>(p, causal, stream, name, err)
                         : try_tma<T, HDIM, 1, 7>(p, causal, stream, name, err)) {
        return true;
      }
      const TmaKernel& lpt = kTmaKernels[tma_index(pp ? "tma-pp-lpt" : "tma-lpt")];
      const char* lpt_name = HDIM == 64 ? lpt.name64 : lpt.name128;
      return pp ? try_tma<T, HDIM, 2, 1>(p, causal, stream, lpt_name, err)
                : try_tma<T, HDIM, 1, 1>(p, causal, stream, lpt_name, err);
    }
    default: break;
  }
  if constexpr (HDIM == 128) {
    if (var == 6) {
      return k.mode == 2 ? try_tma<T, HDIM, 2, 6>(p, causal, stream, name, err)
                         : try_tma<T, HDIM, 1, 6>(p, causal, stream, name, err);
    }
    if (var == 9) {  // dynamic 176-key tiles; no counter: the static 176-key kernel
      const bool pp = k.mode == 2;
      if (!pp && !causal && p.seqlen_k > 0) {
        // Mode 1, non-causal: every tile's first product is the same partial last key tile;
        // the variant that computes it only as wide as needed (64 or 112 of 176 keys).
        const int rem = p.seqlen_k - (p.seqlen_k - 1) / 176 * 176;
        if (rem <= 64 && try_tma_nc<T, HDIM, 1, 10>(p, stream, name, err)) return true;
        if (rem > 64 && rem <= 112 && try_tma_nc<T, HDIM, 1, 11>(p, stream, name, err)) return true;
      }
      if (pp ? try_tma<T, HDIM, 2, 9>(p, causal, stream, name, err)
             : try_tma<T, HDIM, 1, 9>(p, causal, stream, name, err)) {
        return true;
      }
      const TmaKernel& n176 = kTmaKernels[tma_index(pp ? "tma-pp-n176" : "tma-n176")];
      return pp ? try_tma<T, HDIM, 2, 6>(p, causal, stream, n176.name128, err)
                : try_tma<T, HDIM, 1, 6>(p, causal, stream, n176.name128, err);
    }
  }
  if constexpr (HDIM == 64) {
    if (k.mode == 1 && var == 3) return try_tma<T, HDIM, 1, 3>(p, causal, stream, name, err);
    if (k.mode == 1 && var == 4) return try_tma<T, HDIM, 1, 4>(p, causal, stream, name, err);
  }
  return false;  // not instantiated: the fallback kernel runs (the tests would name it)
}

template <typename T, int HDIM>
cudaError_t dispatch_causal(const kforge_fmha::FwdParams& p, bool causal, int major, int minor,
                            int path, cudaStream_t stream) {
  const bool hopper = major == 9 && minor == 0 && built_with_90a() && sm90_wanted();
  if (hopper && path >= 0) {
    cudaError_t err = cudaSuccess;
    kforge_fmha::FwdParams pk = p;
    pk.kv_skew = kTmaKernels[path].kv_skew;
    if (try_tma_path<T, HDIM>(path, pk, causal, stream, &err)) return err;
  }
  if constexpr (HDIM == 128) {
    if (hopper) {
      if (causal ? kforge_fmha::sm90_available<T, true>() : kforge_fmha::sm90_available<T, false>()) {
        g_last_kernel = "sm90_wgmma";
        return causal ? kforge_fmha::launch_fwd_sm90<T, true>(p, stream)
                      : kforge_fmha::launch_fwd_sm90<T, false>(p, stream);
      }
    }
  }
  g_last_kernel = "mma_sync";
  return causal ? kforge_fmha::launch_fwd<T, HDIM, true>(p, stream)
                : kforge_fmha::launch_fwd<T, HDIM, false>(p, stream);
}

kforge_fmha_status run(const Shapes& s, kforge_fmha::FwdParams& p, bool causal,
                       cudaStream_t stream) {
  const void* ptrs[] = {p.q, p.k, p.v, p.o, p.lse, p.cu_seqlens_q, p.cu_seqlens_k};
  const char* names[] = {"q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k"};
  // The path choice is an argument like the others: checked before any CUDA call.
  const char* path_raw = nullptr;
  int path = sm90_path(&path_raw);
  if (path == kPathInvalid) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "KFORGE_FMHA_SM90_PATH is '%s'; use default (per shape), wgmma, tma-basic, "
                "tma-overlap, tma, tma-lpt, tma-pp-lpt, tma-stages, tma-m192, tma-m192-lpt or "
                "tma-persist, tma-pp-stages, tma-n176, tma-pp-n176, tma-dyn, tma-pp-dyn, "
                "tma-dyn-xt, tma-dyn-n176, tma-pp-dyn-n176, tma-dyn-skew, tma-dyn-n176-skew, "
                "tma-pp-dyn-skew, tma-dyn-fe, tma-dyn-ts or tma-dyn-fs, or unset it",
                path_raw);
  }
  // KFORGE_FMHA_LPT_SECTION: (batch, head) pairs per section of the tma-lpt orders (a tuning
  // knob; unset: the L2 rule of fmha_fwd_sm90_tma.cuh).
  int lpt_section = 0;
  if (const char* e = std::getenv("KFORGE_FMHA_LPT_SECTION"); e != nullptr && *e != '\0') {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || v < 1 || v > (1 << 20)) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                  "KFORGE_FMHA_LPT_SECTION is '%s'; use a whole number of (batch, head) pairs "
                  "from 1 to 1048576, or unset it",
                  e);
    }
    lpt_section = static_cast<int>(v);
  }
  int major = 0, minor = 0;
  kforge_fmha_status st = check_device(&major, &minor);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  for (int i = 0; i < 7; ++i) {
    if (ptrs[i] == nullptr) continue;
    st = check_device_pointer(names[i], ptrs[i]);
    if (st != KFORGE_FMHA_SUCCESS) return st;
  }
  // This library links its own (static) CUDA runtime, whose current device is not the caller's
  // (torch.cuda.set_device does not reach it): run on the device that owns q.
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p.q) == cudaSuccess && attr.device >= 0) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != attr.device) {
      cudaError_t err = cudaSetDevice(attr.device);
      if (err != cudaSuccess) {
        return fail(KFORGE_FMHA_ERROR_CUDA, "cudaSetDevice(%d) failed: %s", attr.device,
                    cudaGetErrorString(err));
      }
      st = check_device(&major, &minor);
      if (st != KFORGE_FMHA_SUCCESS) return st;
    }
  }
  if (s.batch == 0 || s.seqlen_q == 0) return ok();  // nothing to compute

  p.batch = s.batch;
  p.num_heads = s.num_heads;
  p.num_heads_k = s.num_heads_k;
  p.head_ratio = s.num_heads / s.num_heads_k;
  p.lpt_section = lpt_section;
  p.softmax_scale = s.softmax_scale;
  p.scale_log2 = s.softmax_scale * 1.4426950408889634f;

  if (path == kPathDefault) path = default_tma_path(s.head_dim, causal, s.seqlen_k);

  cudaError_t err;
  if (s.dtype == KFORGE_FMHA_FP16) {
    err = s.head_dim == 64 ? dispatch_causal<__half, 64>(p, causal, major, minor, path, stream)
                           : dispatch_causal<__half, 128>(p, causal, major, minor, path, stream);
  } else {
    err = s.head_dim == 64
              ? dispatch_causal<__nv_bfloat16, 64>(p, causal, major, minor, path, stream)
              : dispatch_causal<__nv_bfloat16, 128>(p, causal, major, minor, path, stream);
  }
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction ||
      err == cudaErrorUnsupportedPtxVersion) {
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "this build of kforge_fmha has no kernel for the current GPU (compute capability "
                "%d.%d); it was built for CUDA archs [%s]; rebuild with "
                "CMAKE_CUDA_ARCHITECTURES including %d%d (%s)",
                major, minor, KFORGE_FMHA_ARCHS, major, minor, cudaGetErrorString(err));
  }
  if (err != cudaSuccess) {
    return fail(KFORGE_FMHA_ERROR_CUDA, "kernel launch failed: %s (%s)", cudaGetErrorString(err),
                cudaGetErrorName(err));
  }
  return ok();
}

}  // namespace

extern "C" {

const char* kforge_fmha_version(void) { return "0.1.0"; }

const char* kforge_fmha_last_error(void) { return g_last_error.c_str(); }

const char* kforge_fmha_status_name(kforge_fmha_status status) {
  switch (status) {
    case KFORGE_FMHA_SUCCESS:
      return "KFORGE_FMHA_SUCCESS";
    case KFORGE_FMHA_ERROR_INVALID_ARGUMENT:
      return "KFORGE_FMHA_ERROR_INVALID_ARGUMENT";
    case KFORGE_FMHA_ERROR_UNSUPPORTED:
      return "KFORGE_FMHA_ERROR_UNSUPPORTED";
    case KFORGE_FMHA_ERROR_NO_DEVICE:
      return "KFORGE_FMHA_ERROR_NO_DEVICE";
    case KFORGE_FMHA_ERROR_CUDA:
      return "KFORGE_FMHA_ERROR_CUDA";
  }
  return "KFORGE_FMHA_UNKNOWN_STATUS";
}

const char* kforge_fmha_built_archs(void) { return KFORGE_FMHA_ARCHS; }

const char* kforge_fmha_last_kernel(void) { return g_last_kernel; }

kforge_fmha_status kforge_fmha_device_check(int* major, int* minor) {
  return check_device(major, minor);
}

kforge_fmha_status kforge_fmha_fwd(kforge_fmha_dtype dtype, int head_dim, const void* q,
                                   const int64_t q_stride[3], const void* k,
                                   const int64_t k_stride[3], const void* v,
                                   const int64_t v_stride[3], void* o, const int64_t o_stride[3],
                                   float* lse, const int64_t lse_stride[2], int batch,
                                   int seqlen_q, int seqlen_k, int num_heads, int num_heads_k,
                                   float softmax_scale, int causal, cudaStream_t stream) {
  const Shapes s{dtype, head_dim, batch, seqlen_q, seqlen_k, num_heads, num_heads_k, softmax_scale};
  kforge_fmha_status st = check_common(s, q, k, v, o, lse);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  const struct {
    const char* name;
    const int64_t* stride;
  } strides[] = {{"q", q_stride}, {"k", k_stride}, {"v", v_stride}, {"o", o_stride}};
  static const char* dims[] = {"batch", "row", "head"};
  for (const auto& t : strides) {
    if (t.stride == nullptr) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "%s_stride is NULL", t.name);
    }
    for (int d = 0; d < 3; ++d) {
      st = check_stride(t.name, dims[d], t.stride[d]);
      if (st != KFORGE_FMHA_SUCCESS) return st;
    }
  }
  if (lse != nullptr) {
    if (lse_stride == nullptr) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse is set but lse_stride is NULL");
    }
    if (lse_stride[0] < 0 || lse_stride[1] < 0) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse strides must be >= 0");
    }
  }
  kforge_fmha::FwdParams p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  p.q_batch_stride = q_stride[0], p.q_row_stride = q_stride[1], p.q_head_stride = q_stride[2];
  p.k_batch_stride = k_stride[0], p.k_row_stride = k_stride[1], p.k_head_stride = k_stride[2];
  p.v_batch_stride = v_stride[0], p.v_row_stride = v_stride[1], p.v_head_stride = v_stride[2];
  p.o_batch_stride = o_stride[0], p.o_row_stride = o_stride[1], p.o_head_stride = o_stride[2];
  if (lse != nullptr) p.lse_batch_stride = lse_stride[0], p.lse_head_stride = lse_stride[1];
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  return run(s, p, causal != 0, stream);
}

kforge_fmha_status kforge_fmha_varlen_fwd(
    kforge_fmha_dtype dtype, int head_dim, const void* q, const int64_t q_stride[2],
    const void* k, const int64_t k_stride[2], const void* v, const int64_t v_stride[2], void* o,
    const int64_t o_stride[2], float* lse, int64_t lse_head_stride, const int32_t* cu_seqlens_q,
    const int32_t* cu_seqlens_k, int batch, int max_seqlen_q, int max_seqlen_k, int num_heads,
    int num_heads_k, float softmax_scale, int causal, cudaStream_t stream) {
  const Shapes s{dtype,     head_dim,  batch,      max_seqlen_q, max_seqlen_k,
                 num_heads, num_heads_k, softmax_scale};
  kforge_fmha_status st = check_common(s, q, k, v, o, lse);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  const struct {
    const char* name;
    const int64_t* stride;
  } strides[] = {{"q", q_stride}, {"k", k_stride}, {"v", v_stride}, {"o", o_stride}};
  static const char* dims[] = {"row", "head"};
  for (const auto& t : strides) {
    if (t.stride == nullptr) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "%s_stride is NULL", t.name);
    }
    for (int d = 0; d < 2; ++d) {
      st = check_stride(t.name, dims[d], t.stride[d]);
      if (st != KFORGE_FMHA_SUCCESS) return st;
    }
  }
  if (cu_seqlens_q == nullptr || cu_seqlens_k == nullptr) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "cu_seqlens_q and cu_seqlens_k must both be set for a varlen call (got %s, %s)",
                cu_seqlens_q ? "set" : "NULL", cu_seqlens_k ? "set" : "NULL");
  }
  if ((reinterpret_cast<uintptr_t>(cu_seqlens_q) & 3u) || (reinterpret_cast<uintptr_t>(cu_seqlens_k) & 3u)) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "cu_seqlens arrays must be 4-byte aligned");
  }
  if (lse != nullptr && lse_head_stride < 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse_head_stride must be >= 0");
  }
  kforge_fmha::FwdParams p{};
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  p.q_row_stride = q_stride[0], p.q_head_stride = q_stride[1];
  p.k_row_stride = k_stride[0], p.k_head_stride = k_stride[1];
  p.v_row_stride = v_stride[0], p.v_head_stride = v_stride[1];
  p.o_row_stride = o_stride[0], p.o_head_stride = o_stride[1];
  p.lse_head_stride = lse_head_stride;
  p.cu_seqlens_q = cu_seqlens_q;
  p.cu_seqlens_k = cu_seqlens_k;
  p.seqlen_q = max_seqlen_q;
  p.seqlen_k = max_seqlen_k;
  return run(s, p, causal != 0, stream);
}

}  // extern "C"

// The C API: argument validation, device checks, error text and kernel dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "fmha_bwd_config.h"
#include "fmha_bwd_sm90_loads.h"
#include "fmha_params.h"
#include "fmha_paths.h"
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
  int head_dim;    // of Q and K
  int head_dim_v;  // of V and O
  int batch, seqlen_q, seqlen_k, num_heads, num_heads_k;
  float softmax_scale;
};

struct NamedPtr {
  const char* name;
  const void* ptr;
};

// The dtype and the head-dim pair: (64, 64), (128, 128), and d_qk != d_v as (192, 128) and
// (128, 192) (fmha_bwd_config.h's rows; the forward's sm_90a kernels take 64 and 128 only).
kforge_fmha_status check_dtype_dims(kforge_fmha_dtype dtype, int head_dim, int head_dim_v) {
  if (dtype != KFORGE_FMHA_FP16 && dtype != KFORGE_FMHA_BF16) {
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "dtype %d is not supported; use KFORGE_FMHA_FP16 (0) or KFORGE_FMHA_BF16 (1)",
                static_cast<int>(dtype));
  }
  if (kforge_fmha::bwd_tile(head_dim, head_dim_v) == nullptr) {
    if (head_dim == head_dim_v) {
      return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                  "head_dim %d is not supported; use 64 or 128 (or, with a head_dim_v argument, "
                  "the (head_dim_qk, head_dim_v) pairs (192, 128) and (128, 192))",
                  head_dim);
    }
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "(head_dim_qk, head_dim_v) = (%d, %d) is not supported; the supported pairs are "
                "(64, 64), (128, 128), (192, 128) and (128, 192)",
                head_dim, head_dim_v);
  }
  return KFORGE_FMHA_SUCCESS;
}

kforge_fmha_status check_common(const Shapes& s, std::initializer_list<NamedPtr> ptrs,
                                const float* lse) {
  kforge_fmha_status st = check_dtype_dims(s.dtype, s.head_dim, s.head_dim_v);
  if (st != KFORGE_FMHA_SUCCESS) return st;
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
// can compare the paths). The paths are the PATH rows of fmha_paths.def (the one table; README.md
// and kforge_fmha_path_name list them too): unset, empty or "default": the path the DEFAULT rows
// pick per shape; "wgmma": the cp.async wgmma kernel (hdim 128; hdim 64 runs the mma.sync
// kernel); the others: one (MODE, VAR) kernel of fmha_fwd_sm90_tma.cuh per head dim. A path
// whose kernel has a dynamic scheduler runs its VAR's NO_COUNTER kernel when no tile counter can
// be had (during stream capture). A TMA path runs head dims 64 and 128 with fixed-length
// batches; a call it cannot take (varlen, strides a tensor map cannot describe) runs the wgmma
// kernel (hdim 128) or the mma.sync kernel (hdim 64); kforge_fmha_last_kernel() says which ran.
// The shipped build holds only the kernels that the default rule and their fallbacks reach; a
// path asked for at a head dim and mask whose kernel the build lacks is refused (run() below).
namespace fp = kforge_fmha::paths;
constexpr int kPathDefault = fp::path_index("default");
constexpr int kPathWgmma = fp::path_index("wgmma");
constexpr int kPathInvalid = -2;

// The kernel names of kforge_fmha_last_kernel: the mode's prefix, then the VAR's suffix.
const char* tma_kernel_name(int mode, int var) {
  static const std::vector<std::string> names = [] {
    static const char* const prefix[3] = {"sm90_tma_basic", "sm90_tma_overlap", "sm90_tma"};
    std::vector<std::string> v(3 * fp::kMaxVar);
    for (int m = 0; m < 3; ++m) {
      for (int i = 0; i < fp::kNumVars; ++i) {
        v[m * fp::kMaxVar + fp::kVars[i].var] = std::string(prefix[m]) + fp::kVars[i].suffix;
      }
    }
    return v;
  }();
  if (mode < 0 || mode > 2 || var < 0 || var >= fp::kMaxVar) return "";
  return names[mode * fp::kMaxVar + var].c_str();
}

// The kernel a path runs at a head dim, when the call suits it ("" for "default": it depends on
// the shape).
const char* path_kernel_name(int path, int head_dim) {
  const fp::PathRow& row = fp::kPaths[path];
  if (path == kPathWgmma) return head_dim == 128 ? "sm90_wgmma" : "mma_sync";
  if (row.mode < 0) return "";
  return tma_kernel_name(row.mode, fp::path_var(row, head_dim));
}

// The kernel a path runs when its dynamic scheduler gets no tile counter ("" when it needs none).
const char* path_fallback_kernel_name(int path, int head_dim) {
  const fp::PathRow& row = fp::kPaths[path];
  if (row.mode < 0) return "";
  const fp::VarRow* v = fp::var_row(fp::path_var(row, head_dim));
  return v != nullptr && v->no_counter >= 0 ? tma_kernel_name(row.mode, v->no_counter) : "";
}

// "default (per shape), wgmma, tma-basic, ... or tma-dyn-fs": the error text's list.
const std::string& path_list_text() {
  static const std::string text = [] {
    std::string t;
    for (int i = 0; i < fp::kNumPaths; ++i) {
      if (i > 0) t += i + 1 == fp::kNumPaths ? " or " : ", ";
      t += fp::kPaths[i].name;
      if (i == kPathDefault) t += " (per shape)";
    }
    return t;
  }();
  return text;
}

// The default rule (the DEFAULT rows of fmha_paths.def), per shape: the fastest path of the TMA tuning runs (NVIDIA H200,
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
  return fp::default_path(head_dim, causal, seqlen_k);
}
// Every DEFAULT row's kernels are in every build (the shipped build is made of them).
static_assert(fp::path_built(fp::default_path(64, false, 1), 64, false) &&
                  fp::path_built(fp::default_path(128, true, 1 << 20), 128, true),
              "the default rule names a kernel the build leaves out");

// The kPaths index the call asks for, or kPathInvalid.
int sm90_path(const char** raw) {
  const char* e = std::getenv("KFORGE_FMHA_SM90_PATH");
  *raw = e;
  if (e == nullptr || *e == '\0') return kPathDefault;
  for (int i = 0; i < fp::kNumPaths; ++i) {
    if (std::strcmp(e, fp::kPaths[i].name) == 0) return i;
  }
  return kPathInvalid;
}

// The kernel the last successful launch on this thread ran (kforge_fmha_last_kernel).
thread_local const char* g_last_kernel = "";

// Launches TMA kernel (mode, var) if this build has it and the call suits it; false when nothing
// ran. `name_var` names it (a narrow variant reports the kernel it narrows).
template <typename T, int HDIM>
bool try_tma_kernel(bool causal, int mode, int var, int name_var, const kforge_fmha::FwdParams& p,
                    cudaStream_t stream, cudaError_t* err) {
  const kforge_fmha::TmaKernelFns k = kforge_fmha::sm90_tma_kernel<T, HDIM>(causal, mode, var);
  if (k.launch == nullptr || !k.available()) return false;
  const cudaError_t e = k.launch(p, stream);
  if (e == cudaErrorNotSupported) return false;  // nothing launched: another kernel runs
  g_last_kernel = tma_kernel_name(mode, name_var);
  *err = e;
  return true;
}

// Runs the TMA kernel of path index `path` at this head dim: first a narrow variant of it where
// one suits the call (mode 1, non-causal: every tile's first product is the same partial last key
// tile, computed only as wide as needed), then the kernel itself, then, when its dynamic
// scheduler got no counter, its NO_COUNTER kernel. False when none ran (the caller's fallback
// kernel runs).
template <typename T, int HDIM>
bool try_tma_path(int path, const kforge_fmha::FwdParams& p, bool causal, cudaStream_t stream,
                  cudaError_t* err) {
  const fp::PathRow& row = fp::kPaths[path];
  const int var = fp::path_var(row, HDIM);
  const fp::VarRow* v = fp::var_row(var);
  if (row.mode == 1 && !causal && p.seqlen_k > 0 && v != nullptr) {
    const int rem = p.seqlen_k - (p.seqlen_k - 1) / v->block_n * v->block_n;
    for (int i = 0; i < fp::kNumVars; ++i) {  // rows in order of NARROW_MAX: the first that fits
      const fp::VarRow& n = fp::kVars[i];
      if (n.narrow_of != var || rem > n.narrow_max) continue;
      if (try_tma_kernel<T, HDIM>(causal, row.mode, n.var, var, p, stream, err)) return true;
      break;
    }
  }
  if (try_tma_kernel<T, HDIM>(causal, row.mode, var, var, p, stream, err)) return true;
  if (v != nullptr && v->no_counter >= 0) {
    return try_tma_kernel<T, HDIM>(causal, row.mode, v->no_counter, v->no_counter, p, stream, err);
  }
  return false;
}

// Whether a call on this device runs the sm_90a kernels at all.
bool hopper_path(int major, int minor) {
  return major == 9 && minor == 0 && built_with_90a() && sm90_wanted();
}

// d_qk != d_v: the portable kernel only.
template <typename T, int HDIM, int HDIM_V>
cudaError_t dispatch_qkv(const kforge_fmha::FwdParams& p, bool causal, cudaStream_t stream) {
  g_last_kernel = "mma_sync";
  return causal ? kforge_fmha::launch_fwd<T, HDIM, true, HDIM_V>(p, stream)
                : kforge_fmha::launch_fwd<T, HDIM, false, HDIM_V>(p, stream);
}

template <typename T, int HDIM>
cudaError_t dispatch_causal(const kforge_fmha::FwdParams& p, bool causal, int major, int minor,
                            int path, cudaStream_t stream) {
  const bool hopper = hopper_path(major, minor);
  if (hopper && fp::kPaths[path].mode >= 0) {
    cudaError_t err = cudaSuccess;
    kforge_fmha::FwdParams pk = p;
    pk.kv_skew = fp::kPaths[path].kv_skew;
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

// The status of a launch's cudaError_t.
kforge_fmha_status launch_status(cudaError_t err, int major, int minor) {
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

template <typename T>
cudaError_t dispatch_dims(const Shapes& s, const kforge_fmha::FwdParams& p, bool causal, int major,
                          int minor, int path, cudaStream_t stream) {
  if (s.head_dim == 192) return dispatch_qkv<T, 192, 128>(p, causal, stream);
  if (s.head_dim_v == 192) return dispatch_qkv<T, 128, 192>(p, causal, stream);
  return s.head_dim == 64 ? dispatch_causal<T, 64>(p, causal, major, minor, path, stream)
                          : dispatch_causal<T, 128>(p, causal, major, minor, path, stream);
}

// Checks the driver and GPU, that every set pointer is GPU memory, and makes the device that owns
// the first pointer current. This library links its own (static) CUDA runtime, whose current
// device is not the caller's (torch.cuda.set_device does not reach it).
kforge_fmha_status use_device(std::initializer_list<NamedPtr> ptrs, int* major, int* minor) {
  kforge_fmha_status st = check_device(major, minor);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  for (const auto& p : ptrs) {
    if (p.ptr == nullptr) continue;
    st = check_device_pointer(p.name, p.ptr);
    if (st != KFORGE_FMHA_SUCCESS) return st;
  }
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptrs.begin()->ptr) == cudaSuccess && attr.device >= 0) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != attr.device) {
      cudaError_t err = cudaSetDevice(attr.device);
      if (err != cudaSuccess) {
        return fail(KFORGE_FMHA_ERROR_CUDA, "cudaSetDevice(%d) failed: %s", attr.device,
                    cudaGetErrorString(err));
      }
      st = check_device(major, minor);
      if (st != KFORGE_FMHA_SUCCESS) return st;
    }
  }
  return KFORGE_FMHA_SUCCESS;
}

kforge_fmha_status run(const Shapes& s, kforge_fmha::FwdParams& p, bool causal,
                       cudaStream_t stream) {
  // The path choice is an argument like the others: checked before any CUDA call.
  const char* path_raw = nullptr;
  int path = sm90_path(&path_raw);
  if (path == kPathInvalid) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "KFORGE_FMHA_SM90_PATH is '%s'; use %s, or unset it", path_raw,
                path_list_text().c_str());
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
  kforge_fmha_status st = use_device({{"q", p.q}, {"k", p.k}, {"v", p.v}, {"o", p.o},
                                      {"lse", p.lse}, {"cu_seqlens_q", p.cu_seqlens_q},
                                      {"cu_seqlens_k", p.cu_seqlens_k}},
                                     &major, &minor);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  if (s.batch == 0 || s.seqlen_q == 0) return ok();  // nothing to compute

  p.batch = s.batch;
  p.num_heads = s.num_heads;
  p.num_heads_k = s.num_heads_k;
  p.head_ratio = s.num_heads / s.num_heads_k;
  p.lpt_section = lpt_section;
  p.softmax_scale = s.softmax_scale;
  p.scale_log2 = s.softmax_scale * 1.4426950408889634f;

  const bool same_dims = s.head_dim == s.head_dim_v;  // else: the portable kernel, any path
  if (same_dims && path == kPathDefault) path = default_tma_path(s.head_dim, causal, s.seqlen_k);
  if (same_dims && hopper_path(major, minor) && !fp::path_built(path, s.head_dim, causal)) {
    const fp::PathRow& row = fp::kPaths[path];
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "KFORGE_FMHA_SM90_PATH is '%s': path %s is a tuning path at head dim %d, %s (its "
                "kernel %s is not one the default rule or its fallbacks run there); this library "
                "was built without KFORGE_FMHA_TUNING_PATHS, so that kernel is not in it. Unset "
                "KFORGE_FMHA_SM90_PATH to run the default path, or rebuild kforge_fmha with "
                "-DKFORGE_FMHA_TUNING_PATHS=ON (the benchmark scripts do)",
                row.name, row.name, s.head_dim, causal ? "causal" : "non-causal",
                path_kernel_name(path, s.head_dim));
  }

  const cudaError_t err =
      s.dtype == KFORGE_FMHA_FP16
          ? dispatch_dims<__half>(s, p, causal, major, minor, path, stream)
          : dispatch_dims<__nv_bfloat16>(s, p, causal, major, minor, path, stream);
  return launch_status(err, major, minor);
}



// ---- backward -------------------------------------------------------------------------------

// Which backward kernels a call asks for: KFORGE_FMHA_BWD_PATH, read at every call. Unset, empty
// or "default": the sm_90a main kernel (fmha_bwd_sm90.cuh) where bwd_sm90_fits() and the device
// runs it (compute capability 9.0, the library's sm_90a code), else the portable one;
// "portable": the mma.sync kernels of fmha_bwd_kernel.cuh (every GPU of compute capability 8.0
// and newer); "sm90": the sm_90a main kernel, and a clear error where it cannot run. The
// preprocess and convert kernels are the portable ones on every path.
enum class BwdPath { kDefault, kPortable, kSm90, kInvalid };

BwdPath bwd_path(const char** raw) {
  const char* e = std::getenv("KFORGE_FMHA_BWD_PATH");
  *raw = e;
  if (e == nullptr || *e == '\0' || std::strcmp(e, "default") == 0) return BwdPath::kDefault;
  if (std::strcmp(e, "portable") == 0) return BwdPath::kPortable;
  if (std::strcmp(e, "sm90") == 0) return BwdPath::kSm90;
  return BwdPath::kInvalid;
}

// The calls the sm_90a backward takes, whatever the device: (d_qk, d_v) = (64, 64) or (128, 128)
// and a library with sm_90a code. (The deterministic mode runs the portable kernels on every
// path, "sm90" included: the sm_90a kernel's dQ atomics add in scheduling order.) Without a
// reason (nullptr) it only answers.
bool bwd_sm90_fits(int head_dim_qk, int head_dim_v, const char** why) {
  const char* w = nullptr;
  if (!built_with_90a()) {
    w = "arch";
  } else if (head_dim_qk != head_dim_v || (head_dim_qk != 64 && head_dim_qk != 128)) {
    w = "dims";
  }
  if (why != nullptr) *why = w;
  return w == nullptr;
}

// The workspace of a backward call: the fp32 dQ accumulator, D and LSE * log2(e) for every
// (head, row), and in the deterministic mode a counter per (batch, head, query block).
kforge_fmha::BwdWorkspace bwd_workspace(int head_dim_qk, int head_dim_v, int num_heads,
                                        int64_t rows, int batch, int seqlen_q,
                                        bool deterministic) {
  const auto up = [](size_t n) { return (n + 255) & ~static_cast<size_t>(255); };
  const kforge_fmha::BwdTile* t = kforge_fmha::bwd_tile(head_dim_qk, head_dim_v);
  const size_t hr = static_cast<size_t>(num_heads) * static_cast<size_t>(rows);
  kforge_fmha::BwdWorkspace w{};
  w.dq_accum = up(hr * static_cast<size_t>(head_dim_qk) * sizeof(float));
  w.dpsum = up(hr * sizeof(float));
  w.lse_log2 = up(hr * sizeof(float));
  const size_t m_blocks = t == nullptr ? 0 : (static_cast<size_t>(seqlen_q) + t->block_m - 1) / t->block_m;
  w.semaphore = deterministic ? up(static_cast<size_t>(batch) * num_heads * m_blocks * sizeof(int)) : 0;
  w.total = w.dq_accum + w.dpsum + w.lse_log2 + w.semaphore;
  return w;
}

// The checks of a stride array: `n` strides, each >= 0 and a multiple of 8.
kforge_fmha_status check_strides(const char* name, const int64_t* stride, int n) {
  static const char* dims3[] = {"batch", "row", "head"};
  static const char* dims2[] = {"row", "head"};
  if (stride == nullptr) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "%s_stride is NULL", name);
  }
  for (int d = 0; d < n; ++d) {
    const kforge_fmha_status st = check_stride(name, n == 3 ? dims3[d] : dims2[d], stride[d]);
    if (st != KFORGE_FMHA_SUCCESS) return st;
  }
  return KFORGE_FMHA_SUCCESS;
}

// Everything about a backward call that needs no GPU: the path, the dtype and head dims, pointers
// and their alignment, sizes, scale, strides (n per tensor: 3 fixed-length, 2 varlen) and the
// caller's workspace.
struct BwdArgs {
  Shapes s;
  int64_t rows;  // workspace rows: batch * seqlen_q, or total_q
  bool deterministic;
  const void* workspace;
  size_t workspace_bytes;
};

kforge_fmha_status check_bwd(const BwdArgs& a, std::initializer_list<NamedPtr> tensors,
                             std::initializer_list<std::pair<const char*, const int64_t*>> strides,
                             int n_strides, const float* lse) {
  const char* raw = nullptr;
  const BwdPath path = bwd_path(&raw);
  if (path == BwdPath::kInvalid) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "KFORGE_FMHA_BWD_PATH is '%s'; use default (sm90 where it can run, else "
                "portable), portable (the mma.sync kernels) or sm90 (the sm_90a wgmma kernel), or "
                "unset it",
                raw);
  }
  const char* why = nullptr;
  if (path == BwdPath::kSm90 && !a.deterministic &&
      !bwd_sm90_fits(a.s.head_dim, a.s.head_dim_v, &why)) {
    if (std::strcmp(why, "arch") == 0) {
      return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                  "KFORGE_FMHA_BWD_PATH is 'sm90', but this library was built for CUDA archs "
                  "[%s], without 90a, so it has no sm_90a backward kernel; rebuild with "
                  "CMAKE_CUDA_ARCHITECTURES including 90a, or unset KFORGE_FMHA_BWD_PATH (or set "
                  "it to portable) to run the mma.sync backward",
                  KFORGE_FMHA_ARCHS);
    }
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "KFORGE_FMHA_BWD_PATH is 'sm90', but the sm_90a backward has (head_dim_qk, "
                "head_dim_v) = (64, 64) and (128, 128) only, not (%d, %d); unset "
                "KFORGE_FMHA_BWD_PATH (or set it to portable) to run the mma.sync backward, "
                "which has every supported pair",
                a.s.head_dim, a.s.head_dim_v);
  }
  kforge_fmha_status st = check_common(a.s, tensors, lse);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  if (lse == nullptr) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "lse is NULL; the backward needs the forward's log-sum-exp (pass the lse buffer "
                "the forward filled)");
  }
  for (const auto& t : strides) {
    st = check_strides(t.first, t.second, n_strides);
    if (st != KFORGE_FMHA_SUCCESS) return st;
  }
  if (a.workspace != nullptr) {
    if ((reinterpret_cast<uintptr_t>(a.workspace) & 15u) != 0) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                  "workspace is not 16-byte aligned (%p); pass memory from cudaMalloc (256-byte "
                  "aligned) or NULL to let the library allocate it",
                  a.workspace);
    }
    const kforge_fmha::BwdWorkspace w =
        bwd_workspace(a.s.head_dim, a.s.head_dim_v, a.s.num_heads, a.rows, a.s.batch,
                      a.s.seqlen_q, a.deterministic);
    if (a.workspace_bytes < w.total) {
      return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                  "workspace has %zu bytes but this call needs %zu; size it with "
                  "kforge_fmha_bwd_workspace_size (or kforge_fmha_varlen_bwd_workspace_size), or "
                  "pass NULL to let the library allocate it",
                  a.workspace_bytes, w.total);
    }
  }
  return KFORGE_FMHA_SUCCESS;
}

// The sm_90a backward of this call (bwd_sm90_fits said yes): preprocess, the wgmma main
// kernel, convert.
template <typename T>
cudaError_t dispatch_bwd_sm90(const Shapes& s, const kforge_fmha::BwdParams& p, bool causal,
                              cudaStream_t stream) {
  using namespace kforge_fmha;
  if (s.head_dim == 64) {
    return causal ? launch_bwd_sm90<T, 64, true>(p, stream) : launch_bwd_sm90<T, 64, false>(p, stream);
  }
  return causal ? launch_bwd_sm90<T, 128, true>(p, stream) : launch_bwd_sm90<T, 128, false>(p, stream);
}

// Whether this device runs the sm_90a backward's body for this dtype and head dim.
bool bwd_sm90_binary(const Shapes& s) {
  using namespace kforge_fmha;
  if (s.dtype == KFORGE_FMHA_FP16) {
    return s.head_dim == 64 ? bwd_sm90_available<__half, 64>() : bwd_sm90_available<__half, 128>();
  }
  return s.head_dim == 64 ? bwd_sm90_available<__nv_bfloat16, 64>()
                          : bwd_sm90_available<__nv_bfloat16, 128>();
}

template <typename T>
cudaError_t dispatch_bwd(const Shapes& s, const kforge_fmha::BwdParams& p, bool causal,
                         cudaStream_t stream) {
  using namespace kforge_fmha;
  if (s.head_dim == 64) {
    return causal ? launch_bwd<T, 64, 64, true>(p, stream) : launch_bwd<T, 64, 64, false>(p, stream);
  }
  if (s.head_dim == 192) {
    return causal ? launch_bwd<T, 192, 128, true>(p, stream)
                  : launch_bwd<T, 192, 128, false>(p, stream);
  }
  if (s.head_dim_v == 192) {
    return causal ? launch_bwd<T, 128, 192, true>(p, stream)
                  : launch_bwd<T, 128, 192, false>(p, stream);
  }
  return causal ? launch_bwd<T, 128, 128, true>(p, stream)
                : launch_bwd<T, 128, 128, false>(p, stream);
}

// Device checks, workspace, launch. Every argument has been checked (check_bwd).
kforge_fmha_status run_bwd(const BwdArgs& a, kforge_fmha::BwdParams& p, bool causal,
                           cudaStream_t stream) {
  const Shapes& s = a.s;
  int major = 0, minor = 0;
  kforge_fmha_status st = use_device(
      {{"q", p.q}, {"k", p.k}, {"v", p.v}, {"o", p.o}, {"dout", p.dout}, {"lse", p.lse},
       {"dq", p.dq}, {"dk", p.dk}, {"dv", p.dv}, {"cu_seqlens_q", p.cu_seqlens_q},
       {"cu_seqlens_k", p.cu_seqlens_k}, {"workspace", a.workspace}},
      &major, &minor);
  if (st != KFORGE_FMHA_SUCCESS) return st;

  // The main kernel: sm_90a where the path allows it and the device runs it (check_bwd has
  // refused an explicit "sm90" that no device could run); the deterministic mode is always the
  // portable kernel's.
  const char* raw = nullptr;
  const BwdPath path = bwd_path(&raw);
  const bool hopper = major == 9 && minor == 0;
  bool sm90 = false;
  if (a.deterministic) {
    sm90 = false;
  } else if (path == BwdPath::kSm90) {
    if (!hopper) {
      return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                  "KFORGE_FMHA_BWD_PATH is 'sm90', but the sm_90a backward needs a GPU of compute "
                  "capability 9.0 (H100, H200) and this one is %d.%d; unset KFORGE_FMHA_BWD_PATH "
                  "(or set it to portable) to run the mma.sync backward",
                  major, minor);
    }
    if (!bwd_sm90_binary(s)) {
      return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                  "KFORGE_FMHA_BWD_PATH is 'sm90', but this library's code for this GPU has no "
                  "sm_90a backward kernel (built for CUDA archs [%s]); rebuild with "
                  "CMAKE_CUDA_ARCHITECTURES including 90a, or unset KFORGE_FMHA_BWD_PATH",
                  KFORGE_FMHA_ARCHS);
    }
    sm90 = true;
  } else if (path == BwdPath::kDefault) {
    sm90 = hopper && bwd_sm90_fits(s.head_dim, s.head_dim_v, nullptr) && bwd_sm90_binary(s);
  }
  if (sm90 && kforge_fmha::bwd_sm90_loads_is("tma") &&
      (p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr || s.seqlen_q % 4 != 0)) {
    return fail(KFORGE_FMHA_ERROR_UNSUPPORTED,
                "KFORGE_FMHA_BWD_SM90_LOADS is 'tma', but the sm_90a backward's TMA-loads kernel "
                "takes fixed-length batches with seqlen_q a multiple of 4 only (this call: %s, "
                "seqlen_q %d); unset KFORGE_FMHA_BWD_SM90_LOADS to let such calls run the "
                "cp.async kernel",
                p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr ? "varlen" : "fixed-length",
                s.seqlen_q);
  }
  if (s.batch == 0) return ok();  // nothing to compute

  p.batch = s.batch;
  p.seqlen_q = s.seqlen_q;
  p.seqlen_k = s.seqlen_k;
  p.num_heads = s.num_heads;
  p.num_heads_k = s.num_heads_k;
  p.head_ratio = s.num_heads / s.num_heads_k;
  p.deterministic = a.deterministic ? 1 : 0;
  p.softmax_scale = s.softmax_scale;
  p.scale_log2 = s.softmax_scale * 1.4426950408889634f;
  p.rows = a.rows;
  const kforge_fmha::BwdTile* tile = kforge_fmha::bwd_tile(s.head_dim, s.head_dim_v);
  p.m_blocks = (s.seqlen_q + tile->block_m - 1) / tile->block_m;

  const kforge_fmha::BwdWorkspace w = bwd_workspace(s.head_dim, s.head_dim_v, s.num_heads, a.rows,
                                                    s.batch, s.seqlen_q, a.deterministic);
  void* ws = const_cast<void*>(a.workspace);
  bool owned = false;
  if (ws == nullptr && w.total > 0) {
    const cudaError_t err = cudaMallocAsync(&ws, w.total, stream);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return fail(KFORGE_FMHA_ERROR_CUDA,
                  "cudaMallocAsync of the %zu-byte backward workspace failed: %s; pass a "
                  "workspace of kforge_fmha_bwd_workspace_size bytes instead",
                  w.total, cudaGetErrorString(err));
    }
    owned = true;
  }
  char* base = static_cast<char*>(ws);
  p.dq_accum = reinterpret_cast<float*>(base);
  p.dpsum = reinterpret_cast<float*>(base + w.dq_accum);
  p.lse_log2 = reinterpret_cast<float*>(base + w.dq_accum + w.dpsum);
  p.dq_semaphore =
      a.deterministic ? reinterpret_cast<int*>(base + w.dq_accum + w.dpsum + w.lse_log2) : nullptr;

  cudaError_t err;
  if (sm90) {
    err = s.dtype == KFORGE_FMHA_FP16 ? dispatch_bwd_sm90<__half>(s, p, causal, stream)
                                      : dispatch_bwd_sm90<__nv_bfloat16>(s, p, causal, stream);
  } else {
    err = s.dtype == KFORGE_FMHA_FP16 ? dispatch_bwd<__half>(s, p, causal, stream)
                                      : dispatch_bwd<__nv_bfloat16>(s, p, causal, stream);
  }
  if (owned) cudaFreeAsync(ws, stream);  // stream-ordered: after the kernels
  st = launch_status(err, major, minor);
  if (st == KFORGE_FMHA_SUCCESS) g_last_kernel = sm90 ? "bwd_sm90_wgmma" : "bwd_mma_sync";
  return st;
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

int kforge_fmha_path_count(void) { return fp::kNumPaths; }

const char* kforge_fmha_path_name(int index) {
  return index >= 0 && index < fp::kNumPaths ? fp::kPaths[index].name : nullptr;
}

const char* kforge_fmha_path_kernel(int index, int head_dim) {
  if (index < 0 || index >= fp::kNumPaths || (head_dim != 64 && head_dim != 128)) return nullptr;
  return path_kernel_name(index, head_dim);
}

const char* kforge_fmha_path_fallback_kernel(int index, int head_dim) {
  if (index < 0 || index >= fp::kNumPaths || (head_dim != 64 && head_dim != 128)) return nullptr;
  return path_fallback_kernel_name(index, head_dim);
}

int kforge_fmha_path_built(int index, int head_dim, int causal) {
  if (index < 0 || index >= fp::kNumPaths || (head_dim != 64 && head_dim != 128)) return -1;
  return fp::path_built(index, head_dim, causal != 0) ? 1 : 0;
}

const char* kforge_fmha_default_path(int head_dim, int causal, int seqlen_k) {
  const int path = fp::default_path(head_dim, causal != 0, seqlen_k);
  return path >= 0 ? fp::kPaths[path].name : nullptr;
}

int kforge_fmha_tuning_paths(void) { return fp::kTuningPaths ? 1 : 0; }

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
  return kforge_fmha_fwd_v2(dtype, head_dim, head_dim, q, q_stride, k, k_stride, v, v_stride, o,
                            o_stride, lse, lse_stride, batch, seqlen_q, seqlen_k, num_heads,
                            num_heads_k, softmax_scale, causal, stream);
}

kforge_fmha_status kforge_fmha_fwd_v2(kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v,
                                      const void* q, const int64_t q_stride[3], const void* k,
                                      const int64_t k_stride[3], const void* v,
                                      const int64_t v_stride[3], void* o,
                                      const int64_t o_stride[3], float* lse,
                                      const int64_t lse_stride[2], int batch, int seqlen_q,
                                      int seqlen_k, int num_heads, int num_heads_k,
                                      float softmax_scale, int causal, cudaStream_t stream) {
  const Shapes s{dtype,     head_dim_qk, head_dim_v,  batch,        seqlen_q,
                 seqlen_k,  num_heads,   num_heads_k, softmax_scale};
  kforge_fmha_status st = check_common(s, {{"q", q}, {"k", k}, {"v", v}, {"o", o}}, lse);
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
  return kforge_fmha_varlen_fwd_v2(dtype, head_dim, head_dim, q, q_stride, k, k_stride, v,
                                   v_stride, o, o_stride, lse, lse_head_stride, cu_seqlens_q,
                                   cu_seqlens_k, batch, max_seqlen_q, max_seqlen_k, num_heads,
                                   num_heads_k, softmax_scale, causal, stream);
}

kforge_fmha_status kforge_fmha_varlen_fwd_v2(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v, const void* q,
    const int64_t q_stride[2], const void* k, const int64_t k_stride[2], const void* v,
    const int64_t v_stride[2], void* o, const int64_t o_stride[2], float* lse,
    int64_t lse_head_stride, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int batch,
    int max_seqlen_q, int max_seqlen_k, int num_heads, int num_heads_k, float softmax_scale,
    int causal, cudaStream_t stream) {
  const Shapes s{dtype,        head_dim_qk, head_dim_v,  batch,        max_seqlen_q,
                 max_seqlen_k, num_heads,   num_heads_k, softmax_scale};
  kforge_fmha_status st = check_common(s, {{"q", q}, {"k", k}, {"v", v}, {"o", o}}, lse);
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

kforge_fmha_status kforge_fmha_bwd_workspace_size(kforge_fmha_dtype dtype, int head_dim_qk,
                                                  int head_dim_v, int batch, int seqlen_q,
                                                  int seqlen_k, int num_heads, int num_heads_k,
                                                  int causal, int deterministic, size_t* bytes) {
  (void)seqlen_k, (void)num_heads_k, (void)causal;
  kforge_fmha_status st = check_dtype_dims(dtype, head_dim_qk, head_dim_v);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  if (bytes == nullptr) return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  if (batch < 0 || seqlen_q < 0 || num_heads < 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "batch, seqlen_q and num_heads must be >= 0 (got %d, %d, %d)", batch, seqlen_q,
                num_heads);
  }
  *bytes = bwd_workspace(head_dim_qk, head_dim_v, num_heads,
                         static_cast<int64_t>(batch) * seqlen_q, batch, seqlen_q,
                         deterministic != 0)
               .total;
  return ok();
}

kforge_fmha_status kforge_fmha_varlen_bwd_workspace_size(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v, int batch, int total_q,
    int max_seqlen_q, int max_seqlen_k, int num_heads, int num_heads_k, int causal,
    int deterministic, size_t* bytes) {
  (void)max_seqlen_k, (void)num_heads_k, (void)causal;
  kforge_fmha_status st = check_dtype_dims(dtype, head_dim_qk, head_dim_v);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  if (bytes == nullptr) return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  if (batch < 0 || total_q < 0 || max_seqlen_q < 0 || num_heads < 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "batch, total_q, max_seqlen_q and num_heads must be >= 0 (got %d, %d, %d, %d)",
                batch, total_q, max_seqlen_q, num_heads);
  }
  *bytes = bwd_workspace(head_dim_qk, head_dim_v, num_heads, total_q, batch, max_seqlen_q,
                         deterministic != 0)
               .total;
  return ok();
}

kforge_fmha_status kforge_fmha_bwd(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v, const void* q,
    const int64_t q_stride[3], const void* k, const int64_t k_stride[3], const void* v,
    const int64_t v_stride[3], const void* o, const int64_t o_stride[3], const void* dout,
    const int64_t dout_stride[3], const float* lse, const int64_t lse_stride[2], void* dq,
    const int64_t dq_stride[3], void* dk, const int64_t dk_stride[3], void* dv,
    const int64_t dv_stride[3], int batch, int seqlen_q, int seqlen_k, int num_heads,
    int num_heads_k, float softmax_scale, int causal, int deterministic, void* workspace,
    size_t workspace_bytes, cudaStream_t stream) {
  const BwdArgs a{{dtype, head_dim_qk, head_dim_v, batch, seqlen_q, seqlen_k, num_heads,
                   num_heads_k, softmax_scale},
                  static_cast<int64_t>(batch) * seqlen_q,
                  deterministic != 0,
                  workspace,
                  workspace_bytes};
  kforge_fmha_status st =
      check_bwd(a,
                {{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"dout", dout}, {"dq", dq}, {"dk", dk},
                 {"dv", dv}},
                {{"q", q_stride}, {"k", k_stride}, {"v", v_stride}, {"o", o_stride},
                 {"dout", dout_stride}, {"dq", dq_stride}, {"dk", dk_stride}, {"dv", dv_stride}},
                3, lse);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  if (lse_stride == nullptr) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse_stride is NULL");
  }
  if (lse_stride[0] < 0 || lse_stride[1] < 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse strides must be >= 0");
  }
  kforge_fmha::BwdParams p{};
  p.q = q, p.k = k, p.v = v, p.o = o, p.dout = dout, p.lse = lse;
  p.dq = dq, p.dk = dk, p.dv = dv;
  p.q_batch_stride = q_stride[0], p.q_row_stride = q_stride[1], p.q_head_stride = q_stride[2];
  p.k_batch_stride = k_stride[0], p.k_row_stride = k_stride[1], p.k_head_stride = k_stride[2];
  p.v_batch_stride = v_stride[0], p.v_row_stride = v_stride[1], p.v_head_stride = v_stride[2];
  p.o_batch_stride = o_stride[0], p.o_row_stride = o_stride[1], p.o_head_stride = o_stride[2];
  p.do_batch_stride = dout_stride[0], p.do_row_stride = dout_stride[1];
  p.do_head_stride = dout_stride[2];
  p.dq_batch_stride = dq_stride[0], p.dq_row_stride = dq_stride[1], p.dq_head_stride = dq_stride[2];
  p.dk_batch_stride = dk_stride[0], p.dk_row_stride = dk_stride[1], p.dk_head_stride = dk_stride[2];
  p.dv_batch_stride = dv_stride[0], p.dv_row_stride = dv_stride[1], p.dv_head_stride = dv_stride[2];
  p.lse_batch_stride = lse_stride[0], p.lse_head_stride = lse_stride[1];
  return run_bwd(a, p, causal != 0, stream);
}

kforge_fmha_status kforge_fmha_varlen_bwd(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v, const void* q,
    const int64_t q_stride[2], const void* k, const int64_t k_stride[2], const void* v,
    const int64_t v_stride[2], const void* o, const int64_t o_stride[2], const void* dout,
    const int64_t dout_stride[2], const float* lse, int64_t lse_head_stride, void* dq,
    const int64_t dq_stride[2], void* dk, const int64_t dk_stride[2], void* dv,
    const int64_t dv_stride[2], const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
    int batch, int total_q, int max_seqlen_q, int max_seqlen_k, int num_heads, int num_heads_k,
    float softmax_scale, int causal, int deterministic, void* workspace, size_t workspace_bytes,
    cudaStream_t stream) {
  const BwdArgs a{{dtype, head_dim_qk, head_dim_v, batch, max_seqlen_q, max_seqlen_k, num_heads,
                   num_heads_k, softmax_scale},
                  total_q,
                  deterministic != 0,
                  workspace,
                  workspace_bytes};
  if (total_q < 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "total_q is %d; it must be >= 0 (the number of rows of the packed q)", total_q);
  }
  kforge_fmha_status st =
      check_bwd(a,
                {{"q", q}, {"k", k}, {"v", v}, {"o", o}, {"dout", dout}, {"dq", dq}, {"dk", dk},
                 {"dv", dv}},
                {{"q", q_stride}, {"k", k_stride}, {"v", v_stride}, {"o", o_stride},
                 {"dout", dout_stride}, {"dq", dq_stride}, {"dk", dk_stride}, {"dv", dv_stride}},
                2, lse);
  if (st != KFORGE_FMHA_SUCCESS) return st;
  if (cu_seqlens_q == nullptr || cu_seqlens_k == nullptr) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT,
                "cu_seqlens_q and cu_seqlens_k must both be set for a varlen call (got %s, %s)",
                cu_seqlens_q ? "set" : "NULL", cu_seqlens_k ? "set" : "NULL");
  }
  if ((reinterpret_cast<uintptr_t>(cu_seqlens_q) & 3u) ||
      (reinterpret_cast<uintptr_t>(cu_seqlens_k) & 3u)) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "cu_seqlens arrays must be 4-byte aligned");
  }
  if (lse_head_stride < 0) {
    return fail(KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse_head_stride must be >= 0");
  }
  kforge_fmha::BwdParams p{};
  p.q = q, p.k = k, p.v = v, p.o = o, p.dout = dout, p.lse = lse;
  p.dq = dq, p.dk = dk, p.dv = dv;
  p.q_row_stride = q_stride[0], p.q_head_stride = q_stride[1];
  p.k_row_stride = k_stride[0], p.k_head_stride = k_stride[1];
  p.v_row_stride = v_stride[0], p.v_head_stride = v_stride[1];
  p.o_row_stride = o_stride[0], p.o_head_stride = o_stride[1];
  p.do_row_stride = dout_stride[0], p.do_head_stride = dout_stride[1];
  p.dq_row_stride = dq_stride[0], p.dq_head_stride = dq_stride[1];
  p.dk_row_stride = dk_stride[0], p.dk_head_stride = dk_stride[1];
  p.dv_row_stride = dv_stride[0], p.dv_head_stride = dv_stride[1];
  p.lse_head_stride = lse_head_stride;
  p.cu_seqlens_q = cu_seqlens_q;
  p.cu_seqlens_k = cu_seqlens_k;
  return run_bwd(a, p, causal != 0, stream);
}

}  // extern "C"

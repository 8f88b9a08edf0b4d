// C API test: every validation error comes back as a status code with a message, before any
// CUDA call, so this part runs on machines without a GPU. With a GPU it also checks that a host
// pointer is refused; without one it checks the NO_DEVICE error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "kforge_fmha.h"

static int failures = 0;

static void expect(const char* what, kforge_fmha_status got, kforge_fmha_status want,
                   const char* needle) {
  const char* msg = kforge_fmha_last_error();
  const bool ok = got == want && (needle == nullptr || std::strstr(msg, needle) != nullptr);
  std::printf("%s %-40s -> %s: %s\n", ok ? "ok  " : "FAIL", what, kforge_fmha_status_name(got), msg);
  if (!ok) {
    std::printf("     wanted %s with a message containing '%s'\n", kforge_fmha_status_name(want),
                needle ? needle : "");
    ++failures;
  }
}

int main() {
  // Fake, well-aligned addresses: validation must reject the call before touching them.
  void* q = reinterpret_cast<void*>(0x10000);
  void* k = reinterpret_cast<void*>(0x20000);
  void* v = reinterpret_cast<void*>(0x30000);
  void* o = reinterpret_cast<void*>(0x40000);
  const int64_t s3[3] = {128 * 8 * 64, 8 * 64, 64};
  const int64_t s2[2] = {8 * 64, 64};
  const int32_t* cu = reinterpret_cast<const int32_t*>(0x50000);
  const kforge_fmha_dtype bf16 = KFORGE_FMHA_BF16;

  if (std::strcmp(kforge_fmha_version(), "0.1.0") != 0) {
    std::printf("FAIL version %s\n", kforge_fmha_version());
    ++failures;
  }
  expect("head_dim 96", kforge_fmha_fwd(bf16, 96, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_UNSUPPORTED, "head_dim 96");
  expect("dtype 7", kforge_fmha_fwd(static_cast<kforge_fmha_dtype>(7), 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_UNSUPPORTED, "dtype 7");
  expect("q NULL", kforge_fmha_fwd(bf16, 64, nullptr, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "q is NULL");
  expect("k misaligned", kforge_fmha_fwd(bf16, 64, q, s3, static_cast<char*>(k) + 2, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "16-byte aligned");
  expect("GQA 8 / 3", kforge_fmha_fwd(bf16, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 3, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "not a multiple of num_heads_k");
  expect("scale 0", kforge_fmha_fwd(bf16, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.0f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "softmax_scale");
  const int64_t odd[3] = {128 * 8 * 64, 8 * 64 + 1, 64};
  expect("row stride 513", kforge_fmha_fwd(bf16, 64, q, odd, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "row stride is 513");
  expect("negative seqlen", kforge_fmha_fwd(bf16, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, -1, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "seqlen_q=-1");
  if (std::strcmp(kforge_fmha_last_kernel(), "") != 0) {
    std::printf("FAIL last_kernel before any launch is '%s', not ''\n", kforge_fmha_last_kernel());
    ++failures;
  }
#if !defined(_WIN32)
  setenv("KFORGE_FMHA_SM90_PATH", "tmaa", 1);
  expect("KFORGE_FMHA_SM90_PATH=tmaa", kforge_fmha_fwd(bf16, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "KFORGE_FMHA_SM90_PATH is 'tmaa'");
  unsetenv("KFORGE_FMHA_SM90_PATH");
  setenv("KFORGE_FMHA_LPT_SECTION", "3x", 1);
  expect("KFORGE_FMHA_LPT_SECTION=3x", kforge_fmha_fwd(bf16, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "KFORGE_FMHA_LPT_SECTION is '3x'");
  unsetenv("KFORGE_FMHA_LPT_SECTION");
#endif
  // The path list: "default" and "wgmma" first, every name found by its index, the ends NULL,
  // and the default's paths always built.
  const int n_paths = kforge_fmha_path_count();
  if (n_paths < 3 || std::strcmp(kforge_fmha_path_name(0), "default") != 0 ||
      std::strcmp(kforge_fmha_path_name(1), "wgmma") != 0 || kforge_fmha_path_name(-1) != nullptr ||
      kforge_fmha_path_name(n_paths) != nullptr) {
    std::printf("FAIL path list: count %d, first '%s'\n", n_paths,
                n_paths > 0 ? kforge_fmha_path_name(0) : "(none)");
    ++failures;
  }
  for (int hd : {64, 128}) {
    for (int causal : {0, 1}) {
      for (int sk : {1, 2048, 4096, 8192, 16384}) {
        const char* d = kforge_fmha_default_path(hd, causal, sk);
        int idx = -1;
        for (int i = 0; d != nullptr && i < n_paths; ++i) {
          if (std::strcmp(kforge_fmha_path_name(i), d) == 0) idx = i;
        }
        if (idx < 2 || kforge_fmha_path_built(idx, hd, causal) != 1 ||
            std::strncmp(kforge_fmha_path_kernel(idx, hd), "sm90_tma", 8) != 0) {
          std::printf("FAIL default path at hdim %d causal %d seqlen_k %d: '%s'\n", hd, causal, sk,
                      d ? d : "(null)");
          ++failures;
        }
      }
    }
  }
  if (kforge_fmha_default_path(96, 0, 128) != nullptr || kforge_fmha_path_built(2, 96, 0) != -1 ||
      kforge_fmha_path_kernel(n_paths, 64) != nullptr) {
    std::printf("FAIL path functions accept bad arguments\n");
    ++failures;
  }
  expect("varlen without cu_seqlens_k", kforge_fmha_varlen_fwd(bf16, 64, q, s2, k, s2, v, s2, o, s2, nullptr, 0, cu, nullptr, 2, 128, 128, 8, 8, 0.125f, 1, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "cu_seqlens_k");

  // ---- d_qk != d_v forwards and the backward: argument checks, no GPU needed ----
  expect("fwd_v2 (192, 64)", kforge_fmha_fwd_v2(bf16, 192, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_UNSUPPORTED, "(head_dim_qk, head_dim_v) = (192, 64)");
  expect("varlen_fwd_v2 (96, 96)", kforge_fmha_varlen_fwd_v2(bf16, 96, 96, q, s2, k, s2, v, s2, o, s2, nullptr, 0, cu, cu, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_UNSUPPORTED, "head_dim 96");
  expect("fwd_v2 (192, 128) GQA 8 / 3", kforge_fmha_fwd_v2(bf16, 192, 128, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 3, 0.125f, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "not a multiple of num_heads_k");

  void* dout = reinterpret_cast<void*>(0x60000);
  void* dq = reinterpret_cast<void*>(0x70000);
  void* dk = reinterpret_cast<void*>(0x80000);
  void* dv = reinterpret_cast<void*>(0x90000);
  const float* lse = reinterpret_cast<const float*>(0xa0000);
  const int64_t ls[2] = {8 * 128, 128};
  // One fixed-length backward call with a few arguments swapped for bad ones.
  struct Bwd {
    kforge_fmha_dtype dtype = KFORGE_FMHA_BF16;
    int dqk = 128, dvv = 128;
    const void* q_ = nullptr; const void* dout_ = nullptr; const float* lse_ = nullptr;
    void* dq_ = nullptr;
    const int64_t* dk_stride = nullptr;
    int heads = 8, heads_k = 8;
    float scale = 0.125f;
    int deterministic = 0;
    void* ws = nullptr;
    size_t ws_bytes = 0;
  };
  auto bwd = [&](Bwd b) {
    return kforge_fmha_bwd(b.dtype, b.dqk, b.dvv, b.q_, s3, k, s3, v, s3, o, s3, b.dout_, s3, b.lse_, ls,
                           b.dq_, s3, dk, b.dk_stride, dv, s3, 2, 128, 128, b.heads, b.heads_k, b.scale, 1,
                           b.deterministic, b.ws, b.ws_bytes, nullptr);
  };
  Bwd good;
  good.q_ = q, good.dout_ = dout, good.lse_ = lse, good.dq_ = dq, good.dk_stride = s3;
  Bwd b = good;
  b.dqk = b.dvv = 96;
  expect("bwd head_dim 96", bwd(b), KFORGE_FMHA_ERROR_UNSUPPORTED, "head_dim 96");
  b = good, b.dqk = 192, b.dvv = 192;
  expect("bwd (192, 192)", bwd(b), KFORGE_FMHA_ERROR_UNSUPPORTED, "head_dim 192");
  b = good, b.dqk = 64, b.dvv = 128;
  expect("bwd (64, 128)", bwd(b), KFORGE_FMHA_ERROR_UNSUPPORTED, "(head_dim_qk, head_dim_v) = (64, 128)");
  b = good, b.dtype = static_cast<kforge_fmha_dtype>(5);
  expect("bwd dtype 5", bwd(b), KFORGE_FMHA_ERROR_UNSUPPORTED, "dtype 5");
  b = good, b.dout_ = nullptr;
  expect("bwd dout NULL", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "dout is NULL");
  b = good, b.lse_ = nullptr;
  expect("bwd lse NULL", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "lse is NULL");
  b = good, b.dq_ = static_cast<char*>(dq) + 8;
  expect("bwd dq misaligned", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "dq is not 16-byte aligned");
  const int64_t odd_dk[3] = {128 * 8 * 128, 8 * 128, 132};
  b = good, b.dk_stride = odd_dk;
  expect("bwd dk head stride 132", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "dk: the head stride is 132");
  b = good, b.dk_stride = nullptr;
  expect("bwd dk_stride NULL", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "dk_stride is NULL");
  b = good, b.heads_k = 3;
  expect("bwd GQA 8 / 3", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "not a multiple of num_heads_k");
  b = good, b.scale = -1.f;
  expect("bwd scale -1", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "softmax_scale");
  // Workspace: the size function, then a caller's buffer that is too small or misaligned.
  size_t need = 0, need_det = 0, need_var = 0;
  expect("bwd workspace size", kforge_fmha_bwd_workspace_size(bf16, 128, 128, 2, 128, 128, 8, 8, 1, 0, &need),
         KFORGE_FMHA_SUCCESS, nullptr);
  expect("bwd workspace size, deterministic", kforge_fmha_bwd_workspace_size(bf16, 128, 128, 2, 128, 128, 8, 8, 1, 1, &need_det),
         KFORGE_FMHA_SUCCESS, nullptr);
  expect("varlen bwd workspace size", kforge_fmha_varlen_bwd_workspace_size(bf16, 192, 128, 2, 256, 128, 128, 8, 8, 0, 0, &need_var),
         KFORGE_FMHA_SUCCESS, nullptr);
  // dQ accumulator 8 heads x 256 rows x 128 floats, D and LSE 8 x 256 floats each; the
  // deterministic mode adds 2 x 8 x 4 query blocks of ints (one 256-byte aligned part).
  const size_t want = 8u * 256 * 128 * 4 + 2 * (8u * 256 * 4);
  if (need != want || need_det != want + 256 || need_var != 8u * 256 * 192 * 4 + 2 * (8u * 256 * 4)) {
    std::printf("FAIL workspace sizes %zu %zu %zu, want %zu %zu %zu\n", need, need_det, need_var, want,
                want + 256, static_cast<size_t>(8u * 256 * 192 * 4 + 2 * (8u * 256 * 4)));
    ++failures;
  }
  expect("bwd workspace size, bytes NULL", kforge_fmha_bwd_workspace_size(bf16, 128, 128, 2, 128, 128, 8, 8, 1, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  expect("bwd workspace size (96, 96)", kforge_fmha_bwd_workspace_size(bf16, 96, 96, 2, 128, 128, 8, 8, 1, 0, &need),
         KFORGE_FMHA_ERROR_UNSUPPORTED, "head_dim 96");
  b = good, b.ws = reinterpret_cast<void*>(0xb0000), b.ws_bytes = 16;
  expect("bwd workspace too small", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "workspace has 16 bytes but this call needs 1064960");
  b = good, b.ws = reinterpret_cast<void*>(0xb0004), b.ws_bytes = 1 << 24;
  expect("bwd workspace misaligned", bwd(b), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "workspace is not 16-byte aligned");
  expect("varlen bwd without cu_seqlens_q",
         kforge_fmha_varlen_bwd(bf16, 128, 128, q, s2, k, s2, v, s2, o, s2, dout, s2, lse, 256, dq, s2, dk, s2, dv, s2,
                                nullptr, cu, 2, 256, 128, 128, 8, 8, 0.125f, 0, 0, nullptr, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "cu_seqlens_q");
  expect("varlen bwd total_q -1",
         kforge_fmha_varlen_bwd(bf16, 128, 128, q, s2, k, s2, v, s2, o, s2, dout, s2, lse, 256, dq, s2, dk, s2, dv, s2,
                                cu, cu, 2, -1, 128, 128, 8, 8, 0.125f, 0, 0, nullptr, 0, nullptr),
         KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "total_q is -1");
#if !defined(_WIN32)
  setenv("KFORGE_FMHA_BWD_PATH", "sm90", 1);
  b = good, b.dqk = 192;  // the sm_90a backward has (64, 64) and (128, 128) only
  if (std::strstr(kforge_fmha_built_archs(), "90a") != nullptr) {
    expect("KFORGE_FMHA_BWD_PATH=sm90 at (192, 128)", bwd(b), KFORGE_FMHA_ERROR_UNSUPPORTED,
           "(64, 64) and (128, 128) only, not (192, 128)");
  } else {
    expect("KFORGE_FMHA_BWD_PATH=sm90 without 90a", bwd(good), KFORGE_FMHA_ERROR_UNSUPPORTED, "without 90a");
  }
  setenv("KFORGE_FMHA_BWD_PATH", "fast", 1);
  expect("KFORGE_FMHA_BWD_PATH=fast", bwd(good), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "KFORGE_FMHA_BWD_PATH is 'fast'");
  unsetenv("KFORGE_FMHA_BWD_PATH");
#endif
  if (std::strcmp(kforge_fmha_last_kernel(), "") != 0) {
    std::printf("FAIL last_kernel after refused calls is '%s', not ''\n", kforge_fmha_last_kernel());
    ++failures;
  }

  int major = 0, minor = 0;
  const kforge_fmha_status dev = kforge_fmha_device_check(&major, &minor);
  if (dev == KFORGE_FMHA_ERROR_NO_DEVICE) {
    // A well-formed call on a machine without a GPU: a clear NO_DEVICE error, no crash.
    expect("valid call, no GPU", kforge_fmha_fwd(bf16, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
           KFORGE_FMHA_ERROR_NO_DEVICE, "NVIDIA");
    expect("valid fwd_v2 (192, 128), no GPU", kforge_fmha_fwd_v2(bf16, 192, 128, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 1, nullptr),
           KFORGE_FMHA_ERROR_NO_DEVICE, "NVIDIA");
    expect("valid bwd call, no GPU", bwd(good), KFORGE_FMHA_ERROR_NO_DEVICE, "NVIDIA");
  } else if (dev == KFORGE_FMHA_SUCCESS) {
    std::printf("GPU sm_%d%d present\n", major, minor);
    static char host[4 * 128 * 8 * 64 * 2 + 64];
    void* h = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host) + 15) & ~uintptr_t(15));
    expect("host pointer", kforge_fmha_fwd(bf16, 64, h, s3, h, s3, h, s3, h, s3, nullptr, nullptr, 1, 128, 128, 8, 8, 0.125f, 0, nullptr),
           KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "host pointer");
    Bwd hb = good;
    hb.q_ = h, hb.dout_ = h, hb.lse_ = reinterpret_cast<const float*>(h), hb.dq_ = h;
    expect("bwd host pointer", bwd(hb), KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "host pointer");
  } else {
    expect("device check", dev, KFORGE_FMHA_SUCCESS, nullptr);
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}

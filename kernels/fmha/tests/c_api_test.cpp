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

  int major = 0, minor = 0;
  const kforge_fmha_status dev = kforge_fmha_device_check(&major, &minor);
  if (dev == KFORGE_FMHA_ERROR_NO_DEVICE) {
    // A well-formed call on a machine without a GPU: a clear NO_DEVICE error, no crash.
    expect("valid call, no GPU", kforge_fmha_fwd(bf16, 64, q, s3, k, s3, v, s3, o, s3, nullptr, nullptr, 2, 128, 128, 8, 8, 0.125f, 0, nullptr),
           KFORGE_FMHA_ERROR_NO_DEVICE, "NVIDIA");
  } else if (dev == KFORGE_FMHA_SUCCESS) {
    std::printf("GPU sm_%d%d present\n", major, minor);
    static char host[4 * 128 * 8 * 64 * 2 + 64];
    void* h = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host) + 15) & ~uintptr_t(15));
    expect("host pointer", kforge_fmha_fwd(bf16, 64, h, s3, h, s3, h, s3, h, s3, nullptr, nullptr, 1, 128, 128, 8, 8, 0.125f, 0, nullptr),
           KFORGE_FMHA_ERROR_INVALID_ARGUMENT, "host pointer");
  } else {
    expect("device check", dev, KFORGE_FMHA_SUCCESS, nullptr);
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}

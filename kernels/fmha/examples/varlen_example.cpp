// A varlen inference step through the C API: one packed batch that mixes a decode step
// (1 query against a 129-token KV cache), a short prefill and a longer prefill, with GQA
// (8 query heads over 2 kv heads), bf16, head_dim 128, causal. The result is checked against
// a float64 reference on the CPU.
//
// Exit codes: 0 = correct, 1 = wrong or an API error, 77 = no GPU here (ctest: skipped).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kforge_fmha.h"

#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));             \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

int main() {
  int major = 0, minor = 0;
  kforge_fmha_status st = kforge_fmha_device_check(&major, &minor);
  if (st == KFORGE_FMHA_ERROR_NO_DEVICE) {
    std::printf("skipped: %s\n", kforge_fmha_last_error());
    return 77;
  }
  if (st != KFORGE_FMHA_SUCCESS) {
    std::fprintf(stderr, "device check: %s: %s\n", kforge_fmha_status_name(st), kforge_fmha_last_error());
    return 1;
  }
  std::printf("kforge_fmha %s, built for [%s], GPU sm_%d%d\n", kforge_fmha_version(),
              kforge_fmha_built_archs(), major, minor);

  const int D = 128, H = 8, HK = 2;
  const std::vector<int> len_q = {1, 77, 300};
  const std::vector<int> len_k = {129, 77, 300};
  const int batch = static_cast<int>(len_q.size());
  std::vector<int32_t> cu_q(batch + 1, 0), cu_k(batch + 1, 0);
  int max_q = 0, max_k = 0;
  for (int b = 0; b < batch; ++b) {
    cu_q[b + 1] = cu_q[b] + len_q[b];
    cu_k[b + 1] = cu_k[b] + len_k[b];
    max_q = len_q[b] > max_q ? len_q[b] : max_q;
    max_k = len_k[b] > max_k ? len_k[b] : max_k;
  }
  const int total_q = cu_q[batch], total_k = cu_k[batch];

  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](std::vector<__nv_bfloat16>& x, std::vector<double>& xf, size_t n) {
    x.resize(n);
    xf.resize(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = __float2bfloat16(normal(rng));
      xf[i] = static_cast<double>(__bfloat162float(x[i]));
    }
  };
  std::vector<__nv_bfloat16> q, k, v;
  std::vector<double> qf, kf, vf;
  fill(q, qf, static_cast<size_t>(total_q) * H * D);
  fill(k, kf, static_cast<size_t>(total_k) * HK * D);
  fill(v, vf, static_cast<size_t>(total_k) * HK * D);

  void *dq, *dk, *dv, *dout;
  float* dlse;
  int32_t *dcu_q, *dcu_k;
  CUDA_OK(cudaMalloc(&dq, q.size() * 2));
  CUDA_OK(cudaMalloc(&dk, k.size() * 2));
  CUDA_OK(cudaMalloc(&dv, v.size() * 2));
  CUDA_OK(cudaMalloc(&dout, q.size() * 2));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dlse), static_cast<size_t>(H) * total_q * sizeof(float)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dcu_q), cu_q.size() * sizeof(int32_t)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dcu_k), cu_k.size() * sizeof(int32_t)));
  CUDA_OK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dcu_q, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dcu_k, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  const int64_t q_stride[2] = {H * D, D};
  const int64_t kv_stride[2] = {HK * D, D};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  st = kforge_fmha_varlen_fwd(KFORGE_FMHA_BF16, D, dq, q_stride, dk, kv_stride, dv, kv_stride,
                              dout, q_stride, dlse, total_q, dcu_q, dcu_k, batch, max_q, max_k, H,
                              HK, scale, /*causal=*/1, stream);
  if (st != KFORGE_FMHA_SUCCESS) {
    std::fprintf(stderr, "kforge_fmha_varlen_fwd: %s: %s\n", kforge_fmha_status_name(st),
                 kforge_fmha_last_error());
    return 1;
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<__nv_bfloat16> out(q.size());
  std::vector<float> lse(static_cast<size_t>(H) * total_q);
  CUDA_OK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost));

  // float64 reference, causal aligned to the bottom-right corner.
  double max_err = 0.0, max_lse_err = 0.0;
  std::vector<double> p;
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / HK);
      for (int i = 0; i < len_q[b]; ++i) {
        const double* qi = &qf[(static_cast<size_t>(cu_q[b] + i) * H + h) * D];
        const int last = i + len_k[b] - len_q[b];
        p.assign(len_k[b], 0.0);
        double mx = -INFINITY;
        for (int j = 0; j <= last && j < len_k[b]; ++j) {
          const double* kj = &kf[(static_cast<size_t>(cu_k[b] + j) * HK + hk) * D];
          double s = 0.0;
          for (int d = 0; d < D; ++d) s += qi[d] * kj[d];
          p[j] = s * scale;
          mx = p[j] > mx ? p[j] : mx;
        }
        double sum = 0.0;
        for (int j = 0; j <= last && j < len_k[b]; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int d = 0; d < D; ++d) {
          double o = 0.0;
          for (int j = 0; j <= last && j < len_k[b]; ++j)
            o += p[j] * vf[(static_cast<size_t>(cu_k[b] + j) * HK + hk) * D + d];
          o /= sum;
          const double got = __bfloat162float(out[(static_cast<size_t>(cu_q[b] + i) * H + h) * D + d]);
          max_err = std::fmax(max_err, std::fabs(got - o));
        }
        const double ref_lse = mx + std::log(sum);
        max_lse_err = std::fmax(max_lse_err, std::fabs(lse[static_cast<size_t>(h) * total_q + cu_q[b] + i] - ref_lse));
      }
    }
  }
  std::printf("varlen batch q=[1,77,300] k=[129,77,300], H=%d HK=%d D=%d bf16 causal: "
              "max |O - ref| = %.3g, max |lse - ref| = %.3g\n", H, HK, D, max_err, max_lse_err);
  cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse); cudaFree(dcu_q); cudaFree(dcu_k);
  cudaStreamDestroy(stream);
  if (!(max_err < 2e-2) || !(max_lse_err < 1e-3)) {
    std::fprintf(stderr, "FAILED: error above tolerance (O 2e-2, lse 1e-3)\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

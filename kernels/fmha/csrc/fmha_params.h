// Internal parameters shared by the C API (fmha_api.cpp) and the kernels.
// Not installed: the public surface is include/kforge_fmha.h.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace kforge_fmha {

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // may be null

  // Strides in elements. The head_dim stride is always 1.
  // Batch strides are ignored when the matching cu_seqlens pointer is set.
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  // LSE row stride is 1. In varlen mode the row index is the packed token index and
  // lse_batch_stride is ignored.
  int64_t lse_batch_stride, lse_head_stride;

  const int32_t* cu_seqlens_q;  // device, batch + 1 entries, or null
  const int32_t* cu_seqlens_k;  // device, batch + 1 entries, or null

  int batch;
  int seqlen_q;  // fixed length, or max_seqlen_q in varlen mode
  int seqlen_k;  // fixed length (ignored in varlen mode)
  int num_heads;
  int num_heads_k;
  int head_ratio;  // num_heads / num_heads_k
  int lpt_section;  // (batch, head) pairs per section of the TMA "lpt" order; 0: its L2 rule
  int kv_skew;      // TMA producer: 1 loads K of key tile g + 1 before V of key tile g ("-skew")

  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e)
};

// One instantiation per (element type, head dim, causal), and per head dim of V where it is not
// the head dim of Q and K (the pairs (192, 128) and (128, 192)). Defined in fmha_fwd_*.cu.
template <typename T, int HDIM, bool CAUSAL, int HDIM_V = HDIM>
cudaError_t launch_fwd(const FwdParams& params, cudaStream_t stream);

// The backward pass (fmha_bwd_kernel.cuh). Tensors as in FwdParams; do/dq/dk/dv have their own
// strides; the workspace holds the fp32 dQ accumulator, D = rowsum(dO * O) and LSE * log2(e)
// (BwdWorkspace below).
struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;  // the forward's, natural log
  void* dq;
  void* dk;
  void* dv;

  // Strides in elements; batch strides are ignored in varlen mode (cu_seqlens set).
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride;  // row stride 1; batch ignored in varlen mode

  const int32_t* cu_seqlens_q;  // device, batch + 1 entries, or null
  const int32_t* cu_seqlens_k;

  // Workspace (device, carved by the API): dq_accum [num_heads][rows][head_dim_qk] fp32,
  // dpsum (D) and lse_log2 [num_heads][rows] fp32, and for the deterministic mode one int
  // counter per (batch, head, query block). rows = batch * seqlen_q, or total_q in varlen mode;
  // a sequence's rows start at b * seqlen_q, or at cu_seqlens_q[b].
  float* dq_accum;
  float* dpsum;
  float* lse_log2;
  int* dq_semaphore;  // null unless deterministic
  int64_t rows;       // rows of the workspace arrays (per head)
  int m_blocks;       // query blocks per (batch, head) in the semaphore array

  int batch;
  int seqlen_q;  // fixed length, or max_seqlen_q in varlen mode
  int seqlen_k;  // fixed length, or max_seqlen_k in varlen mode
  int num_heads;
  int num_heads_k;
  int head_ratio;
  int deterministic;

  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e)
};

// Bytes of each workspace part, in order, each part 256-byte aligned.
struct BwdWorkspace {
  size_t dq_accum, dpsum, lse_log2, semaphore, total;
};

// One instantiation per (element type, head_dim_qk, head_dim_v, causal). Defined in
// fmha_bwd_*.cu. Launches the preprocess, main and convert kernels on `stream`.
template <typename T, int HDIM_QK, int HDIM_V, bool CAUSAL>
cudaError_t launch_bwd(const BwdParams& params, cudaStream_t stream);

// The portable preprocess and convert kernels alone (instantiated with launch_bwd), for the
// sm_90a main kernel: launch_bwd_sm90 runs preprocess, its main kernel, convert
// (fmha_bwd_sm90.cuh, (d_qk, d_v) = (64, 64) and (128, 128), not deterministic).
// bwd_sm90_available() says whether the current device runs its sm_90a body; both are defined in
// fmha_bwd_sm90_{fp16,bf16}_hdim{64,128}.cu.
template <typename T, int HDIM_QK, int HDIM_V>
cudaError_t launch_bwd_preprocess(const BwdParams& params, cudaStream_t stream);
template <typename T, int HDIM_QK, int HDIM_V>
cudaError_t launch_bwd_convert(const BwdParams& params, cudaStream_t stream);
template <typename T, int HDIM>
bool bwd_sm90_available();
template <typename T, int HDIM, bool CAUSAL>
cudaError_t launch_bwd_sm90(const BwdParams& params, cudaStream_t stream);

// The sm_90a (wgmma) kernel for head dim 128, fmha_fwd_sm90.cuh. sm90_available() says whether
// the current device runs its sm_90a body; defined in fmha_fwd_{fp16,bf16}_hdim128.cu.
template <typename T, bool CAUSAL>
bool sm90_available();
template <typename T, bool CAUSAL>
cudaError_t launch_fwd_sm90(const FwdParams& params, cudaStream_t stream);

// The sm_90a TMA + warp-specialised kernel, fmha_fwd_sm90_tma.cuh (head dims 64 and 128).
// MODE 0: no overlap, 1: intra-warpgroup overlap, 2: overlap + ping-pong. VAR: a variant
// (sm90tma::Var; the rows of fmha_paths.def). available() says whether the current device runs
// the kernel's sm_90a body; launch() returns cudaErrorNotSupported, launching nothing, for a
// call the kernel cannot take (varlen, or strides the tensor maps cannot describe).
struct TmaKernelFns {
  bool (*available)();
  cudaError_t (*launch)(const FwdParams& params, cudaStream_t stream);
};
// The TMA kernel (causal, MODE, VAR) of this element type and head dim, or {nullptr, nullptr}
// when this build does not compile it (fmha_paths.h's kernel_built). Defined in
// fmha_fwd_{fp16,bf16}_hdim{64,128}.cu.
template <typename T, int HDIM>
TmaKernelFns sm90_tma_kernel(bool causal, int mode, int var);

}  // namespace kforge_fmha

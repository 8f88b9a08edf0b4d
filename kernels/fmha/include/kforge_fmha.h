/*
 * kforge_fmha: fused multi-head attention (FlashAttention-2 style), forward and backward, as a
 * plain C API.
 *
 * Tensors live on the GPU and are described by a device pointer and strides counted in
 * ELEMENTS (not bytes). The last dimension (head_dim) must be contiguous (stride 1); every
 * other stride must be a multiple of 8 elements and every pointer 16-byte aligned.
 *
 *   fixed-length batch:  q [batch, seqlen_q, num_heads,   head_dim]
 *                        k [batch, seqlen_k, num_heads_k, head_dim]   (v likewise)
 *                        o [batch, seqlen_q, num_heads,   head_dim]
 *                        lse [batch, num_heads, seqlen_q] float32 (optional)
 *   packed varlen batch: q [total_q, num_heads, head_dim], k/v [total_k, num_heads_k, head_dim],
 *                        sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1,
 *                        lse [num_heads, total_q] float32 (optional)
 *
 * num_heads_k must divide num_heads (GQA/MQA: query head h reads kv head h / (num_heads /
 * num_heads_k)). The causal mask is aligned to the bottom-right corner: query i sees key j
 * when j <= i + seqlen_k - seqlen_q (the usual rule for decoding with a KV cache; it is the
 * plain lower triangle when seqlen_q == seqlen_k). A query row that sees no key gets O = 0 and
 * lse = -inf. The softmax scale must be finite and > 0 (pass 1/sqrt(head_dim) for the usual one).
 *
 * Head dims: head_dim 64 or 128 (q, k, v and o alike); the _v2 forwards and the backward take
 * (head_dim_qk, head_dim_v) in {(64, 64), (128, 128), (192, 128), (128, 192)}: q and k have
 * head_dim_qk, v and o head_dim_v (d_qk != d_v runs the portable mma.sync kernels on every GPU).
 *
 * Every function returns a kforge_fmha_status; on failure kforge_fmha_last_error() returns a
 * message for the calling thread. Kernels are launched asynchronously on `stream`; launch
 * errors are reported, errors during execution surface at the next synchronisation.
 */
#ifndef KFORGE_FMHA_H_
#define KFORGE_FMHA_H_

#include <stddef.h>
#include <stdint.h>

#if !defined(__DRIVER_TYPES_H__)
/* Same definition as CUDA's driver_types.h, so this header needs no CUDA include path. */
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
#endif

#if defined(_WIN32)
#define KFORGE_FMHA_API __declspec(dllexport)
#else
#define KFORGE_FMHA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KFORGE_FMHA_VERSION_MAJOR 0
#define KFORGE_FMHA_VERSION_MINOR 1
#define KFORGE_FMHA_VERSION_PATCH 0

typedef enum kforge_fmha_status {
  KFORGE_FMHA_SUCCESS = 0,
  KFORGE_FMHA_ERROR_INVALID_ARGUMENT = 1, /* bad pointer, shape, stride, scale, ... */
  KFORGE_FMHA_ERROR_UNSUPPORTED = 2,      /* valid request this build cannot serve (dtype, head_dim, GPU arch) */
  KFORGE_FMHA_ERROR_NO_DEVICE = 3,        /* no CUDA driver or no CUDA GPU */
  KFORGE_FMHA_ERROR_CUDA = 4              /* any other CUDA runtime error */
} kforge_fmha_status;

typedef enum kforge_fmha_dtype {
  KFORGE_FMHA_FP16 = 0,
  KFORGE_FMHA_BF16 = 1
} kforge_fmha_dtype;

/* "0.1.0" */
KFORGE_FMHA_API const char* kforge_fmha_version(void);

/* Message for the last failed call on this thread ("" when none). Valid until the next call. */
KFORGE_FMHA_API const char* kforge_fmha_last_error(void);

/* Name of a status code, e.g. "KFORGE_FMHA_ERROR_INVALID_ARGUMENT". */
KFORGE_FMHA_API const char* kforge_fmha_status_name(kforge_fmha_status status);

/* Compute capabilities this library has kernels for, e.g. "80;90a". */
KFORGE_FMHA_API const char* kforge_fmha_built_archs(void);

/* Name of the kernel that the last successful call on this thread launched ("" before any). The
 * backward (kforge_fmha_bwd / kforge_fmha_varlen_bwd) reports "bwd_sm90_wgmma" (the sm_90a main
 * kernel) or "bwd_mma_sync" (the portable one). KFORGE_FMHA_BWD_PATH, read at every call:
 * "portable" runs the portable kernels; "sm90" the sm_90a one, at (head_dim_qk, head_dim_v) =
 * (64, 64) and (128, 128) on a GPU of compute capability 9.0 with a 90a build, else
 * KFORGE_FMHA_ERROR_UNSUPPORTED; unset or "default" the sm_90a kernel where "sm90" would run it,
 * else the portable one. deterministic != 0 runs the portable kernels on every path. The sm_90a
 * backward has two main kernels, both reported as "bwd_sm90_wgmma": TMA loads for fixed-length
 * calls with seqlen_q % 4 == 0, cp.async loads for the others; KFORGE_FMHA_BWD_SM90_LOADS, read at
 * every call: "cpasync" runs the cp.async kernel everywhere, "tma" makes a call the TMA-loads
 * kernel cannot take fail with KFORGE_FMHA_ERROR_UNSUPPORTED instead of falling back. The forwards
 * report "mma_sync" (portable), "sm90_wgmma" (sm_90a, hdim 128) or
 * one of the TMA kernels of sm_90a ("sm90_tma_overlap_dyn_fs", ...; kforge_fmha_path_kernel).
 * On compute capability 9.0 with a 90a build, the environment variable KFORGE_FMHA_SM90_PATH,
 * read at every call, picks the path (unset: "default", one path per shape). A call that a TMA
 * path cannot take (varlen batches, strides a TMA tensor map cannot describe) runs the wgmma
 * kernel (hdim 128) or mma_sync (hdim 64), and this names it. */
KFORGE_FMHA_API const char* kforge_fmha_last_kernel(void);

/* The sm_90a paths, the values of KFORGE_FMHA_SM90_PATH: index 0 .. count - 1, "default" first,
 * then "wgmma", then the TMA paths (csrc/fmha_paths.def, the one table). */
KFORGE_FMHA_API int kforge_fmha_path_count(void);
/* The name of path `index`, or NULL when index is out of range. */
KFORGE_FMHA_API const char* kforge_fmha_path_name(int index);
/* The kernel (as kforge_fmha_last_kernel names it) path `index` runs at head_dim (64 or 128) on
 * an sm_90a GPU for a call it can take; "" for "default" (it depends on the shape); NULL for a
 * bad index or head dim. */
KFORGE_FMHA_API const char* kforge_fmha_path_kernel(int index, int head_dim);
/* The kernel the path runs when its dynamic tile scheduler gets no counter (inside a CUDA graph
 * capture); "" when the path has no dynamic scheduler; NULL for bad arguments. */
KFORGE_FMHA_API const char* kforge_fmha_path_fallback_kernel(int index, int head_dim);
/* 1 when this library holds the kernels path `index` runs at head_dim and this mask, 0 when
 * they are tuning kernels it was built without (KFORGE_FMHA_TUNING_PATHS off, as in the wheel:
 * asking for them gives KFORGE_FMHA_ERROR_UNSUPPORTED), -1 for bad arguments. */
KFORGE_FMHA_API int kforge_fmha_path_built(int index, int head_dim, int causal);
/* The path the default picks for a fixed-length call of this head dim, mask and seqlen_k, or
 * NULL for a head dim other than 64 and 128. */
KFORGE_FMHA_API const char* kforge_fmha_default_path(int head_dim, int causal, int seqlen_k);
/* 1 when this library was built with KFORGE_FMHA_TUNING_PATHS (every path's kernels), else 0. */
KFORGE_FMHA_API int kforge_fmha_tuning_paths(void);

/* Checks that a CUDA driver and a GPU are present and that the current device can run the
 * kernels; *major / *minor receive its compute capability (either may be NULL). */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_device_check(int* major, int* minor);

/* Fixed-length batch. Strides: {batch, row (sequence position), head}. lse may be NULL;
 * lse_stride = {batch, head}, its row stride is 1. */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_fwd(
    kforge_fmha_dtype dtype, int head_dim,
    const void* q, const int64_t q_stride[3],
    const void* k, const int64_t k_stride[3],
    const void* v, const int64_t v_stride[3],
    void* o, const int64_t o_stride[3],
    float* lse, const int64_t lse_stride[2],
    int batch, int seqlen_q, int seqlen_k, int num_heads, int num_heads_k,
    float softmax_scale, int causal, cudaStream_t stream);

/* Packed variable-length batch. Strides: {row (packed token), head}. cu_seqlens_q/k are
 * DEVICE arrays of batch + 1 int32 prefix sums starting at 0. max_seqlen_q must be >= every
 * query length (it sizes the grid); max_seqlen_k is only checked for sanity. lse may be NULL;
 * lse_head_stride is its head stride and its token stride is 1. */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_varlen_fwd(
    kforge_fmha_dtype dtype, int head_dim,
    const void* q, const int64_t q_stride[2],
    const void* k, const int64_t k_stride[2],
    const void* v, const int64_t v_stride[2],
    void* o, const int64_t o_stride[2],
    float* lse, int64_t lse_head_stride,
    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
    int batch, int max_seqlen_q, int max_seqlen_k, int num_heads, int num_heads_k,
    float softmax_scale, int causal, cudaStream_t stream);

/* kforge_fmha_fwd with v and o of their own head dim: q/k [.., head_dim_qk], v/o [.., head_dim_v].
 * kforge_fmha_fwd(dtype, d, ...) is kforge_fmha_fwd_v2(dtype, d, d, ...). */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_fwd_v2(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v,
    const void* q, const int64_t q_stride[3],
    const void* k, const int64_t k_stride[3],
    const void* v, const int64_t v_stride[3],
    void* o, const int64_t o_stride[3],
    float* lse, const int64_t lse_stride[2],
    int batch, int seqlen_q, int seqlen_k, int num_heads, int num_heads_k,
    float softmax_scale, int causal, cudaStream_t stream);

/* kforge_fmha_varlen_fwd with v and o of their own head dim. */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_varlen_fwd_v2(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v,
    const void* q, const int64_t q_stride[2],
    const void* k, const int64_t k_stride[2],
    const void* v, const int64_t v_stride[2],
    void* o, const int64_t o_stride[2],
    float* lse, int64_t lse_head_stride,
    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
    int batch, int max_seqlen_q, int max_seqlen_k, int num_heads, int num_heads_k,
    float softmax_scale, int causal, cudaStream_t stream);

/*
 * Backward pass: dq, dk, dv from q, k, v, the forward's o and lse, and dout (the gradient of o).
 * Shapes, strides and conventions as in the forward; dq is like q, dk like k, dv like v, dout
 * like o, each with its own strides (multiples of 8 elements, head_dim contiguous, 16-byte
 * aligned pointers). lse is the forward's [batch, num_heads, seqlen_q] (varlen: [num_heads,
 * total_q]) float32, natural log. With GQA/MQA, dk and dv of a kv head are the sums over the
 * query heads of its group. The same causal (bottom-right aligned) mask and softmax_scale as
 * the forward must be passed.
 *
 * dq is accumulated over key blocks in fp32 with atomic adds, whose order depends on scheduling:
 * bit-for-bit reproducible only with deterministic != 0 (key blocks then add in a fixed order,
 * waiting on counters in the workspace; slower; always the portable mma.sync kernels, also where
 * the sm_90a backward would run: kforge_fmha_last_kernel). dk and dv are always deterministic.
 *
 * workspace: device memory of at least kforge_fmha_bwd_workspace_size (or
 * kforge_fmha_varlen_bwd_workspace_size) bytes, 16-byte aligned, not used by anything else
 * until the kernels have run; or NULL, and the library allocates it with cudaMallocAsync on
 * `stream` and frees it with cudaFreeAsync after the kernels (stream-ordered). It holds the fp32
 * dQ accumulator (num_heads * rows * head_dim_qk floats), D = rowsum(dout * o) and the LSE in
 * base 2 (num_heads * rows floats each), rows = batch * seqlen_q or total_q, plus one int per
 * (batch, head, query block) when deterministic.
 */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_bwd_workspace_size(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v,
    int batch, int seqlen_q, int seqlen_k, int num_heads, int num_heads_k,
    int causal, int deterministic, size_t* bytes);

KFORGE_FMHA_API kforge_fmha_status kforge_fmha_varlen_bwd_workspace_size(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v,
    int batch, int total_q, int max_seqlen_q, int max_seqlen_k, int num_heads, int num_heads_k,
    int causal, int deterministic, size_t* bytes);

/* Fixed-length batch. Strides {batch, row, head}; lse_stride {batch, head} (row stride 1). */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_bwd(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v,
    const void* q, const int64_t q_stride[3],
    const void* k, const int64_t k_stride[3],
    const void* v, const int64_t v_stride[3],
    const void* o, const int64_t o_stride[3],
    const void* dout, const int64_t dout_stride[3],
    const float* lse, const int64_t lse_stride[2],
    void* dq, const int64_t dq_stride[3],
    void* dk, const int64_t dk_stride[3],
    void* dv, const int64_t dv_stride[3],
    int batch, int seqlen_q, int seqlen_k, int num_heads, int num_heads_k,
    float softmax_scale, int causal, int deterministic,
    void* workspace, size_t workspace_bytes, cudaStream_t stream);

/* Packed variable-length batch. Strides {row, head}; lse_head_stride as in the forward. total_q
 * is the number of rows of q (and of o, dout, dq): it sizes the workspace. max_seqlen_q and
 * max_seqlen_k must be >= every query and key length (they size the grids: rows or keys past
 * them are not computed). cu_seqlens are DEVICE arrays of batch + 1 int32 prefix sums; the
 * kernels clamp a sequence to total_q rather than read or write out of bounds. */
KFORGE_FMHA_API kforge_fmha_status kforge_fmha_varlen_bwd(
    kforge_fmha_dtype dtype, int head_dim_qk, int head_dim_v,
    const void* q, const int64_t q_stride[2],
    const void* k, const int64_t k_stride[2],
    const void* v, const int64_t v_stride[2],
    const void* o, const int64_t o_stride[2],
    const void* dout, const int64_t dout_stride[2],
    const float* lse, int64_t lse_head_stride,
    void* dq, const int64_t dq_stride[2],
    void* dk, const int64_t dk_stride[2],
    void* dv, const int64_t dv_stride[2],
    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
    int batch, int total_q, int max_seqlen_q, int max_seqlen_k, int num_heads, int num_heads_k,
    float softmax_scale, int causal, int deterministic,
    void* workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KFORGE_FMHA_H_ */

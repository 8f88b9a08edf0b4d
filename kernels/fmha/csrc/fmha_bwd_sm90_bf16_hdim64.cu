// sm_90a backward main kernel for bf16, (head_dim_qk, head_dim_v) = (64, 64) (causal and
// non-causal); the preprocess and convert kernels come from fmha_bwd_bf16_hdim64.cu.
#include "fmha_bwd_sm90.cuh"

KFORGE_FMHA_INSTANTIATE_BWD_SM90(__nv_bfloat16, 64)

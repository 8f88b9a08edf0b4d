// sm_90a backward main kernel for fp16, (head_dim_qk, head_dim_v) = (128, 128) (causal and
// non-causal); the preprocess and convert kernels come from fmha_bwd_fp16_hdim128.cu.
#include "fmha_bwd_sm90.cuh"

KFORGE_FMHA_INSTANTIATE_BWD_SM90(__half, 128)

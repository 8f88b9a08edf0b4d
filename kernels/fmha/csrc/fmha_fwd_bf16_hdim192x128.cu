// Forward instantiations for bf16, (head_dim_qk, head_dim_v) = (192, 128) (causal and
// non-causal): the portable kernel, the only one for d_qk != d_v.
#include "fmha_fwd_kernel.cuh"

KFORGE_FMHA_INSTANTIATE_QKV(__nv_bfloat16, 192, 128)

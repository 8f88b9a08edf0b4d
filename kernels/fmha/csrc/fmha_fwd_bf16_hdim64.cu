// Instantiations for bf16, head dim 64 (causal and non-causal). One file per pair keeps
// the build parallel and each compile unit small.
#include "fmha_fwd_kernel.cuh"
#include "fmha_fwd_sm90_tma.cuh"

KFORGE_FMHA_INSTANTIATE(__nv_bfloat16, 64)
KFORGE_FMHA_INSTANTIATE_SM90_TMA(__nv_bfloat16, 64)

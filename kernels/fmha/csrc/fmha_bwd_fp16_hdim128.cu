// Backward instantiations for fp16, (head_dim_qk, head_dim_v) = (128, 128) (causal and
// non-causal). One file per pair keeps the build parallel and each compile unit small.
#include "fmha_bwd_kernel.cuh"

KFORGE_FMHA_INSTANTIATE_BWD(__half, 128, 128)

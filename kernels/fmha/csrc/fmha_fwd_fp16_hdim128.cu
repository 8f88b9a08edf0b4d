// Instantiations for fp16, head dim 128 (causal and non-causal). One file per pair keeps
// the build parallel and each compile unit small.
#include "fmha_fwd_kernel.cuh"

KFORGE_FMHA_INSTANTIATE(__half, 128)

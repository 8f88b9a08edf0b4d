// KFORGE_FMHA_BWD_SM90_LOADS, read at every call (A/B runs and tests), by the C API
// (fmha_api.cpp) and the sm_90a backward's launcher (fmha_bwd_sm90_tl.cuh) alike:
//   "cpasync": the cp.async kernel (fmha_bwd_sm90.cuh) where the TMA-loads kernel would run;
//   "tma":     a call the TMA-loads kernel cannot take fails instead of falling back
//              (fmha_api.cpp refuses varlen and seqlen_q % 4 != 0 with a message).
// Plain C++17, so that the host compiler and nvcc read the same rule.
#pragma once

#include <cstdlib>
#include <cstring>

namespace kforge_fmha {

inline bool bwd_sm90_loads_is(const char* want) {
  const char* v = std::getenv("KFORGE_FMHA_BWD_SM90_LOADS");
  return v != nullptr && std::strcmp(v, want) == 0;
}

}  // namespace kforge_fmha

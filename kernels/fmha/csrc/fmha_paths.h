// The path table of fmha_paths.def as constexpr arrays, and the one rule that decides which TMA
// kernels a build compiles (kernel_built). Plain C++17: read by the host compiler
// (fmha_api.cpp) and by nvcc (fmha_fwd_sm90_tma.cuh) alike, so both sides agree by construction.
#pragma once

namespace kforge_fmha {
namespace paths {

#ifdef KFORGE_FMHA_TUNING_PATHS
inline constexpr bool kTuningPaths = true;
#else
inline constexpr bool kTuningPaths = false;
#endif

struct VarRow {
  int var;
  const char* suffix;
  int block_n;
  int no_counter;  // VAR run without a tile counter, or -1
  int narrow_of;   // the VAR this one narrows, or -1
  int narrow_max;  // widest last key tile it takes
};
struct PathRow {
  const char* name;
  int mode;  // -1: "default" / "wgmma"
  int var64, var128;
  int kv_skew;
  const char* summary;
};
struct DefaultRow {
  int head_dim;
  bool causal;
  int max_seqlen_k;  // 0: no limit
  const char* path;
};

inline constexpr VarRow kVars[] = {
#define KFORGE_FMHA_VAR(VAR, SUFFIX, BLOCK_N, NO_COUNTER, NARROW_OF, NARROW_MAX) \
  {VAR, SUFFIX, BLOCK_N, NO_COUNTER, NARROW_OF, NARROW_MAX},
#include "fmha_paths.def"
};
inline constexpr PathRow kPaths[] = {
#define KFORGE_FMHA_PATH(NAME, MODE, VAR64, VAR128, KV_SKEW, SUMMARY) \
  {NAME, MODE, VAR64, VAR128, KV_SKEW, SUMMARY},
#include "fmha_paths.def"
};
inline constexpr DefaultRow kDefaults[] = {
#define KFORGE_FMHA_DEFAULT(HEAD_DIM, CAUSAL, MAX_SEQLEN_K, PATH) \
  {HEAD_DIM, CAUSAL != 0, MAX_SEQLEN_K, PATH},
#include "fmha_paths.def"
};
inline constexpr int kNumVars = sizeof(kVars) / sizeof(kVars[0]);
inline constexpr int kNumPaths = sizeof(kPaths) / sizeof(kPaths[0]);
inline constexpr int kNumDefaults = sizeof(kDefaults) / sizeof(kDefaults[0]);
inline constexpr int kMaxVar = 16;  // VAR < kMaxVar (sm90tma::Var)

constexpr bool same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// kPaths index of a name, or -1.
constexpr int path_index(const char* name) {
  for (int i = 0; i < kNumPaths; ++i) {
    if (same(kPaths[i].name, name)) return i;
  }
  return -1;
}

// kVars row of a VAR, or nullptr.
constexpr const VarRow* var_row(int var) {
  for (int i = 0; i < kNumVars; ++i) {
    if (kVars[i].var == var) return &kVars[i];
  }
  return nullptr;
}

constexpr int path_var(const PathRow& p, int head_dim) { return head_dim == 64 ? p.var64 : p.var128; }

// The kPaths index the default rule picks for a fixed-length call, or -1 (no row: a head dim
// other than 64 and 128).
constexpr int default_path(int head_dim, bool causal, int seqlen_k) {
  for (int i = 0; i < kNumDefaults; ++i) {
    const DefaultRow& d = kDefaults[i];
    if (d.head_dim == head_dim && d.causal == causal &&
        (d.max_seqlen_k == 0 || seqlen_k <= d.max_seqlen_k)) {
      return path_index(d.path);
    }
  }
  return -1;
}

// Whether asking for TMA kernel (mode, var) may launch kernel (mode, kvar): itself, the kernel
// of its no-counter fallback, or (mode 1, non-causal) a narrow variant of it.
constexpr bool may_launch(int mode, int var, bool causal, int kmode, int kvar) {
  if (kmode != mode) return false;
  if (kvar == var) return true;
  const VarRow* r = var_row(var);
  if (r != nullptr && r->no_counter >= 0 && r->no_counter == kvar) return true;
  const VarRow* k = var_row(kvar);
  return mode == 1 && !causal && k != nullptr && k->narrow_of == var;
}

// Whether the default rule names path index `path` for some call of this head dim and mask.
constexpr bool default_reaches(int path, int head_dim, bool causal) {
  for (int i = 0; i < kNumDefaults; ++i) {
    const DefaultRow& d = kDefaults[i];
    if (d.head_dim == head_dim && d.causal == causal && path_index(d.path) == path) return true;
  }
  return false;
}

// The rule of the build: does it compile TMA kernel (mode, var) at this head dim and mask? The
// shipped build: a kernel the default rule's paths may launch; with KFORGE_FMHA_TUNING_PATHS:
// a kernel any path may launch.
constexpr bool kernel_built(int head_dim, bool causal, int mode, int var, bool tuning = kTuningPaths) {
  for (int i = 0; i < kNumPaths; ++i) {
    const PathRow& p = kPaths[i];
    if (p.mode < 0) continue;
    if (!tuning && !default_reaches(i, head_dim, causal)) continue;
    if (may_launch(p.mode, path_var(p, head_dim), causal, mode, var)) return true;
  }
  return false;
}

// Whether path index `path` can run at this head dim and mask in this build ("default" and
// "wgmma" always can).
constexpr bool path_built(int path, int head_dim, bool causal) {
  const PathRow& p = kPaths[path];
  return p.mode < 0 || kernel_built(head_dim, causal, p.mode, path_var(p, head_dim));
}

// Checks of the table itself, at compile time.
constexpr bool table_is_consistent() {
  for (int i = 0; i < kNumDefaults; ++i) {
    const int p = path_index(kDefaults[i].path);
    if (p < 0 || kPaths[p].mode < 0) return false;  // a DEFAULT row names a TMA path
  }
  for (int i = 0; i < kNumPaths; ++i) {
    for (int j = 0; j < i; ++j) {
      if (same(kPaths[i].name, kPaths[j].name)) return false;  // names are unique
    }
    if (kPaths[i].mode >= 0 &&
        (var_row(kPaths[i].var64) == nullptr || var_row(kPaths[i].var128) == nullptr)) {
      return false;  // every path's VAR has a row
    }
  }
  for (int i = 0; i < kNumVars; ++i) {
    if (kVars[i].var < 0 || kVars[i].var >= kMaxVar) return false;
  }
  return true;
}
static_assert(table_is_consistent(), "fmha_paths.def: a DEFAULT row names no TMA path, a path "
                                     "name repeats, or a path names a VAR without a row");
static_assert(path_index("default") == 0 && path_index("wgmma") == 1,
              "fmha_paths.def: \"default\" and \"wgmma\" come first");

}  // namespace paths
}  // namespace kforge_fmha

"""The sm_90a paths (values of KFORGE_FMHA_SM90_PATH), read from the C library at run time: its
table (csrc/fmha_paths.def) is the only list of them."""

from __future__ import annotations

import ctypes

from . import _lib
from ._lib import FmhaArgumentError, FmhaError

_FUNCS = {
    "kforge_fmha_path_count": (ctypes.c_int, []),
    "kforge_fmha_path_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kforge_fmha_path_kernel": (ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]),
    "kforge_fmha_path_fallback_kernel": (ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]),
    "kforge_fmha_path_built": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    "kforge_fmha_default_path": (ctypes.c_char_p, [ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    "kforge_fmha_tuning_paths": (ctypes.c_int, []),
}


def _fn(name: str):
    lib = _lib.library()
    fn = getattr(lib, name, None)
    if fn is None:
        raise FmhaError(f"kforge_fmha: the loaded library {_lib.library_path()} predates {name}(); "
                        "rebuild or reinstall kforge-fmha")
    fn.restype, fn.argtypes = _FUNCS[name]
    return fn


def sm90_paths() -> list[str]:
    """Every value KFORGE_FMHA_SM90_PATH takes: "default", "wgmma", then the TMA paths."""
    name = _fn("kforge_fmha_path_name")
    return [name(i).decode() for i in range(_fn("kforge_fmha_path_count")())]


def _index(path: str) -> int:
    paths = sm90_paths()
    if path not in paths:
        raise FmhaArgumentError(f"kforge_fmha: {path!r} is not an sm_90a path; the paths are "
                                f"{', '.join(paths)}")
    return paths.index(path)


def _head_dim(head_dim: int) -> int:
    if head_dim not in (64, 128):
        raise FmhaArgumentError(f"kforge_fmha: head_dim {head_dim}: the paths exist at 64 and 128")
    return head_dim


def path_kernel(path: str, head_dim: int) -> str:
    """The kernel (as last_kernel() names it) `path` runs at `head_dim` on an sm_90a GPU for a
    call it can take; "" for "default", which picks a path per shape (default_path)."""
    return _fn("kforge_fmha_path_kernel")(_index(path), _head_dim(head_dim)).decode()


def path_fallback_kernel(path: str, head_dim: int) -> str:
    """The kernel `path` runs when its dynamic tile scheduler gets no counter (in a CUDA graph
    capture); "" for a path without a dynamic scheduler."""
    return _fn("kforge_fmha_path_fallback_kernel")(_index(path), _head_dim(head_dim)).decode()


def path_built(path: str, head_dim: int, causal: bool) -> bool:
    """Whether this library holds the kernels `path` runs at `head_dim` with this mask. The wheel
    holds only what the default rule and its fallbacks reach; the other paths' kernels are tuning
    kernels, compiled with the CMake option KFORGE_FMHA_TUNING_PATHS=ON."""
    return _fn("kforge_fmha_path_built")(_index(path), _head_dim(head_dim), int(causal)) == 1


def default_path(head_dim: int, causal: bool, seqlen_k: int) -> str:
    """The path the default picks for a fixed-length call of this shape."""
    return _fn("kforge_fmha_default_path")(_head_dim(head_dim), int(causal), int(seqlen_k)).decode()


def tuning_paths_built() -> bool:
    """Whether this library was built with KFORGE_FMHA_TUNING_PATHS (every path's kernels)."""
    return _fn("kforge_fmha_tuning_paths")() == 1

"""Loading libkforge_fmha.so through ctypes, and turning its status codes into exceptions."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

__all__ = [
    "FmhaError",
    "FmhaArgumentError",
    "FmhaUnsupportedError",
    "FmhaNoDeviceError",
    "FmhaCudaError",
    "library",
    "library_path",
    "check",
]

LIBRARY_ENV = "KFORGE_FMHA_LIBRARY"
_LIB_NAME = "libkforge_fmha.so"


class FmhaError(RuntimeError):
    """Base class of every error kforge_fmha raises."""


class FmhaArgumentError(FmhaError, ValueError):
    """An argument has the wrong dtype, shape, device, stride or value."""


class FmhaUnsupportedError(FmhaError):
    """A valid request this build cannot serve (dtype, head_dim, GPU architecture)."""


class FmhaNoDeviceError(FmhaError):
    """No CUDA driver or no CUDA GPU is available."""


class FmhaCudaError(FmhaError):
    """The CUDA runtime reported an error."""


_STATUS_ERRORS = {
    1: FmhaArgumentError,
    2: FmhaUnsupportedError,
    3: FmhaNoDeviceError,
    4: FmhaCudaError,
}

_i64p = ctypes.POINTER(ctypes.c_int64)
_FWD_ARGTYPES = [
    ctypes.c_int, ctypes.c_int,  # dtype, head_dim
    ctypes.c_void_p, _i64p,  # q
    ctypes.c_void_p, _i64p,  # k
    ctypes.c_void_p, _i64p,  # v
    ctypes.c_void_p, _i64p,  # o
    ctypes.c_void_p, _i64p,  # lse
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ctypes.c_float, ctypes.c_int, ctypes.c_void_p,
]
_VARLEN_ARGTYPES = [
    ctypes.c_int, ctypes.c_int,
    ctypes.c_void_p, _i64p,
    ctypes.c_void_p, _i64p,
    ctypes.c_void_p, _i64p,
    ctypes.c_void_p, _i64p,
    ctypes.c_void_p, ctypes.c_int64,  # lse, lse_head_stride
    ctypes.c_void_p, ctypes.c_void_p,  # cu_seqlens_q, cu_seqlens_k
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ctypes.c_float, ctypes.c_int, ctypes.c_void_p,
]

# The _v2 forwards: (dtype, head_dim_qk, head_dim_v, ...) then the forward's arguments.
_FWD_V2_ARGTYPES = _FWD_ARGTYPES[:2] + [ctypes.c_int] + _FWD_ARGTYPES[2:]
_VARLEN_V2_ARGTYPES = _VARLEN_ARGTYPES[:2] + [ctypes.c_int] + _VARLEN_ARGTYPES[2:]
_BWD_ARGTYPES = [
    ctypes.c_int, ctypes.c_int, ctypes.c_int,  # dtype, head_dim_qk, head_dim_v
    ctypes.c_void_p, _i64p,  # q
    ctypes.c_void_p, _i64p,  # k
    ctypes.c_void_p, _i64p,  # v
    ctypes.c_void_p, _i64p,  # o
    ctypes.c_void_p, _i64p,  # dout
    ctypes.c_void_p, _i64p,  # lse, lse_stride {batch, head}
    ctypes.c_void_p, _i64p,  # dq
    ctypes.c_void_p, _i64p,  # dk
    ctypes.c_void_p, _i64p,  # dv
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,  # batch .. num_heads_k
    ctypes.c_float, ctypes.c_int, ctypes.c_int,  # softmax_scale, causal, deterministic
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,  # workspace, workspace_bytes, stream
]
_VARLEN_BWD_ARGTYPES = [
    ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ctypes.c_void_p, _i64p, ctypes.c_void_p, _i64p, ctypes.c_void_p, _i64p,  # q, k, v
    ctypes.c_void_p, _i64p, ctypes.c_void_p, _i64p,  # o, dout
    ctypes.c_void_p, ctypes.c_int64,  # lse, lse_head_stride
    ctypes.c_void_p, _i64p, ctypes.c_void_p, _i64p, ctypes.c_void_p, _i64p,  # dq, dk, dv
    ctypes.c_void_p, ctypes.c_void_p,  # cu_seqlens_q, cu_seqlens_k
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ctypes.c_float, ctypes.c_int, ctypes.c_int,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
]
_WORKSPACE_ARGTYPES = [ctypes.c_int] * 10 + [ctypes.POINTER(ctypes.c_size_t)]
_VARLEN_WORKSPACE_ARGTYPES = [ctypes.c_int] * 11 + [ctypes.POINTER(ctypes.c_size_t)]
# Functions newer libraries have; an older library loads without them.
_OPTIONAL = {
    "kforge_fmha_fwd_v2": _FWD_V2_ARGTYPES,
    "kforge_fmha_varlen_fwd_v2": _VARLEN_V2_ARGTYPES,
    "kforge_fmha_bwd": _BWD_ARGTYPES,
    "kforge_fmha_varlen_bwd": _VARLEN_BWD_ARGTYPES,
    "kforge_fmha_bwd_workspace_size": _WORKSPACE_ARGTYPES,
    "kforge_fmha_varlen_bwd_workspace_size": _VARLEN_WORKSPACE_ARGTYPES,
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def library_path() -> Path:
    """Where the shared library is: $KFORGE_FMHA_LIBRARY, else next to this package."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / _LIB_NAME


def library() -> ctypes.CDLL:
    """The loaded library (loaded once, on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not path.is_file():
                raise FmhaError(
                    f"kforge_fmha: the native library is missing: {path} does not exist. "
                    "Reinstall the kforge-fmha wheel, or point KFORGE_FMHA_LIBRARY at a built "
                    "libkforge_fmha.so."
                )
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise FmhaError(f"kforge_fmha: cannot load {path}: {exc}") from None
            lib.kforge_fmha_version.restype = ctypes.c_char_p
            lib.kforge_fmha_version.argtypes = []
            lib.kforge_fmha_last_error.restype = ctypes.c_char_p
            lib.kforge_fmha_last_error.argtypes = []
            lib.kforge_fmha_status_name.restype = ctypes.c_char_p
            lib.kforge_fmha_status_name.argtypes = [ctypes.c_int]
            lib.kforge_fmha_built_archs.restype = ctypes.c_char_p
            lib.kforge_fmha_built_archs.argtypes = []
            if hasattr(lib, "kforge_fmha_last_kernel"):  # older libraries lack it
                lib.kforge_fmha_last_kernel.restype = ctypes.c_char_p
                lib.kforge_fmha_last_kernel.argtypes = []
            lib.kforge_fmha_device_check.restype = ctypes.c_int
            lib.kforge_fmha_device_check.argtypes = [
                ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
            lib.kforge_fmha_fwd.restype = ctypes.c_int
            lib.kforge_fmha_fwd.argtypes = _FWD_ARGTYPES
            lib.kforge_fmha_varlen_fwd.restype = ctypes.c_int
            lib.kforge_fmha_varlen_fwd.argtypes = _VARLEN_ARGTYPES
            for name, argtypes in _OPTIONAL.items():
                if hasattr(lib, name):
                    fn = getattr(lib, name)
                    fn.restype, fn.argtypes = ctypes.c_int, argtypes
            _lib = lib
    return _lib


def check(status: int) -> None:
    """Raise the exception that matches a kforge_fmha_status, with the library's message."""
    if status == 0:
        return
    lib = library()
    message = lib.kforge_fmha_last_error().decode("utf-8", "replace")
    name = lib.kforge_fmha_status_name(status).decode()
    raise _STATUS_ERRORS.get(status, FmhaError)(f"kforge_fmha: {message} [{name}]")


def strides(*values: int) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)

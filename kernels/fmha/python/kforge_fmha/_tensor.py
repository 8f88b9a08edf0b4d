"""Describe a torch tensor or any DLPack producer as (pointer, shape, strides, dtype, device).

torch tensors are read through their attributes (nothing of torch is linked; torch is only
looked up in sys.modules). Anything else must implement the DLPack protocol
(``__dlpack__`` / ``__dlpack_device__``); its capsule is parsed with ctypes and kept alive
for the duration of the call.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from ._lib import FmhaArgumentError

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13
_DEVICE_NAMES = {_KDL_CPU: "cpu", _KDL_CUDA: "cuda", _KDL_CUDA_HOST: "cuda_host",
                 _KDL_CUDA_MANAGED: "cuda_managed", 10: "rocm", 14: "oneapi", 8: "metal"}
_DTYPES = {(2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (0, 32): "int32",
           (0, 64): "int64", (2, 64): "float64", (1, 8): "uint8", (0, 8): "int8"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: str  # "float16", "bfloat16", "float32", "int32", ...
    device_type: str  # "cuda", "cpu", ...
    device_index: int
    is_torch: bool
    keepalive: Any = None  # the DLPack capsule, while the call runs

    @property
    def device(self) -> str:
        return f"{self.device_type}:{self.device_index}"


def torch_module() -> Any | None:
    """torch, if the caller has imported it (never imported from here)."""
    return sys.modules.get("torch")


def is_torch_tensor(x: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def describe(name: str, x: Any, stream: int | None = None) -> TensorInfo:
    if is_torch_tensor(x):
        # No data pointer while torch.compile traces (fake tensors) or for meta tensors; the
        # custom op's eager body describes the real tensors again before launching.
        no_ptr = x.device.type == "meta" or torch_module().compiler.is_compiling()
        return TensorInfo(
            name=name,
            ptr=0 if no_ptr else _torch_data_ptr(x),
            shape=tuple(int(s) for s in x.shape),
            strides=tuple(int(s) for s in x.stride()),
            dtype=str(x.dtype).replace("torch.", ""),
            device_type=x.device.type,
            device_index=x.device.index if x.device.index is not None else 0,
            is_torch=True,
        )
    if not hasattr(x, "__dlpack__"):
        raise FmhaArgumentError(
            f"kforge_fmha: {name} is a {type(x).__name__}; pass a torch tensor or an object that "
            "implements the DLPack protocol (__dlpack__), e.g. a CuPy array"
        )
    device_type, device_id = (int(v) for v in x.__dlpack_device__())
    if device_type != _KDL_CUDA:
        where = _DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")
        raise FmhaArgumentError(
            f"kforge_fmha: {name} lives on {where}; kforge_fmha needs CUDA device memory"
        )
    try:
        capsule = x.__dlpack__(stream=1 if stream in (None, 0) else stream)
    except TypeError:  # producers older than the stream argument
        capsule = x.__dlpack__()
    try:
        addr = _get_pointer(capsule, b"dltensor")
    except ValueError:
        raise FmhaArgumentError(
            f"kforge_fmha: {name}: the DLPack capsule was already consumed or is not a 'dltensor'"
        ) from None
    managed = _DLManagedTensor.from_address(addr)
    t = managed.dl_tensor
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(t.ndim))
    else:  # compact row-major
        acc, rev = 1, []
        for s in reversed(shape):
            rev.append(acc)
            acc *= s
        strides = tuple(reversed(rev))
    dtype = _DTYPES.get((t.dtype.code, t.dtype.bits), f"dlpack(code={t.dtype.code},bits={t.dtype.bits})")
    if t.dtype.lanes != 1:
        dtype = f"{dtype}x{t.dtype.lanes}"
    return TensorInfo(
        name=name,
        ptr=int(t.data or 0) + int(t.byte_offset),
        shape=shape,
        strides=strides,
        dtype=dtype,
        device_type="cuda",
        device_index=device_id,
        is_torch=False,
        keepalive=capsule,
    )


def _torch_data_ptr(x: Any) -> int:
    try:
        return int(x.data_ptr())
    except (RuntimeError, NotImplementedError):  # fake tensors under torch.compile tracing
        return 0

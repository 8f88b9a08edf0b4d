"""The repair policy: which shared libraries a wheel must not bundle, and which every system has.

Both the repair step (:mod:`kforge.wheels.repair`, which acts on it) and the doctor (which judges a wheel
by it) read this module; it imports neither, so the doctor does not depend on the repair tools.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

#: Never bundled, torch provides them (Linux sonames, Windows DLL names); libtorch* covers libtorch_python.
TORCH_LINUX = ("libtorch*", "libc10*")
TORCH_WINDOWS = ("torch*.dll", "c10*.dll")
TORCH_LIBRARIES = TORCH_LINUX + TORCH_WINDOWS
#: Never bundled, the NVIDIA driver provides them.
DRIVER_LINUX = ("libcuda.so*",)
DRIVER_WINDOWS = ("nvcuda.dll",)
#: Not bundled when the project links the CUDA runtime shared (torch or the
#: nvidia-cuda-runtime wheel provide it); static cudart has no NEEDED entry at all.
CUDART_LINUX = ("libcudart.so*",)
CUDART_WINDOWS = ("cudart64_*.dll",)

#: Libraries every manylinux system has (a NEEDED on these is fine unbundled).
LINUX_SYSTEM = (
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
    "libresolv.so.2", "libnsl.so.1", "libcrypt.so.1", "libstdc++.so.6", "libgcc_s.so.1",
    "ld-linux-*.so.*", "ld64.so.*",
)  # fmt: skip
#: DLLs every Windows system (with the VC++ runtime Python itself needs) has.
WINDOWS_SYSTEM = (
    "api-ms-win-*.dll", "ext-ms-*.dll", "kernel32.dll", "kernelbase.dll", "ntdll.dll", "user32.dll",
    "advapi32.dll", "shell32.dll", "ole32.dll", "oleaut32.dll", "ws2_32.dll", "msvcrt.dll",
    "ucrtbase.dll", "vcruntime140*.dll", "msvcp140*.dll", "vcomp140.dll", "concrt140.dll",
    "python3*.dll", "bcrypt.dll", "crypt32.dll", "dbghelp.dll", "gdi32.dll", "shlwapi.dll",
    "version.dll", "psapi.dll", "setupapi.dll", "iphlpapi.dll", "secur32.dll", "winmm.dll",
    "rpcrt4.dll", "comdlg32.dll",
)  # fmt: skip

#: auditwheel and delvewheel rename what they graft: libfoo-1a2b3c4d.so.1, foo-1a2b3c4d.dll.
_GRAFT_HASH = re.compile(r"^(?P<stem>.+?)-[0-9a-f]{8,}(?P<rest>\.so(?:\.[0-9]+)*|\.dll)$", re.IGNORECASE)


def unmangle(filename: str) -> str:
    """``libcudart-1a2b3c4d.so.13`` -> ``libcudart.so.13``: the name before the repair tool renamed it."""
    m = _GRAFT_HASH.match(filename)
    return m.group("stem") + m.group("rest") if m else filename


@dataclass(frozen=True)
class RepairPolicy:
    """Which libraries stay out of the wheel (``exclude``), and which the system has anyway.

    Patterns are shell globs, matched case-insensitively against a library's file name
    (after undoing the repair tools' hash mangling). Patterns ending in ``.dll`` go to
    delvewheel, the rest to auditwheel.
    """

    exclude: tuple[str, ...]
    system: tuple[str, ...] = LINUX_SYSTEM + WINDOWS_SYSTEM
    name: str = "default"
    #: A torch-free project's wheel (``torch_abi = false``): no binary may need torch's libraries, bundled or not
    #: (it would fail to load where torch is not imported first, and be tied to one torch build where it is).
    torch_free: bool = False

    def excludes(self, library: str) -> bool:
        return _matches(unmangle(os.path.basename(library)), self.exclude)

    def forbids(self, library: str) -> bool:
        """``library`` is torch's, and this policy is torch-free: no binary of the wheel may need or bundle it."""
        return self.torch_free and _matches(unmangle(os.path.basename(library)), TORCH_LIBRARIES)

    def is_system(self, library: str) -> bool:
        return _matches(os.path.basename(library), self.system)

    @property
    def linux_exclude(self) -> tuple[str, ...]:
        return tuple(p for p in self.exclude if not p.lower().endswith(".dll"))

    @property
    def windows_exclude(self) -> tuple[str, ...]:
        return tuple(p for p in self.exclude if p.lower().endswith(".dll"))


def _matches(name: str, patterns: Sequence[str]) -> bool:
    low = name.lower()
    return any(fnmatch.fnmatchcase(low, p.lower()) for p in patterns)


def default_policy(project: str = "default", *, torch: bool = True, cudart_shared: bool = False, extra: Sequence[str] = ()) -> RepairPolicy:
    """The per-project default: the driver always; torch's libraries when the project builds against
    torch (without torch, they are forbidden: ``torch_free``); the CUDA runtime only when it is linked shared;
    plus ``extra`` patterns from forge.toml."""
    exclude: list[str] = [*DRIVER_LINUX, *DRIVER_WINDOWS]
    if torch:
        exclude += [*TORCH_LINUX, *TORCH_WINDOWS]
    if cudart_shared:
        exclude += [*CUDART_LINUX, *CUDART_WINDOWS]
    exclude += [p for p in extra if p not in exclude]
    return RepairPolicy(exclude=tuple(exclude), name=project, torch_free=not torch)

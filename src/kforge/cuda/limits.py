"""Per-block launch limits by compute capability, for the doctor's launchability check (kforge.doctor.resources)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class ArchLimits:
    """What one thread block may use on a GPU of this compute capability.

    ``max_smem_per_block`` is the opt-in maximum of static plus dynamic shared memory
    (``cudaDevAttrMaxSharedMemoryPerBlockOptin``); the 1 KB the driver reserves per block on
    top of it is not counted. Source: the CUDA C++ Programming Guide's table of technical
    specifications per compute capability (CUDA 13.0).
    """

    number: int
    name: str
    max_smem_per_block: int
    max_static_smem: int = 48 * 1024
    max_regs_per_thread: int = 255
    regs_per_block: int = 64 * 1024
    max_threads_per_block: int = 1024
    reg_alloc_unit: int = 8  # registers are given out 256 per warp: 8 per thread


def _limits(number: int, name: str, smem_kb: int) -> ArchLimits:
    return ArchLimits(number=number, name=name, max_smem_per_block=smem_kb * 1024)


ARCH_LIMITS: Mapping[int, ArchLimits] = MappingProxyType(
    {
        lim.number: lim
        for lim in (
            _limits(75, "sm_75", 64),
            _limits(80, "sm_80", 163),
            _limits(86, "sm_86", 99),
            _limits(87, "sm_87", 163),
            _limits(89, "sm_89", 99),
            _limits(90, "sm_90", 227),
            _limits(100, "sm_100", 227),
            _limits(103, "sm_103", 227),
            _limits(110, "sm_110", 227),
            _limits(120, "sm_120", 99),
            _limits(121, "sm_121", 99),
        )
    }
)
"""Launch limits by ``major*10 + minor``. sm_88 is absent: no published figures yet, so the doctor
reports no limit check for it rather than guess."""

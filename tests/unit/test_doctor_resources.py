"""kforge.doctor.resources without nvcc: .nv.info records, limit arithmetic, manifests, stub detection."""

from __future__ import annotations

import struct

from kforge.cuda.limits import ARCH_LIMITS
from kforge.doctor.model import KernelResources
from kforge.doctor.resources import (
    EIATTR_MAX_THREADS,
    EIATTR_REGCOUNT,
    _declared,
    _nv_info,
    over_limits,
    ptxas_options,
    resource_findings,
    split_compile,
)


def kernel(name: str = "_Z1kv", arch: str = "sm_120a", *, regs: int | None = 32, static: int = 0, dynamic: int | None = None,
           threads: int | None = None, code: int = 8192) -> KernelResources:
    return KernelResources(name=name, arch=arch, registers=regs, static_smem=static, reserved_smem=1024, dynamic_smem=dynamic,
                           stack_bytes=0, max_threads=threads, code_bytes=code)


def test_arch_limits_table_has_the_per_block_shared_memory_of_each_generation() -> None:
    assert ARCH_LIMITS[120].max_smem_per_block == 101376  # 99 KB: consumer Blackwell
    assert ARCH_LIMITS[121].max_smem_per_block == 101376
    assert ARCH_LIMITS[90].max_smem_per_block == 232448  # 227 KB: Hopper
    assert ARCH_LIMITS[100].max_smem_per_block == 232448
    assert ARCH_LIMITS[80].max_smem_per_block == 166912
    assert ARCH_LIMITS[86].max_smem_per_block == 101376
    assert all(lim.max_regs_per_thread == 255 and lim.regs_per_block == 65536 for lim in ARCH_LIMITS.values())


def test_nv_info_reads_sval_hval_and_bval_records_in_order() -> None:
    data = (
        bytes([4, EIATTR_REGCOUNT]) + struct.pack("<HII", 8, 3, 168)
        + bytes([3, 0x1B]) + struct.pack("<H", 255)
        + bytes([2, 0x4C, 1, 0])
        + bytes([4, EIATTR_MAX_THREADS]) + struct.pack("<HIII", 12, 128, 1, 1)
    )  # fmt: skip
    records = _nv_info(data)
    assert [a for a, _ in records] == [EIATTR_REGCOUNT, 0x1B, 0x4C, EIATTR_MAX_THREADS]
    assert struct.unpack("<II", records[0][1]) == (3, 168)
    assert struct.unpack("<III", records[3][1]) == (128, 1, 1)


def test_nv_info_stops_at_an_unknown_format_instead_of_misreading() -> None:
    data = bytes([4, EIATTR_REGCOUNT]) + struct.pack("<HII", 8, 0, 40) + bytes([9, 9, 9, 9, 4, 0x2F])
    assert [a for a, _ in _nv_info(data)] == [EIATTR_REGCOUNT]


def test_a_kernel_within_the_limits_has_no_problem() -> None:
    assert over_limits(kernel(regs=248, dynamic=94336, threads=128), ARCH_LIMITS[120]) == []


def test_shared_memory_over_the_arch_limit_names_amount_and_limit() -> None:
    problems = over_limits(kernel(static=1024, dynamic=200000), ARCH_LIMITS[120])
    assert len(problems) == 1
    assert "201,024 B" in problems[0] and "101,376 B (99 KB)" in problems[0] and "sm_120" in problems[0]
    assert over_limits(kernel(static=1024, dynamic=200000, arch="sm_90a"), ARCH_LIMITS[90]) == []


def test_registers_for_the_declared_block_size_are_rounded_to_the_allocation_unit() -> None:
    # 65 registers round up to 72 per thread: 72 * 1024 > 65536, while 64 * 1024 fits exactly
    assert over_limits(kernel(regs=64, threads=1024), ARCH_LIMITS[90]) == []
    problems = over_limits(kernel(regs=65, threads=1024), ARCH_LIMITS[90])
    assert len(problems) == 1 and "73,728 registers" in problems[0] and "65,536" in problems[0]


def test_registers_threads_and_static_smem_each_have_their_own_limit() -> None:
    problems = over_limits(kernel(regs=300, static=60000, threads=2048), ARCH_LIMITS[120])
    assert any("300 registers per thread" in p for p in problems)
    assert any("2048 threads per block" in p for p in problems)
    assert any("static shared memory" in p for p in problems)


def test_manifest_matches_the_longest_name_substring() -> None:
    manifest = [("kernelI6__half", 1000), ("kernelI6__halfLi32E", 2000)]
    assert _declared(manifest, "_Z6kernelI6__halfLi32EEvv") == 2000
    assert _declared(manifest, "_Z6kernelI6__halfLi16EEvv") == 1000
    assert _declared(manifest, "_Z5otherv") is None


def test_over_limit_finding_names_binary_kernel_and_arch() -> None:
    findings = resource_findings("binary", "lib/x.so", [kernel("_Z3bigv", dynamic=150000)])
    assert [f.code for f in findings] == ["kernel-over-limit"]
    f = findings[0]
    assert f.is_error and f.arch == "sm_120a" and f.binary == "lib/x.so"
    assert "_Z3bigv" in f.message and "sm_120a" in f.message and "101,376" in f.message


def test_an_arch_with_only_stub_bodies_is_an_error_and_partial_stubs_are_info() -> None:
    real = [kernel("_Z1av", "sm_90a", code=40000), kernel("_Z1bv", "sm_90a", code=9000)]
    all_stubs = real + [kernel("_Z1av", "sm_120a", code=256), kernel("_Z1bv", "sm_120a", code=128)]
    findings = resource_findings("binary", "x.so", all_stubs)
    assert [(f.code, f.severity, f.arch) for f in findings] == [("stub-sass", "error", "sm_120a")]
    some = real + [kernel("_Z1av", "sm_120a", code=256), kernel("_Z1bv", "sm_120a", code=8800)]
    findings = resource_findings("binary", "x.so", some)
    assert [(f.code, f.severity, f.arch) for f in findings] == [("stub-kernels", "info", "sm_120a")]


def test_small_kernels_everywhere_are_not_stubs() -> None:
    tiny = [kernel("_Z1av", "sm_90a", code=256), kernel("_Z1av", "sm_120a", code=256)]
    assert resource_findings("binary", "x.so", tiny) == []


def test_archs_without_a_limits_row_are_not_judged() -> None:
    assert resource_findings("binary", "x.so", [kernel(arch="sm_88", dynamic=10**6)]) == []


def _tkinfo(options: str, tool: str = "ptxas") -> bytes:
    """A ``.note.nv.tkinfo`` note laid out as nvcc 13.0's ptxas writes it: five words, then the strings."""
    desc = struct.pack("<5I", 2, 1, 7, 0x36, 0x60) + b"\0".join(
        s.encode() for s in (tool, "Cuda compilation tools, release 13.0, V13.0.88",
                             "Build cuda_13.0.r13.0/compiler.36424714_0", options)) + b"\0"
    name = b"NVIDIA Corp\0"
    pad = b"\0" * (-len(desc) % 4)
    return struct.pack("<III", len(name), len(desc), 2000) + name + desc + pad


def test_ptxas_options_come_from_the_tkinfo_note() -> None:
    assert ptxas_options(_tkinfo("-arch sm_90 -m 64 -split-compile 4 ")) == "-arch sm_90 -m 64 -split-compile 4"
    assert split_compile(ptxas_options(_tkinfo("-arch sm_90 -m 64 -split-compile 4 "))) == 4
    assert split_compile("-arch sm_90 -m 64") is None and split_compile(None) is None
    assert ptxas_options(_tkinfo("-arch sm_90", tool="nvlink")) is None  # another tool's note
    assert ptxas_options(b"") is None and ptxas_options(b"\x01\x02") is None  # truncated: nothing read
    assert ptxas_options(_tkinfo("")) is None  # ptxas named, but no command line after its version lines
    two = _tkinfo("-arch sm_90", tool="nvlink") + _tkinfo("-arch sm_90 -m 64 -split-compile 2 ")
    assert ptxas_options(two) == "-arch sm_90 -m 64 -split-compile 2"

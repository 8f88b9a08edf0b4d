"""The doctor's launchability check on real nvcc builds: a kernel over sm_120's shared memory, stub-only SASS."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kforge.cli import main
from kforge.doctor import check, inspect_binary, verify
from kforge.errors import DoctorError

pytestmark = pytest.mark.integration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import kforge_doctor_builders as B  # noqa: E402

BIG = "_Z11kf_big_smemPKfPfi"
GUARDED = "_Z12kf_sm90_onlyPKfPfi"


@pytest.fixture(scope="session")
def oversize_so(nvcc: str, work: Path) -> Path:
    return B.nvcc_oversize(nvcc, work / "liboversize.so")


@pytest.fixture(scope="session")
def stub_only_so(nvcc: str, work: Path) -> Path:
    return B.nvcc_oversize(nvcc, work / "libstubonly.so", "-DKF_STUB_ONLY")


def test_kernels_are_read_per_arch_with_registers_and_declared_dynamic_smem(oversize_so: Path) -> None:
    report = inspect_binary(oversize_so)
    by = {(k.name, k.arch): k for k in report.kernels}
    assert set(by) == {(BIG, "sm_90a"), (BIG, "sm_120a"), (GUARDED, "sm_90a"), (GUARDED, "sm_120a")}
    for arch in ("sm_90a", "sm_120a"):
        big = by[(BIG, arch)]
        assert big.dynamic_smem == 150000  # from the fixture's launch manifest
        assert big.static_smem == 0 and big.reserved_smem == 1024  # nvcc 13 puts the reserved 1 KB in .nv.shared.<k>
        assert big.registers is not None and 0 < big.registers <= 255
    assert by[(GUARDED, "sm_90a")].code_bytes > 4096 >= 512 >= by[(GUARDED, "sm_120a")].code_bytes


def test_oversized_kernel_fails_for_sm_120a_naming_kernel_arch_and_limit(oversize_so: Path) -> None:
    findings = check(inspect_binary(oversize_so), expect_archs=["sm_90a", "sm_120a"])
    errors = [f for f in findings if f.is_error]
    assert [(f.code, f.arch) for f in errors] == [("kernel-over-limit", "sm_120a")]
    message = errors[0].message
    assert BIG in message and "sm_120a" in message and "150,000 B" in message and "101,376 B (99 KB)" in message
    # the guarded kernel is a stub for sm_120a, next to a real kernel there: reported, not fatal
    assert [(f.code, f.arch) for f in findings if f.code == "stub-kernels"] == [("stub-kernels", "sm_120a")]
    with pytest.raises(DoctorError) as exc:
        verify(inspect_binary(oversize_so), ["sm_90a", "sm_120a"])
    assert BIG in str(exc.value) and "size the kernel's tiles" in exc.value.fix


def test_the_same_kernel_fits_sm_90a(nvcc: str, work: Path) -> None:
    only90 = B._cached(
        work / "liboversize90.so",
        lambda t: B.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(t), str(B.HERE / "oversize.cu")]),
    )
    assert [f for f in check(inspect_binary(only90), expect_archs=["sm_90a"]) if f.is_error] == []


def test_stub_only_sass_is_an_error_for_that_arch(stub_only_so: Path) -> None:
    errors = [f for f in check(inspect_binary(stub_only_so), expect_archs=["sm_90a", "sm_120a"]) if f.is_error]
    assert [(f.code, f.arch) for f in errors] == [("stub-sass", "sm_120a")]
    assert GUARDED in errors[0].message


def test_cli_json_reports_kernels_and_exits_with_the_doctor_code(oversize_so: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["doctor", "--json", "--policy", "none", str(oversize_so)])
    assert rc == DoctorError.exit_code
    data = json.loads(capsys.readouterr().out)
    kernels = {(k["name"], k["arch"]): k for k in data["kernels"]}
    assert kernels[(BIG, "sm_120a")]["dynamic_smem"] == 150000
    assert any(f["code"] == "kernel-over-limit" and f["arch"] == "sm_120a" for f in data["findings"])
    assert data["ok"] is False


def test_real_small_kernels_pass_and_compressed_cubins_are_read(nvcc: str, work: Path) -> None:
    for name, compression, extra in (("libres-plain.so", None, ()), ("libres-zstd.so", "zstd", ("-Xfatbin", "-compress-all")),
                                     ("libres-lz4.so", "lz4", ("-Xfatbin", "-compress-all", "--compress-mode=speed"))):
        so = B.nvcc_shared(nvcc, work / name, B.COMPRESSED_GENCODES[:2], *extra)
        report = inspect_binary(so)
        assert {e.compression for e in report.sass} == {compression}, name
        assert {k.arch for k in report.kernels} == {"sm_80", "sm_90a"}, name
        assert all(k.name == "_Z7kf_axpyfPKfPfi" and k.registers for k in report.kernels)
        assert [f for f in check(report, expect_archs=["sm_80", "sm_90a"]) if f.is_error] == []


def _res_usage(cuobjdump: str, binary: Path) -> dict[tuple[str, str], tuple[int, int, int]]:
    """``(kernel, arch) -> (REG, SHARED, STACK)`` as ``cuobjdump -res-usage`` prints them."""
    out = B.run([cuobjdump, "-res-usage", str(binary)])
    found: dict[tuple[str, str], tuple[int, int, int]] = {}
    arch = ""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("arch = "):
            arch = line.split("=", 1)[1].strip()
        elif line.strip().startswith("Function ") and i + 1 < len(lines):
            name = line.strip()[len("Function "):].rstrip(":")
            fields = dict(item.split(":", 1) for item in lines[i + 1].split() if ":" in item)
            found[(name, arch)] = (int(fields["REG"]), int(fields["SHARED"]), int(fields["STACK"]))
    return found


def test_registers_shared_memory_and_stack_agree_with_cuobjdump(oversize_so: Path, nvcc: str, work: Path) -> None:
    cuobjdump = B.find_cuobjdump()
    if not cuobjdump:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump, or put it on PATH)")
    multi = B.nvcc_shared(nvcc, work / "libmulti-res.so", B.MULTI_GENCODES)
    for binary in (oversize_so, multi):
        ours = {(k.name, k.arch): (k.registers, k.static_smem + k.reserved_smem, k.stack_bytes) for k in inspect_binary(binary).kernels}
        theirs = _res_usage(cuobjdump, binary)
        assert ours and ours == theirs, binary.name

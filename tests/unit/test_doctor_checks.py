"""check()/verify() semantics on reports assembled here (real builds: tests/integration/test_doctor_real.py)."""

from __future__ import annotations

import json
import re

import pytest
from kforge_doctor_builders import tiny_elf

from kforge.config.repairpolicy import default_policy
from kforge.cuda.arch import Arch, code_kind, parse_arch
from kforge.doctor import (
    BinaryReport,
    FatbinEntry,
    WheelReport,
    check,
    inspect_bytes,
    render_text,
    to_json,
    verify,
)
from kforge.errors import ArchError, DoctorError


def fb(name: str, *, relocatable: bool = False, compressed: bool = False) -> FatbinEntry:
    # as the fatbin parser does: any arch a binary names, even one outside kforge's table (sm_70)
    m = re.fullmatch(r"(?:sm|compute)_(\d+)(\d)([af]?)", name)
    assert m, name
    kind, arch = code_kind(name), Arch.observed(int(m[1]), int(m[2]), m[3])
    assert kind in ("sass", "ptx")
    return FatbinEntry(
        kind=kind, arch=name, major=arch.major, minor=arch.minor, variant=arch.variant,
        compressed=compressed, compression="zstd" if compressed else None, size=100, uncompressed_size=300 if compressed else 100,
        version="1.8", section="__nv_relfatbin" if relocatable else ".nv_fatbin", container=0, offset=0, relocatable=relocatable,
    )  # fmt: skip


def binary(*archs: str, path: str = "pkg/lib/libk.so", **kw) -> BinaryReport:  # type: ignore[no-untyped-def]
    return BinaryReport(path=path, format="elf", size=1000, fatbins=tuple(fb(a) for a in archs), containers=1 if archs else 0, **kw)


def wheel(*binaries: BinaryReport, files: tuple[str, ...] = ()) -> WheelReport:
    return WheelReport(
        path="/w/pkg-1.0-cp312-cp312-linux_x86_64.whl", filename="pkg-1.0-cp312-cp312-linux_x86_64.whl", name="pkg", version="1.0",
        tags=("cp312-cp312-linux_x86_64",), size=1, sha256="0" * 64, binaries=binaries, files=files or tuple(b.path for b in binaries),
    )  # fmt: skip


def outcome(have: tuple[str, ...], want: str) -> str:
    findings = check(binary(*have), expect_archs=[want])
    return findings[0].severity if findings else "ok"


@pytest.mark.parametrize(
    ("have", "want", "expected"),
    [
        (("sm_90a",), "sm_90a", "ok"),
        (("sm_90",), "sm_90a", "error"),  # plain sm_90 lacks the arch-specific features
        (("compute_90a",), "sm_90a", "warning"),  # JIT
        (("compute_90",), "sm_90a", "error"),
        (("sm_90",), "sm_90", "ok"),
        (("sm_90a",), "sm_90", "ok"),  # runs on every 9.0 GPU
        (("sm_80",), "sm_86", "info"),  # binary compatible within major 8
        (("sm_80",), "sm_90", "error"),  # not across majors
        (("compute_80",), "sm_90", "warning"),  # PTX 8.0 JITs to 9.0
        (("compute_100",), "sm_90", "error"),  # newer PTX does not
        (("compute_100f",), "sm_103", "warning"),  # family PTX JITs within the family
        (("compute_120a",), "sm_121", "error"),  # arch-specific PTX only for 12.0
        (("sm_120f",), "sm_120f", "ok"),
        (("sm_120a",), "sm_120f", "error"),
        (("compute_120f",), "sm_120f", "warning"),
        (("compute_120a",), "compute_120a", "ok"),
        (("sm_120a",), "compute_120a", "error"),
        (("sm_90", "compute_90"), "sm_90+PTX", "ok"),
    ],
)
def test_expected_arch_semantics(have: tuple[str, ...], want: str, expected: str) -> None:
    assert outcome(have, want) == expected


def test_plus_ptx_needs_the_ptx_too() -> None:
    findings = check(binary("sm_90"), expect_archs=["sm_90+PTX"])
    assert [(f.code, f.arch) for f in findings] == [("missing-ptx", "compute_90")]


def test_arch_objects_from_the_plan_are_accepted() -> None:
    assert check(binary("sm_90a"), expect_archs=[parse_arch("sm_90a")]) == []
    assert check(binary("sm_90a"), expect_archs=[parse_arch("sm_100a")])[0].code == "missing-arch"
    assert [f.code for f in check(binary("sm_90"), expect_archs=[parse_arch("sm_90+PTX")])] == ["missing-ptx"]


def test_misspelt_expected_arch_is_an_arch_error() -> None:
    with pytest.raises(ArchError):
        check(binary("sm_90a"), expect_archs=["sm_9o"])


def test_verify_names_the_arch_the_binary_and_what_it_has() -> None:
    report = wheel(binary("sm_80", "sm_86", path="kforge_fmha/lib/libkforge_fmha.so"))
    with pytest.raises(DoctorError) as info:
        verify(report, ["sm_80", "sm_90a"], default_policy("fmha"))
    text = info.value.what
    assert (
        "wheel pkg-1.0-cp312-cp312-linux_x86_64.whl: kforge_fmha/lib/libkforge_fmha.so has no SASS for sm_90a "
        "(it has sm_80, sm_86); a GPU with sm_90a would fail with 'no kernel image is available" in text
    )
    assert "-gencode" in info.value.fix


def test_verify_returns_non_error_findings() -> None:
    findings = verify(wheel(binary("sm_80")), ["sm_86"])
    assert [f.code for f in findings] == ["compatible-sass"]


def test_every_cuda_binary_is_judged_but_vendored_libs_and_host_only_binaries_are_not() -> None:
    report = wheel(
        binary("sm_90a", path="pkg/a.so"),
        binary("sm_80", path="pkg/b.so"),
        binary(path="pkg/host_only.so"),
        binary("sm_70", path="pkg.libs/libcublas-0123abcd.so.13"),
    )
    errors = [f for f in check(report, expect_archs=["sm_90a"]) if f.is_error]
    assert [f.binary for f in errors] == ["pkg/b.so"]


def test_expected_arch_but_no_device_code_at_all() -> None:
    findings = check(wheel(binary(path="pkg/host.so")), expect_archs=["sm_90a"])
    assert [f.code for f in findings] == ["no-device-code"]
    assert check(wheel(binary(path="pkg/host.so"))) == []


def test_relocatable_device_code_does_not_count() -> None:
    b = BinaryReport(path="pkg/r.so", format="elf", size=1, fatbins=(fb("sm_90a", relocatable=True),), containers=1,
                     undefined_symbols=("__cudaRegisterLinkedBinary_abc_1_k_cu_123", "malloc"))  # fmt: skip
    codes = sorted(f.code for f in check(b, expect_archs=["sm_90a"]))
    assert codes == ["missing-arch", "unresolved-device-link"]
    assert "never device-linked" in check(b, expect_archs=["sm_90a"])[0].message


def test_bundled_library_the_policy_excludes_is_an_error() -> None:
    report = wheel(
        binary("sm_90a", path="pkg/_C.so", needed=("libc10.so", "libcudart-1a2b3c4d.so.13", "libc.so.6")),
        files=("pkg/_C.so", "pkg.libs/libcudart-1a2b3c4d.so.13"),
    )
    assert [f for f in check(report, policy=default_policy("p")) if f.severity != "info"] == []
    findings = check(report, policy=default_policy("p", cudart_shared=True))
    assert [(f.code, f.binary) for f in findings] == [("bundled-excluded", "pkg.libs/libcudart-1a2b3c4d.so.13")]


def test_unbundled_needed_library_is_a_warning() -> None:
    report = wheel(binary("sm_90a", path="pkg/_C.so", needed=("libfoo.so.1", "libtorch_cpu.so", "libstdc++.so.6")))
    findings = check(report, policy=default_policy("p"))
    assert [(f.severity, f.code) for f in findings] == [("warning", "unbundled-needed")]
    assert "libfoo.so.1" in findings[0].message
    assert check(report, policy=None) == []


def test_windows_names_match_case_insensitively() -> None:
    pe = BinaryReport(path="pkg/_C.pyd", format="pe", size=1, needed=("C10.dll", "torch_cpu.dll", "NVCUDA.DLL", "KERNEL32.dll", "VCRUNTIME140.dll"))
    assert check(wheel(pe), policy=default_policy("p")) == []


def test_render_text_has_one_column_per_arch() -> None:
    report = wheel(binary("sm_80", "sm_90a", "compute_120a", path="pkg/k.so"))
    text = render_text(report, check(report, expect_archs=["sm_100a"]))
    header = next(line for line in text.splitlines() if "binary" in line)
    assert [c for c in ("80", "90a", "120a") if c in header] == ["80", "90a", "120a"]
    assert "PTX" in text and "no SASS for sm_100a" in text


def test_to_json_round_trips_the_facts() -> None:
    report = wheel(binary("sm_90a", "compute_90a", path="pkg/k.so", needed=("libc.so.6",)))
    data = json.loads(to_json(report, check(report, expect_archs=["sm_120a"])))
    assert data["ok"] is False
    assert data["binaries"][0]["sass_archs"] == ["sm_90a"]
    assert data["binaries"][0]["ptx_archs"] == ["compute_90a"]
    assert data["findings"][0]["arch"] == "sm_120a" and data["findings"][0]["wheel"] == report.filename
    assert "files" not in data


def test_arch_spelling_helpers() -> None:
    # the doctor uses kforge.cuda.arch's one model: Arch, parse_arch, and code_kind for the prefix
    assert (code_kind("sm_90a"), parse_arch("sm_90a")) == ("sass", Arch(9, 0, "a"))
    assert (code_kind("compute_120f"), parse_arch("compute_120f")) == ("ptx", Arch(12, 0, "f"))
    assert (code_kind("10.3a"), parse_arch("10.3a")) == (None, Arch(10, 3, "a"))
    assert min([Arch(12, 0), Arch(9, 0, "a"), Arch(10, 0, "f")]) == Arch(9, 0, "a")
    assert fb("sm_90a").cuda_arch == Arch(9, 0, "a")
    with pytest.raises(ArchError):
        parse_arch("hopper")


def test_a_binary_with_an_arch_outside_the_table_is_still_described() -> None:
    # sm_70 (dropped by CUDA 13) in an old wheel: the doctor reports it rather than failing
    old = FatbinEntry(kind="sass", arch="sm_70", major=7, minor=0, variant="", compressed=False, compression=None,
                      size=1, uncompressed_size=1, version="1.8", section=".nv_fatbin", container=0, offset=0)
    b = BinaryReport(path="old.so", format="elf", size=1, fatbins=(old,), containers=1)
    (finding,) = check(b, expect_archs=["sm_80"])
    assert finding.code == "missing-arch" and "it has sm_70" in finding.message
    assert "70" in render_text(b)


def test_finding_prints_as_one_line() -> None:
    (finding,) = check(binary("sm_80"), expect_archs=["sm_86"])
    assert str(finding) == f"info: {finding.message}"


# ---------------------------------------------------------------------------- exact mode


def test_exact_mode_flags_extra_and_missing_archs_by_name() -> None:
    rep = wheel(binary("sm_75", "sm_90", "compute_90", path="pkg/_a.so"), binary("sm_90a", path="pkg/_b.so"))
    loose = check(rep, expect_archs=["sm_90"])
    assert not [f for f in loose if f.is_error]  # sm_90a runs on 9.0 and the extra sm_75 is not judged
    found = {(f.code, f.binary, f.arch) for f in check(rep, expect_archs=["sm_90", "compute_90"], exact=True)}
    assert found == {("extra-arch", "pkg/_a.so", "sm_75"), ("missing-arch", "pkg/_b.so", "sm_90"),
                     ("missing-ptx", "pkg/_b.so", "compute_90"), ("extra-arch", "pkg/_b.so", "sm_90a")}
    assert check(binary("sm_90", "compute_90"), expect_archs=["sm_90", "compute_90"], exact=True) == []
    with pytest.raises(DoctorError) as info:
        verify(rep, ["sm_90", "compute_90"], exact=True)
    assert "carries SASS sm_75, which the plan did not ask for" in info.value.render()
    assert "arch_enforce" in (info.value.fix or "")


def test_exact_mode_flags_extra_ptx_and_skips_vendored_libraries() -> None:
    rep = wheel(binary("sm_90", "compute_80", "compute_90", path="pkg/_a.so"),
                binary("sm_80", path="pkg.libs/libother.so"))
    found = [(f.code, f.arch) for f in check(rep, expect_archs=["sm_90", "compute_90"], exact=True)]
    assert found == [("extra-ptx", "compute_80")]


def test_exact_sass_only_leaves_ptx_to_the_upstream() -> None:
    rep = binary("sm_75", "sm_90", "compute_75", path="pkg/_a.so")
    found = [(f.code, f.arch) for f in check(rep, expect_archs=["sm_90", "compute_90"], exact=True, exact_ptx=False)]
    assert found == [("extra-arch", "sm_75")]  # no missing-ptx compute_90, no extra-ptx compute_75
    assert check(binary("sm_90"), expect_archs=["sm_90", "compute_90"], exact=True, exact_ptx=False) == []


def test_stripped_fails_host_debug_info_in_the_wheels_own_elf_binaries() -> None:
    from kforge.doctor.model import SectionSize

    debug = (SectionSize(".text", 10), SectionSize(".debug_str", 6_000_000), SectionSize(".debug_info", 3_400_000),
             SectionSize(".debug_line", 10), SectionSize(".debug_abbrev", 5))
    rep = wheel(binary("sm_90", path="pkg/_a.so", sections=debug),
                binary(path="pkg/_host_only.so", sections=debug),  # no device code: stripped all the same
                binary("sm_90", path="pkg.libs/libvendored.so", sections=debug),  # vendored by repair: not ours
                BinaryReport(path="pkg/_a.pyd", format="pe", size=1, sections=debug))  # PE: strip_debug is Linux's
    found = [f for f in check(rep, expect_archs=["sm_90"], exact=True, stripped=True) if f.code == "debug-info"]
    assert [f.binary for f in found] == ["pkg/_a.so", "pkg/_host_only.so"]
    assert ("carries host debug info (.debug_str 6.0 MB, .debug_info 3.4 MB, .debug_line 0.0 MB ...; 9.4 MB in all)"
            in found[0].message)
    assert not [f for f in check(rep, expect_archs=["sm_90"], exact=True) if f.code == "debug-info"]
    with pytest.raises(DoctorError) as info:
        verify(rep, ["sm_90"], stripped=True)
    assert "kforge repair --strip-debug" in (info.value.fix or "") and "--keep-debug" in (info.value.fix or "")


def test_exact_ptx_none_fails_any_ptx() -> None:
    """A plan with ptx = "none" (flash-attn's upstream ships SASS only) expects no PTX: any is extra."""
    found = [(f.code, f.arch) for f in check(binary("sm_90", "compute_90", path="pkg/_a.so"), expect_archs=["sm_90"],
                                             exact=True)]
    assert found == [("extra-ptx", "compute_90")]
    assert check(binary("sm_90", path="pkg/_a.so"), expect_archs=["sm_90"], exact=True) == []


def test_render_text_explains_its_marks_in_a_legend() -> None:
    text = render_text(wheel(binary("sm_90a", "compute_90a", path="pkg/k.so")))
    legend = next(line for line in text.splitlines() if "SASSz" in line)
    assert "compressed" in legend and "PTX" in legend and "(rdc)" in legend


# -- torch-free projects: no binary may need torch's libraries -------------------------------------------------


def test_the_fabricated_elf_reads_back_as_a_library_with_those_needs() -> None:
    report = inspect_bytes(tiny_elf(("libc10.so", "libc.so.6")), "flash_attn_standalone/lib/libflash_attn_standalone.so")
    assert report.format == "elf" and report.needed == ("libc10.so", "libc.so.6")
    assert report.soname == "libflash_attn_standalone.so" and not report.is_cuda


@pytest.mark.parametrize("torch_lib", ["libc10.so", "libtorch_python.so", "libtorch_cuda.so", "libc10_cuda.so"])
def test_a_torch_free_wheel_whose_library_needs_torch_fails_the_doctor(torch_lib: str) -> None:
    lib = inspect_bytes(tiny_elf((torch_lib, "libstdc++.so.6")), "flash_attn_standalone/lib/libflash_attn_standalone.so")
    report = wheel(lib)
    findings = check(report, policy=default_policy("flash-attn3-standalone", torch=False))
    assert [(f.severity, f.code, f.binary) for f in findings] == [("error", "needs-torch", lib.path)]
    assert torch_lib in findings[0].message and "torch_abi = false" in findings[0].message
    with pytest.raises(DoctorError) as info:
        verify(report, [], default_policy("flash-attn3-standalone", torch=False))
    assert "torch_abi = true" in info.value.render() and torch_lib in info.value.render()
    # a torch extension's policy needs torch's libraries from the user's torch: not an error there
    assert [f for f in check(report, policy=default_policy("flash-attn3", torch=True)) if f.is_error] == []


def test_a_torch_free_wheel_that_bundles_torch_fails_and_a_clean_one_says_torch_free() -> None:
    grafted = wheel(inspect_bytes(tiny_elf(("libc10-1a2b3c4d.so",)), "pkg/lib/libk.so"),
                    files=("pkg/lib/libk.so", "pkg.libs/libc10-1a2b3c4d.so"))
    codes = [(f.code, f.binary) for f in check(grafted, policy=default_policy("p", torch=False)) if f.is_error]
    assert codes == [("needs-torch", "pkg/lib/libk.so"), ("bundles-torch", "pkg.libs/libc10-1a2b3c4d.so")]
    clean = wheel(inspect_bytes(tiny_elf(("libc.so.6",)), "pkg/lib/libk.so"))
    findings = check(clean, policy=default_policy("p", torch=False))
    assert [(f.severity, f.code) for f in findings] == [("info", "torch-free")]
    assert "libtorch*" in findings[0].message and "libc10*" in findings[0].message
    assert check(clean, policy=default_policy("p", torch=True)) == []  # a torch extension: nothing to say


def test_a_torch_free_windows_dll_needing_c10_fails_too() -> None:
    pe = BinaryReport(path="pkg/k.dll", format="pe", size=1, needed=("C10.dll", "KERNEL32.dll"))
    assert [f.code for f in check(wheel(pe), policy=default_policy("p", torch=False))] == ["needs-torch"]


def test_ptxas_threads_are_held_to_what_each_cubin_records() -> None:
    from kforge.doctor.model import KernelResources

    def kernel(name: str, ptxas: str | None) -> KernelResources:
        return KernelResources(name=name, arch="sm_90", registers=32, static_smem=0, reserved_smem=1024, dynamic_smem=None,
                               stack_bytes=0, max_threads=None, code_bytes=64, ptxas=ptxas)

    split = "-arch sm_90 -m 64 -split-compile 4"
    rep = wheel(binary("sm_90", path="pkg/_ok.so", kernels=(kernel("a", split), kernel("b", None))),  # no note: not judged
                binary("sm_90", path="pkg/_one.so", kernels=(kernel("a", split), kernel("c", "-arch sm_90 -m 64"))),
                binary("sm_90", path="pkg.libs/libv.so", kernels=(kernel("v", "-arch sm_90 -m 64"),)))  # vendored
    found = [f for f in check(rep, expect_archs=["sm_90"], exact=True, ptxas_threads=4) if f.code == "ptxas-threads"]
    assert [f.binary for f in found] == ["pkg/_one.so"]
    assert "1 of 2 kernels were compiled by ptxas without -split-compile 4" in found[0].message
    assert "'-arch sm_90 -m 64'" in found[0].message
    eight = [f.binary for f in check(rep, expect_archs=["sm_90"], exact=True, ptxas_threads=8) if f.code == "ptxas-threads"]
    assert eight == ["pkg/_ok.so", "pkg/_one.so"]
    assert not [f for f in check(rep, expect_archs=["sm_90"], exact=True) if f.code == "ptxas-threads"]
    with pytest.raises(DoctorError) as info:
        verify(rep, ["sm_90"], ptxas_threads=4)
    assert "--split-compile" in (info.value.fix or "")


def test_a_wheel_above_pypis_file_limit_is_a_warning_naming_its_size() -> None:
    import dataclasses

    from kforge.doctor.checks import PYPI_FILE_LIMIT

    small = check(wheel(binary("sm_90")), expect_archs=["sm_90"])
    assert not [f for f in small if f.code == "pypi-size"]
    at_limit = dataclasses.replace(wheel(binary("sm_90")), size=PYPI_FILE_LIMIT)
    assert not [f for f in check(at_limit, expect_archs=["sm_90"]) if f.code == "pypi-size"]
    big = dataclasses.replace(wheel(binary("sm_90")), size=240_742_786)  # flash-attn-release, four archs
    (found,) = [f for f in check(big, expect_archs=["sm_90"]) if f.code == "pypi-size"]
    assert found.severity == "warning" and not found.is_error and found.wheel == big.filename
    assert "240,742,786 bytes (229.6 MiB)" in found.message and "100 MiB" in found.message

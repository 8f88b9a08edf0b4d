"""Repair with the real tools: auditwheel on a real Linux wheel, delvewheel on a real win_amd64 wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kforge.doctor import check, inspect_bytes, inspect_wheel
from kforge.errors import RepairError
from kforge.wheels.repair import (
    apply_local_version,
    default_policy,
    repair_wheel,
    unmangle,
)

pytestmark = pytest.mark.integration


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import kforge_doctor_builders as B  # noqa: E402

TAG = "cp311-cp311-linux_x86_64"


@pytest.fixture(scope="session")
def linux_ext(nvcc: str, work: Path):  # type: ignore[no-untyped-def]
    return B.linux_extension(nvcc, work / "linux-ext")


@pytest.fixture(scope="session")
def linux_wheel(linux_ext, work: Path) -> Path:  # type: ignore[no-untyped-def]
    return B.make_wheel(work / "wheels-linux", "kforge-fixture", "0.1.0", TAG, {"kforge_fixture/__init__.py": b"", "kforge_fixture/_ext.so": linux_ext.ext})


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_fixture_extension_needs_what_the_test_is_about(linux_ext) -> None:  # type: ignore[no-untyped-def]
    needed = inspect_bytes(linux_ext.ext.read_bytes(), "_ext.so").needed
    assert {"libkfhelper.so", "libcuda.so.1", "libcudart.so.13"} <= set(needed)


def test_auditwheel_grafts_helper_and_excludes_driver_and_cudart(linux_wheel: Path, linux_ext, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    policy = default_policy("fixture", cudart_shared=True)
    result = repair_wheel(linux_wheel, tmp_path / "out", platform="linux", policy=policy, lib_paths=[linux_ext.helper_dir])
    assert result.repaired
    assert result.tag.startswith("manylinux_") and result.tag.endswith("_x86_64")
    assert result.wheel.parent == tmp_path / "out" and result.wheel.is_file()
    assert result.tag in result.wheel.name
    assert set(result.excluded) == {"libcuda.so.1", "libcudart.so.13"}
    assert [unmangle(g.rsplit("/", 1)[-1]) for g in result.grafted] == ["libkfhelper.so"]
    names = _names(result.wheel)
    assert not any("libcuda" in n for n in names)
    # Nothing half-written is left next to the result.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [result.wheel.name]
    report = inspect_wheel(result.wheel)
    ext = next(b for b in report.binaries if b.path == "kforge_fixture/_ext.so")
    assert any(unmangle(n) == "libkfhelper.so" and n != "libkfhelper.so" for n in ext.needed)
    findings = check(report, expect_archs=["sm_80"], policy=policy)
    assert [f for f in findings if f.severity in ("error", "warning")] == []


def test_strip_debug_then_auditwheel_on_a_real_extension(linux_ext, work: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The fixture extension linked again with gcc -g (host DWARF, as setuptools' -g from Python's CFLAGS gives a
    torch extension's .cpp): repair with strip_debug strips it before auditwheel grafts and patches, the device code
    and the library links survive, and the doctor's stripped check passes on the result."""
    ext = tmp_path / "_ext.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-g", "-o", str(ext), str(B.HERE / "ext.c"), str(work / "linux-ext" / "kernel_shared.o"),
                    "-Wl,--no-as-needed", f"-L{linux_ext.helper_dir}", "-lkfhelper", f"-L{linux_ext.driver_dir}", "-lcuda",
                    f"-L{linux_ext.cuda_lib}", "-lcudart", "-lstdc++"], check=True)  # fmt: skip
    before = inspect_bytes(ext.read_bytes(), "_ext.so")
    assert before.debug_sections and before.sass_archs == ("sm_80",)
    wheel = B.make_wheel(tmp_path / "in", "kforge-fixture", "0.1.0", TAG, {"kforge_fixture/__init__.py": b"", "kforge_fixture/_ext.so": ext})
    policy = default_policy("fixture", cudart_shared=True)
    result = repair_wheel(wheel, tmp_path / "out", platform="linux", policy=policy, lib_paths=[linux_ext.helper_dir],
                          strip_debug=True)
    assert result.notes[0].startswith("strip_debug: ") and "kforge_fixture/_ext.so" in result.notes[1]
    report = inspect_wheel(result.wheel)
    fixed = next(b for b in report.binaries if b.path == "kforge_fixture/_ext.so")
    assert fixed.debug_sections == () and fixed.sass_archs == ("sm_80",) and fixed.fatbins == before.fatbins
    assert [unmangle(g.rsplit("/", 1)[-1]) for g in result.grafted] == ["libkfhelper.so"]
    assert [f for f in check(report, expect_archs=["sm_80"], policy=policy, exact=True, stripped=True) if f.is_error] == []


def test_doctor_flags_a_bundled_library_the_policy_excludes(linux_wheel: Path, linux_ext, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Repair without excluding the CUDA runtime: auditwheel grafts libcudart.
    loose = default_policy("fixture", cudart_shared=False)
    result = repair_wheel(linux_wheel, tmp_path, platform="linux", policy=loose, lib_paths=[linux_ext.helper_dir, linux_ext.cuda_lib])
    assert any(unmangle(g.rsplit("/", 1)[-1]).startswith("libcudart.so") for g in result.grafted)
    findings = check(inspect_wheel(result.wheel), policy=default_policy("fixture", cudart_shared=True))
    bundled = [f for f in findings if f.code == "bundled-excluded"]
    assert len(bundled) == 1 and bundled[0].is_error and "libcudart" in bundled[0].message


def test_unrepaired_wheel_warns_about_unbundled_needed(linux_wheel: Path) -> None:
    findings = check(inspect_wheel(linux_wheel), policy=default_policy("fixture", cudart_shared=True))
    assert [(f.code, f.severity) for f in findings] == [("unbundled-needed", "warning")]
    assert "libkfhelper.so" in findings[0].message


def test_auditwheel_failure_reports_command_code_and_output(linux_wheel: Path, tmp_path: Path) -> None:
    # libkfhelper.so is nowhere auditwheel looks: it cannot be grafted.
    with pytest.raises(RepairError) as info:
        repair_wheel(linux_wheel, tmp_path, platform="linux", policy=default_policy("fixture", cudart_shared=True))
    text = f"{info.value.what} {info.value.why}"
    assert "auditwheel repair failed" in text
    assert "-m auditwheel repair" in text and "exited with" in text
    assert "libkfhelper.so" in text
    assert list(tmp_path.iterdir()) == []


def test_wheel_without_elf_needs_no_repair(work: Path, tmp_path: Path) -> None:
    pure = B.make_wheel(work / "wheels-pure", "kforge-pure", "1.0", "py3-none-any", {"kforge_pure/__init__.py": b"x = 1\n"}, root_is_purelib=True)
    result = repair_wheel(pure, tmp_path, platform="linux", policy=default_policy("pure", torch=False))
    assert not result.repaired and result.tag == "any"
    assert result.wheel.read_bytes() == pure.read_bytes()


def test_auditwheel_own_no_elf_message_is_understood(work: Path, tmp_path: Path) -> None:
    # A platform-tagged wheel whose ".so" is a linker script, not ELF: our pre-check lets it through,
    # auditwheel itself says there is no ELF, and that is not an error.
    fake = B.make_wheel(work / "wheels-fake", "kforge-fake", "1.0", TAG, {"kforge_fake/libx.so": b"INPUT(libc.so.6)\n"})
    result = repair_wheel(fake, tmp_path, platform="linux", policy=default_policy("fake"))
    assert not result.repaired and result.tag == "linux_x86_64"
    assert "ELF" in result.log


# -- Windows ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def windows_ext(multi_so_for_pe: Path, work: Path):  # type: ignore[no-untyped-def]
    if not shutil.which("x86_64-w64-mingw32-gcc"):
        pytest.skip("mingw-w64 not installed (apt-get install gcc-mingw-w64-x86-64)")
    fatbin = B.extract_section(multi_so_for_pe, ".nv_fatbin", work / "win" / "kernel.fatbin")
    return B.windows_extension(fatbin, work / "win")


@pytest.fixture(scope="session")
def multi_so_for_pe(nvcc: str, work: Path) -> Path:
    return B.nvcc_shared(nvcc, work / "libmulti.so", B.MULTI_GENCODES)


@pytest.fixture(scope="session")
def windows_wheel(windows_ext, work: Path) -> Path:  # type: ignore[no-untyped-def]
    return B.make_wheel(
        work / "wheels-win",
        "kforge-fixture",
        "0.1.0",
        "cp311-cp311-win_amd64",
        {"kforge_fixture/__init__.py": b"", "kforge_fixture/_ext.pyd": windows_ext.pyd},
    )


def test_pe_reader_finds_the_real_fatbin(windows_ext, multi_so_for_pe: Path) -> None:  # type: ignore[no-untyped-def]
    pe = inspect_bytes(windows_ext.pyd.read_bytes(), "_ext.pyd")
    elf = inspect_bytes(multi_so_for_pe.read_bytes(), "libmulti.so")
    assert pe.format == "pe"
    assert any(s.name == ".nv_fatb" for s in pe.sections)
    assert [(e.arch, e.compressed, e.size) for e in pe.fatbins] == [(e.arch, e.compressed, e.size) for e in elf.fatbins]
    assert {"kfhelper.dll", "nvcuda.dll", "c10.dll"} <= set(pe.needed)


def test_delvewheel_grafts_helper_and_excludes_torch_and_driver(windows_wheel: Path, windows_ext, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    policy = default_policy("fixture")
    result = repair_wheel(windows_wheel, tmp_path, platform="windows", policy=policy, lib_paths=[windows_ext.dll_dir])
    assert result.repaired and result.tag == "win_amd64"
    grafted = [g.rsplit("/", 1)[-1] for g in result.grafted]
    assert [unmangle(g).lower() for g in grafted] == ["kfhelper.dll"]
    names = _names(result.wheel)
    assert not any(n.lower().endswith(("nvcuda.dll", "c10.dll")) for n in names)
    report = inspect_wheel(result.wheel)
    findings = check(report, expect_archs=["sm_90a", "sm_120a"], policy=policy)
    assert [f for f in findings if f.severity in ("error", "warning")] == []


def test_delvewheel_failure_is_a_repair_error(windows_wheel: Path, tmp_path: Path) -> None:
    with pytest.raises(RepairError) as info:
        repair_wheel(windows_wheel, tmp_path, platform="windows", policy=default_policy("fixture"))
    assert "delvewheel repair failed" in info.value.what and "kfhelper.dll" in (info.value.why or "")


# -- local version on a real wheel, checked by real pip -------------------------------------


def test_local_version_rewrite_installs_with_pip(linux_wheel: Path, tmp_path: Path) -> None:
    label = "cu130torch2.11"
    out = apply_local_version(linux_wheel, label, out_dir=tmp_path / "dist")
    assert out.name == "kforge_fixture-0.1.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl"
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--target", str(target), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metadata = (target / "kforge_fixture-0.1.0+cu130torch2.11.dist-info" / "METADATA").read_text()
    assert "Version: 0.1.0+cu130torch2.11" in metadata
    assert (target / "kforge_fixture" / "_ext.so").read_bytes() == zipfile.ZipFile(linux_wheel).read("kforge_fixture/_ext.so")


def test_local_version_rewrite_passes_wheel_hash_checks(linux_wheel: Path, tmp_path: Path) -> None:
    wheelfile = pytest.importorskip("wheel.wheelfile")
    out = apply_local_version(linux_wheel, "cu130torch2.11", out_dir=tmp_path)
    with wheelfile.WheelFile(out) as wf:  # verifies every member against RECORD while reading
        for name in wf.namelist():
            if not name.endswith("RECORD"):
                wf.read(name)
        assert wf.parsed_filename.group("ver") == "0.1.0+cu130torch2.11"


@pytest.mark.parametrize("layout", ["data-purelib", "purelib-root"])
def test_shared_libraries_in_purelib_are_moved_to_platlib_for_auditwheel(layout: str, linux_ext, work: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # flashinfer-jit-cache 0.6.17 (setuptools, no ext_modules, root_is_pure=False) puts its AOT .so files in
    # <dist>.data/purelib/; auditwheel refuses that ("shared library/libraries in purelib folder"). Seen on the GPU host.
    so = "kforge_purelib-0.1.0.data/purelib/kforge_purelib/mod.so" if layout == "data-purelib" else "kforge_purelib/mod.so"
    # The data-purelib wheel also claims upstream's hard-coded manylinux_2_28 tag, as flashinfer-jit-cache does.
    tag = "cp39-abi3-manylinux_2_28_x86_64" if layout == "data-purelib" else "cp39-abi3-linux_x86_64"
    purelib = B.make_wheel(work / f"wheels-{layout}", "kforge-purelib", "0.1.0", tag,
                           {"kforge_purelib/__init__.py": b"", so: linux_ext.ext}, root_is_purelib=layout == "purelib-root")
    if layout == "data-purelib":  # the real tool refuses the wheel as built
        raw = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "-w", str(tmp_path / "raw"), str(purelib)],
                             capture_output=True, text=True, check=False)
        assert raw.returncode != 0 and "purelib" in raw.stdout + raw.stderr
    policy = default_policy("fixture", cudart_shared=True)
    result = repair_wheel(purelib, tmp_path / "out", platform="linux", policy=policy, lib_paths=[linux_ext.helper_dir])
    assert result.repaired and result.tag.startswith("manylinux_")
    assert any("platlib" in n for n in result.notes)
    names = _names(result.wheel)
    with zipfile.ZipFile(result.wheel) as zf:
        wheel_meta = zf.read("kforge_purelib-0.1.0.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in wheel_meta
    assert "kforge_purelib/mod.so" in names and not any(".data/purelib/" in n for n in names)
    assert "kforge_purelib/mod.so" not in result.grafted  # moved, not grafted: only the helper library was added
    if layout == "data-purelib":  # the claimed tag is gone: the name and WHEEL carry what auditwheel derived
        assert any("claimed manylinux_2_28_x86_64" in n for n in result.notes)
        assert "manylinux_2_28" not in result.wheel.name and "manylinux_2_28" not in wheel_meta
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [result.wheel.name]  # no temp copy left
    assert _names(purelib) != names  # the input is left as it was

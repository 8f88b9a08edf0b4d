"""The wheel doctor on real nvcc builds: multi-arch, compressed, a missing arch, an unlinked -rdc object."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.cli import main
from kforge.doctor import (
    check,
    inspect_binary,
    inspect_wheel,
    inspect_wheels,
    parse_fatbins,
    render_text,
    to_json,
    verify,
)
from kforge.errors import DoctorError
from kforge.wheels.repair import default_policy

pytestmark = pytest.mark.integration


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import kforge_doctor_builders as B  # noqa: E402


@pytest.fixture(scope="session")
def multi_so(nvcc: str, work: Path) -> Path:
    return B.nvcc_shared(nvcc, work / "libmulti.so", B.MULTI_GENCODES)


@pytest.fixture(scope="session")
def compressed_so(nvcc: str, work: Path) -> Path:
    return B.nvcc_shared(nvcc, work / "libcompressed.so", B.COMPRESSED_GENCODES, "-Xfatbin", "-compress-all")


@pytest.fixture(scope="session")
def missing_so(nvcc: str, work: Path) -> Path:
    return B.nvcc_shared(nvcc, work / "libmissing.so", B.MISSING_GENCODES)


@pytest.fixture(scope="session")
def rdc_so(nvcc: str, work: Path) -> Path:
    return B.nvcc_rdc_unlinked(nvcc, work / "librdc.so")


@pytest.fixture(scope="session")
def multi_wheel(multi_so: Path, work: Path) -> Path:
    return B.make_wheel(
        work / "wheels-multi",
        "kforge-fixture",
        "0.1.0",
        "cp311-cp311-linux_x86_64",
        {"kforge_fixture/__init__.py": b"", "kforge_fixture/lib/libkforge_fixture.so": multi_so},
    )


@pytest.fixture(scope="session")
def missing_wheel(missing_so: Path, work: Path) -> Path:
    return B.make_wheel(
        work / "wheels-missing",
        "kforge-fmha",
        "0.1.0",
        "cp311-cp311-linux_x86_64",
        {"kforge_fmha/__init__.py": b"", "kforge_fmha/lib/libkforge_fmha.so": missing_so},
    )


def _asked(gencodes) -> list[str]:  # type: ignore[no-untyped-def]
    return [want for _, want in gencodes]


def _found(report) -> list[str]:  # type: ignore[no-untyped-def]
    # The kernel's own container (static cudart adds one with sm_80 only), as arch names.
    own = [e for e in report.fatbins if e.container == max(x.container for x in report.fatbins)]
    return [e.arch for e in own]


def test_multi_arch_build_reports_exactly_the_archs_asked_for(multi_so: Path) -> None:
    report = inspect_binary(multi_so)
    assert report.format == "elf"
    assert sorted(_found(report)) == sorted(_asked(B.MULTI_GENCODES))
    assert set(report.sass_archs) == {"sm_80", "sm_90a", "sm_100f", "sm_120a"}
    assert report.ptx_archs == ("compute_120a",)
    by_arch = {e.arch: e for e in report.fatbins}
    assert (by_arch["sm_90a"].major, by_arch["sm_90a"].minor, by_arch["sm_90a"].variant) == (9, 0, "a")
    assert by_arch["sm_100f"].variant == "f"
    assert by_arch["sm_80"].variant == ""
    # nvcc 13 compresses PTX by default and leaves small cubins alone.
    assert by_arch["compute_120a"].compressed and by_arch["compute_120a"].uncompressed_size > by_arch["compute_120a"].size
    assert not by_arch["sm_120a"].compressed
    assert any(s.name == ".nv_fatbin" and s.size > 0 for s in report.sections)
    assert "libc.so.6" in report.needed
    assert not report.linked_binary_symbols
    assert check(report, expect_archs=["sm_80", "sm_90a", "sm_100f", "sm_120a", "compute_120a"]) == []


def test_compressed_fatbin_is_parsed(compressed_so: Path) -> None:
    report = inspect_binary(compressed_so)
    own = [e for e in report.fatbins if e.container == max(x.container for x in report.fatbins)]
    assert sorted(e.arch for e in own) == sorted(_asked(B.COMPRESSED_GENCODES))
    for entry in own:
        assert entry.compressed and entry.compression == "zstd", entry
        assert entry.uncompressed_size > entry.size
    assert check(report, expect_archs=["sm_80", "sm_90a", "compute_90a"]) == []


def test_lz4_compress_mode_is_parsed(nvcc: str, work: Path) -> None:
    fatbin = B.nvcc_fatbin(nvcc, work / "speed.fatbin", B.COMPRESSED_GENCODES, "--compress-mode=speed")
    entries = parse_fatbins(fatbin.read_bytes())
    assert sorted(e.arch for e in entries) == sorted(_asked(B.COMPRESSED_GENCODES))
    ptx = [e for e in entries if e.kind == "ptx"]
    assert ptx and all(e.compression == "lz4" for e in ptx)


def test_wheel_with_every_arch_passes_verify(multi_wheel: Path) -> None:
    report = inspect_wheel(multi_wheel)
    assert [b.path for b in report.binaries] == ["kforge_fixture/lib/libkforge_fixture.so"]
    assert report.name == "kforge-fixture" and report.version == "0.1.0"
    findings = verify(report, ["sm_90a", "sm_120a", "sm_100f", "sm_80"], default_policy("fixture"))
    assert not [f for f in findings if f.is_error]


def test_missing_arch_fails_naming_arch_and_binary(missing_wheel: Path) -> None:
    report = inspect_wheel(missing_wheel)
    with pytest.raises(DoctorError) as info:
        verify(report, ["sm_80", "sm_90a"], default_policy("fmha"))
    message = info.value.what
    assert f"wheel {missing_wheel.name}: kforge_fmha/lib/libkforge_fmha.so has no SASS for sm_90a (it has sm_80, sm_86)" in message
    assert "no kernel image is available" in message
    assert "sm_80 " not in message.split("(it has")[0]  # sm_80 is there and is not reported missing


def test_planted_unresolved_device_link_symbol_is_flagged(rdc_so: Path) -> None:
    report = inspect_binary(rdc_so)
    assert report.linked_binary_symbols
    assert all(s.startswith("__cudaRegisterLinkedBinary_") for s in report.linked_binary_symbols)
    assert report.sass and all(e.relocatable and e.section == "__nv_relfatbin" for e in report.sass)
    findings = check(report, expect_archs=["sm_80"])
    codes = {f.code for f in findings if f.is_error}
    assert codes == {"unresolved-device-link", "missing-arch"}
    with pytest.raises(DoctorError, match="never device-linked"):
        verify(report, ["sm_80"])


def test_linked_build_has_no_device_link_finding(multi_so: Path) -> None:
    assert not [f for f in check(inspect_binary(multi_so)) if f.code == "unresolved-device-link"]


def test_render_text_and_json(multi_wheel: Path) -> None:
    report = inspect_wheel(multi_wheel)
    text = render_text(report, check(report, expect_archs=["sm_89"]))
    for column in ("80", "90a", "100f", "120a"):
        assert column in text
    assert "kforge_fixture/lib/libkforge_fixture.so" in text
    data = json.loads(to_json(report, check(report, expect_archs=["sm_90a"])))
    assert data["ok"] is True
    assert data["binaries"][0]["sass_archs"] == ["sm_80", "sm_90a", "sm_100f", "sm_120a"]
    assert data["binaries"][0]["ptx_archs"] == ["compute_120a"]


@pytest.fixture(scope="session")
def cuobjdump() -> str:
    found = B.find_cuobjdump()
    if not found:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    return found


@pytest.mark.parametrize("fixture", ["multi_so", "compressed_so", "missing_so", "rdc_so"])
def test_parser_agrees_with_cuobjdump(fixture: str, request: pytest.FixtureRequest, cuobjdump: str) -> None:
    path = request.getfixturevalue(fixture)
    theirs = B.cuobjdump_list(cuobjdump, path)
    assert theirs, f"cuobjdump listed nothing for {path}"
    ours = []
    for e in inspect_binary(path).fatbins:
        if e.kind not in ("sass", "ptx"):
            continue
        # cuobjdump names every entry sm_XY[a] (PTX too) and drops the family 'f' suffix.
        arch = f"sm_{e.major}{e.minor}" + ("a" if e.variant == "a" else "")
        ours.append(f"{e.kind} {arch}")
    assert sorted(ours) == sorted(theirs)


# -- the CLI ------------------------------------------------------------------------------


def test_cli_missing_arch_exits_with_doctor_code(missing_wheel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", str(missing_wheel), "--expect-arch", "sm_80,sm_90a"])
    out, err = capsys.readouterr()
    assert code == DoctorError.exit_code
    assert "kforge_fmha/lib/libkforge_fmha.so has no SASS for sm_90a" in out
    assert "1 error(s)" in err


def test_cli_passes_and_prints_json(multi_wheel: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", str(multi_wheel.parent), "--expect-arch", "sm_90a", "--expect-arch", "sm_120a", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    data = json.loads(out)
    assert data["ok"] is True and data["filename"] == multi_wheel.name


def test_cli_bare_binary(rdc_so: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(rdc_so)]) == DoctorError.exit_code
    assert "__cudaRegisterLinkedBinary_" in capsys.readouterr().out


def test_cli_subprocess_error_has_no_traceback(tmp_path: Path) -> None:
    bogus = tmp_path / "kforge_x-1.0-py3-none-any.whl"
    bogus.write_text("not a zip")
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "doctor", str(bogus)], capture_output=True, text=True, check=False)
    assert proc.returncode == DoctorError.exit_code
    assert "is not a wheel" in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_wheels_on_a_directory(multi_wheel: Path, missing_wheel: Path, tmp_path: Path) -> None:
    import shutil

    for w in (multi_wheel, missing_wheel):
        shutil.copy(w, tmp_path / w.name)
    reports = inspect_wheels(tmp_path)
    assert sorted(r.filename for r in reports) == sorted([multi_wheel.name, missing_wheel.name])

"""``kforge doctor`` error paths: no traceback, the doctor's (or arch's) exit code, a useful message."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from kforge_doctor_builders import make_wheel, tiny_elf

from kforge.cli import main
from kforge.config.repairpolicy import default_policy
from kforge.doctor.judgement import Judgement
from kforge.errors import ArchError, DoctorError


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["doctor", str(tmp_path / "nope.whl")], capsys)
    assert code == DoctorError.exit_code
    assert "no such file or directory" in err.lower() and "Traceback" not in err


def test_not_a_wheel_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    code, _, err = run(["doctor", str(f)], capsys)
    assert code == DoctorError.exit_code and "is not a wheel" in err


def test_not_a_zip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pkg-1.0-py3-none-any.whl"
    f.write_bytes(b"PK but not really")
    code, _, err = run(["doctor", str(f)], capsys)
    assert code == DoctorError.exit_code and "not a zip archive" in err


def test_bad_wheel_file_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pkg.whl"
    with zipfile.ZipFile(f, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
    code, _, err = run(["doctor", str(f)], capsys)
    assert code == DoctorError.exit_code and "not a wheel file name" in err


def test_directory_without_wheels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["doctor", str(tmp_path)], capsys)
    assert code == DoctorError.exit_code and "no wheels in" in err.lower()


def test_corrupt_binary_inside_a_wheel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pkg-1.0-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(f, "w") as zf:
        zf.writestr("pkg/_C.so", b"\x7fELF" + b"\0" * 10)
    code, _, err = run(["doctor", str(f)], capsys)
    assert code == DoctorError.exit_code and "cannot read pkg/_c.so" in err.lower()


def test_bare_file_that_is_not_a_binary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "libx.so"
    f.write_text("INPUT(libc.so.6)")
    code, _, err = run(["doctor", str(f)], capsys)
    assert code == DoctorError.exit_code and "neither an ELF nor a PE" in err


def test_misspelt_arch_fails_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["doctor", str(tmp_path / "nope.whl"), "--expect-arch", "sm_9O"], capsys)
    assert code == ArchError.exit_code and "sm_9o" in err.lower()


def test_pure_wheel_passes_without_expectations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(f, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
    code, out, _ = run(["doctor", str(f)], capsys)
    assert code == 0 and "no ELF or PE binaries" in out
    code, out, _ = run(["doctor", str(f), "--expect-arch", "sm_90a"], capsys)
    assert code == DoctorError.exit_code and "no binary carries CUDA device code" in out


def test_inspect_wheel_on_a_directory(tmp_path: Path) -> None:
    from kforge.doctor import inspect_wheel, inspect_wheels

    with pytest.raises(DoctorError, match="holds 0 wheels"):
        inspect_wheel(tmp_path)
    for name in ("a-1.0-py3-none-any.whl", "b-1.0-py3-none-any.whl"):
        with zipfile.ZipFile(tmp_path / name, "w") as zf:
            zf.writestr("x/__init__.py", "")
    assert [r.name for r in inspect_wheels(tmp_path)] == ["a", "b"]
    with pytest.raises(DoctorError, match="holds 2 wheels"):
        inspect_wheel(tmp_path)
    (tmp_path / "b-1.0-py3-none-any.whl").unlink()
    assert inspect_wheel(tmp_path).name == "a"


def test_exact_needs_archs_and_a_broken_manifest_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(f, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
    code, _, err = run(["doctor", str(f), "--exact"], capsys)
    assert code == DoctorError.exit_code and "--exact needs the archs" in err and "Traceback" not in err
    Path(str(f) + ".manifest.json").write_text("{not json")
    code, _, err = run(["doctor", str(f)], capsys)
    assert code == DoctorError.exit_code and "cannot read the wheel's manifest" in err and "Traceback" not in err


def test_doctor_judges_a_torch_free_projects_wheel_by_its_needed_libraries(tmp_path: Path, capsys) -> None:
    lib = "flash_attn_standalone/lib/libflash_attn_standalone.so"
    bad = make_wheel(tmp_path / "bad", "flash-attn3-standalone", "3.0.0", "py3-none-linux_x86_64",
                     {lib: tiny_elf(("libc10.so", "libc.so.6"))})
    code, out, err = run(["doctor", str(bad), "--project", "flash-attn3-standalone"], capsys)
    assert code == DoctorError.exit_code and "needs libc10.so" in out and "needs: libc10.so, libc.so.6" in out
    assert run(["doctor", str(bad), "--policy", "torch"], capsys)[0] == 0  # a torch extension may need it
    # a published wheel is judged by its manifest, which records that the build was torch-free
    Path(str(bad) + ".manifest.json").write_text(json.dumps({"project": "flash-attn3-standalone", "doctor": {
        "judged_by": Judgement(default_policy("flash-attn3-standalone", torch=False)).to_dict()}}))
    code, out, err = run(["doctor", str(bad)], capsys)
    assert code == DoctorError.exit_code and "needs libc10.so" in out and "judged by its manifest" in err
    good = make_wheel(tmp_path / "good", "flash-attn3-standalone", "3.0.0", "py3-none-linux_x86_64",
                      {lib: tiny_elf(("libc.so.6",))})
    code, out, _ = run(["doctor", str(good), "--project", "flash-attn3-standalone"], capsys)
    assert code == 0 and "torch-free: no binary needs libtorch*" in out

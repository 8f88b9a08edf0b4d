"""Repair policy, local version labels and the version rewrite (the real tools: tests/integration/test_repair_real.py)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from kforge.errors import RepairError
from kforge.wheels.repair import (
    apply_local_version,
    default_policy,
    platform_tag,
    repair_wheel,
    unmangle,
)


@pytest.mark.parametrize(
    ("lib", "torch", "cudart_shared", "excluded"),
    [
        ("libtorch_cuda.so", True, False, True),
        ("libc10_cuda.so", True, False, True),
        ("libc10.so", False, False, False),
        ("libcuda.so.1", False, False, True),
        ("libcudart.so.13", True, False, False),
        ("libcudart.so.13", True, True, True),
        ("libcudart-1a2b3c4d.so.13", True, True, True),
        ("libcublas.so.13", True, True, False),
        ("nvcuda.dll", False, False, True),
        ("C10.DLL", True, False, True),
        ("torch_python.dll", True, False, True),
        ("cudart64_13.dll", True, True, True),
        ("kfhelper.dll", True, True, False),
    ],
)
def test_policy(lib: str, torch: bool, cudart_shared: bool, excluded: bool) -> None:
    assert default_policy("p", torch=torch, cudart_shared=cudart_shared).excludes(lib) is excluded


def test_policy_splits_patterns_per_tool_and_takes_extras() -> None:
    policy = default_policy("flashinfer", cudart_shared=True, extra=("libnvrtc.so*", "libcuda.so*"))
    assert "libnvrtc.so*" in policy.linux_exclude and policy.exclude.count("libcuda.so*") == 1
    assert all(p.endswith(".dll") for p in policy.windows_exclude)
    assert not any(p.endswith(".dll") for p in policy.linux_exclude)
    assert policy.is_system("libstdc++.so.6") and policy.is_system("api-ms-win-crt-runtime-l1-1-0.dll")
    assert not policy.is_system("libfoo.so")


def test_unmangle() -> None:
    assert unmangle("libkfhelper-9f8e7d6c.so") == "libkfhelper.so"
    assert unmangle("libcudart-1a2b3c4d.so.13") == "libcudart.so.13"
    assert unmangle("kfhelper-0123456789abcdef0123456789abcdef.dll") == "kfhelper.dll"
    assert unmangle("libfoo-bar.so") == "libfoo-bar.so"


def _wheel(tmp_path: Path, version: str = "1.0.0") -> Path:
    di = f"pkg-{version}.dist-info"
    files = {
        "pkg/__init__.py": b"x = 1\n",
        f"pkg-{version}.data/scripts/tool": b"#!python\n",
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: pkg\nVersion: {version}\n\nVersion: not a header\n".encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{k},,\n" for k in files) + f"{di}/RECORD,,\n"
    path = tmp_path / f"pkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
        zf.writestr(f"{di}/RECORD", record)
    return path


def _check_record(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        listed = {r[0] for r in rows}
        assert listed == set(names)
        for name, hash_, size in rows:
            if name == record_name:
                assert hash_ == "" and size == ""
                continue
            data = zf.read(name)
            assert hash_ == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        return {n: zf.read(n).decode() for n in names if n.endswith("METADATA")}


def test_apply_local_version_rewrites_everything(tmp_path: Path) -> None:
    src = _wheel(tmp_path)
    out = apply_local_version(src, "cu130torch2.11", out_dir=tmp_path / "out")
    assert out.name == "pkg-1.0.0+cu130torch2.11-py3-none-any.whl"
    metadata = _check_record(out)
    (text,) = metadata.values()
    assert "Version: 1.0.0+cu130torch2.11\n" in text and "Version: not a header" in text
    names = zipfile.ZipFile(out).namelist()
    assert "pkg-1.0.0+cu130torch2.11.data/scripts/tool" in names
    assert not any(n.startswith("pkg-1.0.0.") for n in names)
    assert src.exists()  # the input is untouched
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [out.name]


def test_apply_local_version_keeps_an_existing_local_part(tmp_path: Path) -> None:
    out = apply_local_version(_wheel(tmp_path, "1.0.0+abc123"), "cu130torch2.11", out_dir=tmp_path / "o")
    assert out.name.startswith("pkg-1.0.0+abc123.cu130torch2.11-")
    _check_record(out)


def test_apply_local_version_none_is_a_no_op(tmp_path: Path) -> None:
    src = _wheel(tmp_path)
    assert apply_local_version(src, None) == src


def test_apply_local_version_bad_label(tmp_path: Path) -> None:
    with pytest.raises(RepairError):
        apply_local_version(_wheel(tmp_path), "cu130 torch")


def test_platform_tag_prefers_pep600() -> None:
    assert platform_tag("a-1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl") == "manylinux_2_17_x86_64"
    assert platform_tag("a-1.0-cp312-cp312-win_amd64.whl") == "win_amd64"


def test_repair_input_errors(tmp_path: Path) -> None:
    with pytest.raises(RepairError, match="(?i)no wheel at"):
        repair_wheel(tmp_path / "x-1.0-py3-none-any.whl", tmp_path, platform="linux", policy=default_policy())
    with pytest.raises(RepairError, match="(?i)unknown repair platform"):
        repair_wheel(tmp_path / "x.whl", tmp_path, platform="macos", policy=default_policy())


def test_repair_tool_failure_carries_command_code_and_tail(tmp_path: Path) -> None:
    src = tmp_path / "pkg-1.0-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("pkg/_C.so", b"\x7fELF")

    def failing(cmd, env):  # type: ignore[no-untyped-def]
        return 1, "\n".join(f"line {i}" for i in range(40)) + "\nValueError: Cannot repair wheel, because required library \"libfoo.so.1\" could not be located"

    with pytest.raises(RepairError) as info:
        repair_wheel(src, tmp_path / "out", platform="linux", policy=default_policy(), runner=failing)
    err = info.value
    assert "exited with 1" in err.why and "libfoo.so.1" in err.why and "line 39" in err.why and "line 5\n" not in err.why
    assert "-m auditwheel repair" in err.why and "--exclude libcuda.so*" in err.why
    assert "lib_paths" in err.fix
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("platform", ["linux", "windows"])
def test_wheel_without_binaries_is_copied_through_without_running_a_tool(tmp_path: Path, platform: str) -> None:
    src = _wheel(tmp_path)

    def must_not_run(cmd, env):  # type: ignore[no-untyped-def]
        raise AssertionError(f"ran {cmd}")

    result = repair_wheel(src, tmp_path / "out", platform=platform, policy=default_policy(), runner=must_not_run)
    assert not result.repaired and result.tag == "any" and result.wheel.read_bytes() == src.read_bytes()


def test_apply_local_version_is_reproducible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # RECORD gets the source wheel's date, not the clock's: relabelling twice gives the same bytes
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    src = _wheel(tmp_path)
    first = apply_local_version(src, "sm90a", out_dir=tmp_path / "a").read_bytes()
    monkeypatch.setattr("time.time", lambda: 2_000_000_000.0)  # a later clock
    second = apply_local_version(src, "sm90a", out_dir=tmp_path / "b").read_bytes()
    assert first == second


@pytest.mark.skipif(__import__("shutil").which("strip") is None, reason="binutils' strip is not installed here")
def test_strip_debug_runs_before_the_repairer(tmp_path: Path) -> None:
    """auditwheel (here a runner that writes its input back as the repaired wheel) gets the stripped wheel: stripping
    before patchelf edits a library, never after; the notes say how much went."""
    from kforge_doctor_builders import make_wheel, tiny_elf

    from kforge.wheels.debuginfo import debug_sections_of

    debug = ((".debug_info", b"\x01" * 2000), (".debug_str", b"x\0" * 500))
    src = make_wheel(tmp_path / "in", "kf", "1.0", "cp311-cp311-linux_x86_64",
                     {"kf/_ext.so": tiny_elf(("libc.so.6",), "_ext.so", extra=debug)})
    seen = []

    def auditwheel(cmd, env):  # noqa: ANN001
        given = Path(cmd[-1])
        with zipfile.ZipFile(given) as zf:
            seen.append(debug_sections_of(zf.read("kf/_ext.so")))
        out = Path(cmd[cmd.index("-w") + 1]) / given.name.replace("linux_x86_64", "manylinux_2_17_x86_64")
        out.write_bytes(given.read_bytes())
        return 0, "ok"

    result = repair_wheel(src, tmp_path / "out", platform="linux", policy=default_policy(), runner=auditwheel,
                          strip_debug=True)
    assert seen == [()] and result.tag == "manylinux_2_17_x86_64"
    assert result.notes[0].startswith("strip_debug: ") and "kf/_ext.so" in result.notes[1]
    kept = repair_wheel(src, tmp_path / "out2", platform="linux", policy=default_policy(), runner=auditwheel)
    assert seen[-1] == (".debug_info", ".debug_str") and not any("strip_debug" in n for n in kept.notes)

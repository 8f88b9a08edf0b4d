"""Stripping host debug info from a wheel (kforge.wheels.debuginfo) with binutils' real `strip`, on a minimal ELF
written byte by byte: the .debug_* sections go, the rest of the wheel stays as it was, and RECORD is rewritten."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import shutil
import zipfile
from pathlib import Path

import pytest
from kforge_doctor_builders import make_wheel, tiny_elf

from kforge.doctor import check, inspect_wheel
from kforge.errors import RepairError
from kforge.wheels.debuginfo import debug_sections_of, strip_wheel

pytestmark = pytest.mark.skipif(shutil.which("strip") is None, reason="binutils' strip is not installed here")

TAG = "cp311-cp311-linux_x86_64"
DEBUG = ((".debug_info", b"\x01" * 3000), (".debug_str", b"kforge\0" * 400), (".comment", b"GCC: 12\0"))


def wheel_with_debug(tmp_path: Path) -> Path:
    return make_wheel(tmp_path / "in", "kforge-fixture", "0.1.0", TAG, {
        "kforge_fixture/__init__.py": b"",
        "kforge_fixture/_ext.so": tiny_elf(("libc.so.6",), "_ext.so", extra=DEBUG),
        "kforge_fixture/libplain.so": tiny_elf(("libc.so.6",), "libplain.so"),
        "kforge_fixture.libs/libvendored-1a2b3c4d.so": tiny_elf(("libc.so.6",), "libvendored.so", extra=DEBUG),
    })


def record_of(wheel: Path) -> dict[str, tuple[str, str]]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(name).decode())))
        return {row[0]: (row[1], row[2]) for row in rows if row}


def test_strip_removes_debug_sections_and_rewrites_record(tmp_path: Path) -> None:
    wheel = wheel_with_debug(tmp_path)
    result = strip_wheel(wheel, tmp_path / "out")
    assert result.wheel == tmp_path / "out" / wheel.name and wheel.is_file()  # the input is left as it is
    assert [(s.member, s.sections) for s in result.stripped] == [("kforge_fixture/_ext.so", (".debug_info", ".debug_str"))]
    assert result.stripped[0].after < result.stripped[0].before
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(result.wheel) as new:
        assert old.namelist() == new.namelist()  # same members, same order
        ext = new.read("kforge_fixture/_ext.so")
        assert debug_sections_of(ext) == () and b"GCC: 12" in ext  # only the debug sections went
        assert debug_sections_of(new.read("kforge_fixture.libs/libvendored-1a2b3c4d.so"))  # vendored: not ours
        for name in ("kforge_fixture/libplain.so", "kforge_fixture/__init__.py"):
            assert new.read(name) == old.read(name)
        assert {i.filename: (i.date_time, i.external_attr) for i in new.infolist()} == {
            i.filename: (i.date_time, i.external_attr) for i in old.infolist()}
        record = record_of(result.wheel)
        for name in new.namelist():
            if not name.endswith("RECORD"):
                digest = base64.urlsafe_b64encode(hashlib.sha256(new.read(name)).digest()).rstrip(b"=").decode()
                assert record[name] == (f"sha256={digest}", str(len(new.read(name))))
    assert "strip_debug: " in result.notes()[0] and "_ext.so" in result.notes()[1]


def test_the_doctor_fails_debug_info_only_where_the_plan_strips(tmp_path: Path) -> None:
    before = inspect_wheel(wheel_with_debug(tmp_path))
    found = [f for f in check(before, stripped=True) if f.is_error]
    assert [(f.code, f.binary) for f in found] == [("debug-info", "kforge_fixture/_ext.so")]  # not the vendored one
    assert ".debug_info 0.0 MB" in found[0].message and "the plan strips it (strip_debug)" in found[0].message
    assert not [f for f in check(before) if f.code == "debug-info"]  # a build that keeps it is not judged on it
    after = inspect_wheel(strip_wheel(wheel_with_debug(tmp_path), tmp_path / "out").wheel)
    assert not [f for f in check(after, stripped=True) if f.is_error]


def test_a_wheel_without_debug_info_is_returned_untouched(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "kforge-fixture", "0.1.0", TAG, {"kforge_fixture/_ext.so": tiny_elf(("libc.so.6",))})
    result = strip_wheel(wheel, tmp_path / "out")
    assert result.wheel == wheel and result.stripped == () and not (tmp_path / "out").exists()
    assert result.notes() == ("strip_debug: no binary of the wheel has host debug info",)


def test_no_strip_on_path_is_one_paragraph_with_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(RepairError) as info:
        strip_wheel(wheel_with_debug(tmp_path), tmp_path / "out", env={"PATH": str(tmp_path / "empty")})
    text = info.value.render()
    assert "there is no `strip` on the build's PATH" in text and "--keep-debug" in text and "binutils" in text


def test_a_failing_strip_names_the_member(tmp_path: Path) -> None:
    with pytest.raises(RepairError, match="`strip --strip-debug` failed on kforge_fixture/_ext.so"):
        strip_wheel(wheel_with_debug(tmp_path), tmp_path / "out", runner=lambda cmd, env: (1, "strip: bad file"))

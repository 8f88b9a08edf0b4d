"""Host debug info out of a wheel: ``strip --strip-debug`` on each of its own ELF binaries, RECORD rewritten.

The plan's ``debug stripped`` (kforge.config.binarypolicy) is carried out here, by the repair step, *before*
auditwheel: strip rewrites section layout, and stripping a library after patchelf edited it is the order that has
broken binaries before. binutils' ``strip`` is on every manylinux image and Linux build host (gcc needs binutils);
``--strip-debug`` removes the ``.debug_*`` sections only: the symbol table stays (backtraces still name functions)
and device code, a data section (``.nv_fatbin``), is untouched. A wheel without debug info is returned as it is.

The stripped wheel keeps every member's name, order, time stamp, mode and compression; :class:`wheel.wheelfile.WheelFile`
writes its RECORD with the new hashes and sizes (as :func:`kforge.wheels.repair.apply_local_version` does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kforge.doctor.elf import ELF_MAGIC, NotABinaryError, section_sizes
from kforge.doctor.model import is_debug_section
from kforge.doctor.wheel import BINARY_NAME
from kforge.errors import RepairError
from kforge.wheels.repairkit import _RelabelledWheel, _tail

#: ``runner(cmd, env) -> (exit code, combined output)``, as kforge.wheels.repair's.
Runner = Callable[[Sequence[str], Mapping[str, str]], tuple[int, str]]


def _run(cmd: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    proc = subprocess.run(list(cmd), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)
    return proc.returncode, proc.stdout


@dataclass(frozen=True)
class Stripped:
    """One binary of the wheel: its size with and without its debug sections, and which sections went."""

    member: str
    before: int
    after: int
    sections: tuple[str, ...]

    def __str__(self) -> str:
        return (f"{self.member}: {self.before / 1e6:.1f} MB -> {self.after / 1e6:.1f} MB "
                f"(stripped {', '.join(self.sections)})")


@dataclass(frozen=True)
class StripResult:
    wheel: Path  # the stripped wheel, or the input when nothing had debug info
    stripped: tuple[Stripped, ...] = ()

    def notes(self) -> tuple[str, ...]:
        if not self.stripped:
            return ("strip_debug: no binary of the wheel has host debug info",)
        saved = sum(s.before - s.after for s in self.stripped)
        return (f"strip_debug: {saved / 1e6:.1f} MB of host debug info stripped", *(f"  {s}" for s in self.stripped))


def debug_sections_of(data: bytes) -> tuple[str, ...]:
    """The ``.debug_*`` sections of an ELF file's bytes (none for anything else)."""
    if not data.startswith(ELF_MAGIC):
        return ()
    try:
        return tuple(name for name in section_sizes(data) if is_debug_section(name))
    except NotABinaryError:
        return ()


def find_strip(env: Mapping[str, str]) -> str:
    """binutils' ``strip`` on the build's PATH, or a RepairError that says how to get it or keep the debug info."""
    found = shutil.which("strip", path=env.get("PATH", os.defpath))
    if found is None:
        raise RepairError(
            "the plan strips host debug info (strip_debug), and there is no `strip` on the build's PATH",
            why="kforge strips with binutils' `strip --strip-debug` before repair (the plan's debug line)",
            fix="install binutils (apt-get install binutils, dnf install binutils), or keep the debug info: "
                "--keep-debug (KFORGE_STRIP_DEBUG=0), or strip_debug = false for the project in forge.toml")
    return found


def strip_wheel(wheel: Path | str, out_dir: Path | str, *, env: Mapping[str, str] | None = None,
                runner: Runner = _run) -> StripResult:
    """A copy of ``wheel`` in ``out_dir`` whose own ELF binaries have no ``.debug_*`` sections (the input is left as it
    is; the output appears only once complete). Libraries a repair tool vendored (``*.libs/``) are not touched."""
    wheel, out_dir = Path(wheel), Path(out_dir)
    env = dict(os.environ if env is None else env)
    with zipfile.ZipFile(wheel) as zf:
        todo = {i.filename for i in zf.infolist() if BINARY_NAME.search(i.filename) and not _vendored(i.filename)
                and debug_sections_of(zf.read(i))}
    if not todo:
        return StripResult(wheel)
    strip = find_strip(env)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / wheel.name
    done: list[Stripped] = []
    with tempfile.TemporaryDirectory(prefix=".kforge-strip-", dir=out_dir) as tmp, zipfile.ZipFile(wheel) as src:
        staged = Path(tmp) / wheel.name  # WheelFile reads the dist-info name from the file name
        record = next((i for i in src.infolist() if i.filename.endswith(".dist-info/RECORD")
                       and i.filename.count("/") == 1), None)
        with _RelabelledWheel(staged, "w") as dst:
            dst.record_date = record.date_time if record else (1980, 1, 1, 0, 0, 0)
            for info in src.infolist():
                if info is record or info.filename.endswith((".dist-info/RECORD.jws", ".dist-info/RECORD.p7s")):
                    continue  # WheelFile writes RECORD; a signature of the old one would be wrong
                data = src.read(info)
                if info.filename in todo:
                    data, one = _strip_one(strip, info.filename, data, Path(tmp), env, runner)
                    done.append(one)
                out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                out.external_attr, out.compress_type = info.external_attr, info.compress_type
                dst.writestr(out, data)
        os.replace(staged, target)
    return StripResult(target, tuple(done))


def _strip_one(strip: str, member: str, data: bytes, tmp: Path, env: Mapping[str, str],
               runner: Runner) -> tuple[bytes, Stripped]:
    before = debug_sections_of(data)
    src, dst = tmp / "in.so", tmp / "out.so"
    src.write_bytes(data)
    dst.unlink(missing_ok=True)
    cmd = [strip, "--strip-debug", "-o", str(dst), str(src)]
    code, log = runner(cmd, env)
    if code != 0 or not dst.is_file():
        raise RepairError(f"`strip --strip-debug` failed on {member}", why=f"it exited with {code}: {_tail(log, 5)}",
                          fix="run it by hand on the binary to see why, or keep the debug info with --keep-debug "
                              "(KFORGE_STRIP_DEBUG=0)")
    out = dst.read_bytes()
    left = debug_sections_of(out)
    if left:
        raise RepairError(f"`strip --strip-debug` left {', '.join(left)} in {member}",
                          why=f"{strip} did not remove the host debug sections", fix="use GNU binutils' strip")
    return out, Stripped(member, len(data), len(out), before)


def _vendored(member: str) -> bool:
    return any(part.endswith(".libs") for part in member.split("/")[:-1])

"""kforge's ninja shim with a real ninja and sleep-based "compile units": the longest start first, nothing else changes.

Also pins the fact the shim exists for: ninja (1.11 and 1.13 checked) starts equal-weight edges in file
order and ignores the times in ``.ninja_log`` -- a seeded log does not change the order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kforge import buildorder, ninjaorder

NINJA = shutil.which("ninja", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
pytestmark = pytest.mark.skipif(NINJA is None, reason="no ninja on PATH (pip install ninja)")

#: (object, seconds) in the order a setup.py would list them: the longest last, as flash-attn's fwd_split.
UNITS = [("csrc/a_short.o", 0.05), ("csrc/b_mid.o", 0.3), ("csrc/c_long.o", 0.9), ("csrc/d_mid.o", 0.5),
         ("csrc/e_longest.o", 1.2)]


def _torch_like_build_file(tmp: Path) -> Path:
    """A build.ninja shaped like torch's _write_ninja_file: variables, rules, one edge per source, no link edge."""
    lines = ["ninja_required_version = 1.3", "cuda_cflags = -DFAKE", "", "rule cuda_compile",
             f"  command = {sys.executable} -c \"import sys,time,os; "
             "open('starts.txt','a').write(sys.argv[1]+chr(10)); time.sleep(float(sys.argv[2])); "
             "open(sys.argv[1],'w').close()\" $out $dur $cuda_cflags", ""]
    for obj, seconds in UNITS:
        src = tmp / obj.replace(".o", ".cu")
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text("// fake\n")
        lines += [f"build {tmp / obj}: cuda_compile {src}", f"  dur = {seconds}", ""]
    lines += ["", "default " + " ".join(str(tmp / o) for o, _ in UNITS), ""]
    path = tmp / "build.ninja"
    path.write_text("\n".join(lines))
    return path


def _starts(tmp: Path) -> list[str]:
    return [Path(line).name for line in (tmp / "starts.txt").read_text().splitlines()]


def _clean(tmp: Path) -> None:
    for obj, _ in UNITS:
        (tmp / obj).unlink(missing_ok=True)
    (tmp / "starts.txt").unlink(missing_ok=True)


def _commands(ninja: str, tmp: Path) -> list[str]:
    out = subprocess.run([ninja, "-t", "commands"], cwd=tmp, capture_output=True, text=True, check=True).stdout
    return sorted(out.splitlines())


def test_ninja_ignores_a_seeded_ninja_log(tmp_path: Path) -> None:
    _torch_like_build_file(tmp_path)
    subprocess.run([NINJA, "-j1"], cwd=tmp_path, check=True, capture_output=True)
    first = _starts(tmp_path)
    assert first == [Path(o).name for o, _ in UNITS]  # file order
    assert (tmp_path / ".ninja_log").is_file()  # the log now holds every edge's time
    _clean(tmp_path)
    subprocess.run([NINJA, "-j1"], cwd=tmp_path, check=True, capture_output=True)
    assert _starts(tmp_path) == first  # still file order: the measured times are not used


@pytest.mark.parametrize("jobs", [1, 2])
def test_shim_starts_the_longest_first_and_changes_no_command(tmp_path: Path, jobs: int) -> None:
    build = _torch_like_build_file(tmp_path)
    before = _commands(NINJA, tmp_path)
    mtime = build.stat().st_mtime_ns
    # times as kforge keeps them: keyed by the tail of the output path, from another scratch tree
    times = [(ninjaorder.unit_key("/elsewhere/build/temp.linux/" + o), s * 100) for o, s in UNITS]
    setup = buildorder.install(times, dest=tmp_path / "order", env={"PATH": str(Path(NINJA).parent)})
    assert setup is not None and setup.ninja == NINJA
    env = {**os.environ, "PATH": setup.env["PATH"]}
    assert shutil.which("ninja", path=env["PATH"]) == str(setup.shim)
    subprocess.run(["ninja", "-v", "-j", str(jobs)], cwd=tmp_path, env=env, check=True, capture_output=True)
    longest_first = [Path(o).name for o, _ in sorted(UNITS, key=lambda u: -u[1])]
    starts = _starts(tmp_path)
    # the first `jobs` units start together (their lines race); every later one when a slot frees
    assert set(starts[:jobs]) == set(longest_first[:jobs]) and starts[jobs:] == longest_first[jobs:]
    assert _commands(NINJA, tmp_path) == before  # same edges, same commands
    assert build.stat().st_mtime_ns == mtime
    assert buildorder.summarize(setup.log) == [f"ninja order: 5 of 5 measured edges moved (longest first) in {build}"]


def test_shim_without_measured_times_is_not_installed_and_order_stays(tmp_path: Path) -> None:
    build = _torch_like_build_file(tmp_path)
    text = build.read_text()
    assert buildorder.install([], dest=tmp_path / "order", env={"PATH": str(Path(NINJA).parent)}) is None
    # times for other units only: the shim runs ninja on the untouched file
    setup = buildorder.install([("other/unit.o", 5.0)], dest=tmp_path / "order", env={"PATH": str(Path(NINJA).parent)})
    assert setup is not None
    subprocess.run([str(setup.shim), "-j1"], cwd=tmp_path, check=True, capture_output=True)
    assert build.read_text() == text
    assert _starts(tmp_path) == [Path(o).name for o, _ in UNITS]


def test_shim_passes_tools_and_version_through(tmp_path: Path) -> None:
    _torch_like_build_file(tmp_path)
    setup = buildorder.install([("csrc/e_longest.o", 9.0)], dest=tmp_path / "order", env={"PATH": str(Path(NINJA).parent)})
    assert setup is not None
    real = subprocess.run([NINJA, "--version"], capture_output=True, text=True, check=True).stdout
    assert subprocess.run([str(setup.shim), "--version"], capture_output=True, text=True, check=True).stdout == real
    text = (tmp_path / "build.ninja").read_text()
    subprocess.run([str(setup.shim), "-t", "commands"], cwd=tmp_path, capture_output=True, check=True)
    assert (tmp_path / "build.ninja").read_text() == text

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

from kforge.build import ninjaorder
from kforge.build import order as buildorder

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
    assert buildorder.summarize(setup.log) == [f"ninja order: 5 edges with a measured time, 5 statements moved (longest first) in {build}"]


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


SETUP_PY = """
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
setup(name="orderprobe", ext_modules=[CppExtension("orderprobe", ["a.cpp", "b.cpp", "c.cpp"])],
      cmdclass={"build_ext": BuildExtension})
"""


def test_torch_buildextension_runs_the_shim(tmp_path: Path) -> None:
    """torch's own BuildExtension writes build.ninja and runs `ninja` from PATH: the shim reorders it, the build works."""
    pytest.importorskip("torch.utils.cpp_extension", reason="needs torch (CPU is enough)")
    pytest.importorskip("setuptools")
    (tmp_path / "setup.py").write_text(SETUP_PY)
    for name in "abc":
        (tmp_path / f"{name}.cpp").write_text(f"int probe_{name}() {{ return 1; }}\n")
    times = [("c.o", 30.0), ("b.o", 20.0), ("a.o", 10.0)]  # file order a, b, c: reversed by the shim
    setup = buildorder.install(times, dest=tmp_path / "order", env={"PATH": os.environ.get("PATH", "")
                                                                    + os.pathsep + str(Path(NINJA).parent)})
    assert setup is not None
    env = {**os.environ, "PATH": setup.env["PATH"], "MAX_JOBS": "1"}
    out = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    build_file = next((tmp_path / "build").glob("temp.*/build.ninja"))
    objects = [line.split(":")[0].rsplit("/", 1)[-1] for line in build_file.read_text().splitlines()
               if line.startswith("build ")]
    assert objects == ["c.o", "b.o", "a.o"]
    assert buildorder.summarize(setup.log) == [f"ninja order: 3 edges with a measured time, 2 statements moved (longest first) in {build_file}"]
    assert list((tmp_path / "build").glob("lib.*/orderprobe*.so"))


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None, reason="needs cmake and cc")
def test_cmake_ninja_generator_runs_the_shim(tmp_path: Path) -> None:
    """CMake finds the shim as its make program on PATH; the compile edges run longest first, the library links."""
    (tmp_path / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(p C)\n"
                                             "add_library(p SHARED a.c b.c c.c)\n")
    for name in "abc":
        (tmp_path / f"{name}.c").write_text(f"int f_{name}(void) {{ return 1; }}\n")
    setup = buildorder.install([("p.dir/c.c.o", 30.0), ("p.dir/b.c.o", 20.0), ("p.dir/a.c.o", 10.0)],
                               dest=tmp_path / "order", env={"PATH": str(Path(NINJA).parent) + os.pathsep
                                                             + os.environ.get("PATH", "")})
    assert setup is not None
    env = {**os.environ, "PATH": setup.env["PATH"]}
    subprocess.run(["cmake", "-S", ".", "-B", "b", "-G", "Ninja"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    assert f"CMAKE_MAKE_PROGRAM:FILEPATH={setup.shim}" in (tmp_path / "b" / "CMakeCache.txt").read_text()
    out = subprocess.run(["cmake", "--build", "b", "-j1", "-v"], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True).stdout
    compiled = [line.split(" -o ")[1].split()[0].rsplit("/", 1)[-1] for line in out.splitlines() if " -c " in line]
    assert compiled == ["c.c.o", "b.c.o", "a.c.o"]
    assert (tmp_path / "b" / "libp.so").is_file()

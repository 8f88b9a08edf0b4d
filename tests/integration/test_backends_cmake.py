"""The cmake backend on ``tests/fixtures/cmake_tiny``: real CMake, Ninja and nvcc (one arch).

Configure, build (progress from ninja's ``[n/m]``), install, ctest (a CPU-only test), pack;
then the failing-build path with the kernel compiled out.
"""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
from kforge_testkit import forge_toml

from kforge.backends import BuildRequest, BuildResult, get_backend
from kforge.build.profiles import load_profile
from kforge.build.report import parse_ninja_log
from kforge.config.forge import load_forge
from kforge.config.targets import parse_target
from kforge.doctor.elf import read_elf
from kforge.errors import BuildError
from kforge.plan import PlanOptions, make_plan

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cmake_tiny"
FORGE_TOML = forge_toml("""
[projects.cmtiny]
source = { local = "cmake_tiny" }
archs = ["sm_90"]
backend = "cmake"
arch_knobs = [{ env = "CMAKE_CUDA_ARCHITECTURES", format = "cmake" }]
""", torch=(), python=("3.11",))


@pytest.fixture(scope="module")
def env_and_host(nvcc_env_and_host):
    environ, host = nvcc_env_and_host
    for tool in ("cmake", "ninja"):
        if shutil.which(tool, path=environ.get("PATH")) is None:
            pytest.skip(f"{tool} is not installed (.ci/run installs ninja-build; CMake comes with the image)")
    return environ, host


def build(tmp: Path, env_and_host, *, ctest: bool = False, progress: bool = False, extra_env=None) -> BuildResult:
    environ, host = env_and_host
    (tmp / "forge.toml").write_text(FORGE_TOML)
    forge = load_forge(tmp)
    t = parse_target(forge, "cmtiny-sm90", host.platform)
    plan = make_plan(forge, t, host, PlanOptions(max_jobs=2), job_profile=load_profile(tmp / "cache", t.project, 1))
    tree = tmp / "tree"
    shutil.copytree(FIXTURE, tree)
    request = BuildRequest(plan=plan, tree=tree, out_dir=tmp / "out", work_dir=tmp / "work",
                           env={**environ, **plan.env, **(extra_env or {})}, python=sys.executable,
                           forge_pythons=("3.11",), progress=progress, ctest=ctest)
    return get_backend(plan.backend).build(request)


@pytest.fixture(scope="module")
def built(tmp_path_factory, env_and_host):
    tmp = tmp_path_factory.mktemp("cmtiny")
    capture = pytest.MonkeyPatch()
    import io

    err = io.StringIO()
    capture.setattr(sys, "stderr", err)  # the plain progress lines go to stderr (not a terminal here)
    try:
        result = build(tmp, env_and_host, ctest=True, progress=True)
    finally:
        capture.undo()
    return tmp, result, err.getvalue()


def test_packs_the_install_prefix(built):
    tmp, result, _ = built
    assert result.kind == "cmake-install" and result.artifact == tmp / "out" / "cmtiny-sm90.tar.gz"
    with tarfile.open(result.artifact) as tar:
        names = set(tar.getnames())
        lib = tar.extractfile("cmtiny-sm90/lib/libcmake_tiny.so.0.1.0").read()
    assert {"cmtiny-sm90/include/cmake_tiny.h", "cmtiny-sm90/lib/libcmake_tiny.so",
            "cmtiny-sm90/lib/libcmake_tiny.so.0"} <= names
    # CMAKE_CUDA_ARCHITECTURES from the plan's knob: SASS for sm_90
    assert "sm_90" in read_elf(lib, "libcmake_tiny.so.0.1.0").sass_archs


def test_log_ctest_progress_ninja_log_and_units(built):
    tmp, result, err = built
    log = result.log.read_text()
    for step in ("cmake configure", "cmake build", "cmake install", "ctest"):
        assert f"==== kforge: {step} of cmtiny-sm90 (attempt 1" in log
    assert "-G Ninja" in log and "-DCMAKE_CUDA_ARCHITECTURES=" in log and "--parallel 2" in log
    assert "100% tests passed" in log

    assert re.search(r"building cmtiny-sm90: (\d+)/\1 units, \d+:\d\d elapsed, ETA 0:00", err), err

    (ninja_log,) = result.ninja_logs
    assert ninja_log == (tmp / "work" / "build" / ".ninja_log").resolve()
    outputs = [e.output for e in parse_ninja_log(ninja_log)]
    assert "CMakeFiles/cmake_tiny.dir/src/tiny.cu.o" in outputs

    units = {u.output: u for u in result.units}
    cu = units["CMakeFiles/cmake_tiny.dir/src/tiny.cu.o"]  # measured by the launcher, named as ninja names it
    assert cu.returncode == 0 and cu.seconds > 0 and cu.peak_rss > 20 * 2**20
    assert result.peak_rss >= cu.peak_rss * 0.5 and result.retried_with_jobs is None


def test_a_broken_build_raises_build_error_with_the_compiler_error(tmp_path, env_and_host):
    with pytest.raises(BuildError) as err:
        build(tmp_path, env_and_host, extra_env={"CMAKE_ARGS": "-DCMAKE_CUDA_FLAGS=-DCMAKE_TINY_BROKEN"})
    text = err.value.render()
    assert err.value.what.startswith("cmake build of cmtiny-sm90 failed: ") and "--build" in err.value.what
    assert "cmake_tiny_add_kernel" in text and "first errors:" in text
    assert str(tmp_path / "work" / "build.log") in text
    assert not (tmp_path / "out").exists()  # nothing packed

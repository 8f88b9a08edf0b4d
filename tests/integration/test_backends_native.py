"""The native backend on tiny real CUDA projects: real pip, real nvcc (one arch, -O0), real ninja.

* ``upstream_tiny``: setup.py calling nvcc directly, with the TINY_CUDA_ARCHS knob.
* ``ninja_tiny``: builds through ninja like torch's BuildExtension (``[n/m]`` lines,
  ``build/temp.*/.ninja_log``, ``PYTORCH_NVCC``), for progress, ninja logs and unit measures.
* ``skbuild_tiny``: scikit-build-core, like kernels/fmha (``SKBUILD_BUILD_DIR``, CMake's launcher).
* a broken copy of ``upstream_tiny``: the failing-build path.
"""

from __future__ import annotations

import re
import shutil
import sys
import zipfile
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

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FORGE_TOML = forge_toml("""
[projects.tiny]
source = { local = "tiny" }
archs = ["sm_90"]
build_isolation = false
arch_knobs = [{ env = "TINY_CUDA_ARCHS", format = "numbers" }]
env = { TINY_NVCC_FLAGS = "-O0" }

[projects.sk]
source = { local = "sk" }
archs = ["sm_90"]
build_isolation = false
arch_knobs = [{ env = "CMAKE_CUDA_ARCHITECTURES", format = "cmake" }]

[projects.nt]
source = { local = "nt" }
archs = ["sm_90"]
torch_abi = true
build_isolation = false
arch_knobs = [{ env = "NINJA_TINY_ARCHS", format = "numbers" }]
""", python=("3.11",))


@pytest.fixture(scope="module")
def env_and_host(nvcc_env_and_host):
    environ, host = nvcc_env_and_host
    if host.platform != "linux-x86_64":
        pytest.skip(f"these tests build linux-x86_64 wheels; this host is {host.platform}")
    return environ, host


def build(tmp: Path, env_and_host, target: str, fixture: str, *, progress: bool = False,
          mutate=None) -> BuildResult:
    environ, host = env_and_host
    (tmp / "forge.toml").write_text(FORGE_TOML)
    forge = load_forge(tmp)
    t = parse_target(forge, target, host.platform)
    plan = make_plan(forge, t, host, PlanOptions(max_jobs=2), job_profile=load_profile(tmp / "cache", t.project, 1))
    tree = tmp / "tree"
    shutil.copytree(FIXTURES / fixture, tree)
    if mutate:
        mutate(tree)
    request = BuildRequest(plan=plan, tree=tree, out_dir=tmp / "out", work_dir=tmp / "work",
                           env={**environ, **plan.env}, python=sys.executable, forge_pythons=("3.11",),
                           progress=progress)
    return get_backend(plan.backend).build(request)


def so_report(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".so")]
        return read_elf(zf.read(name), name)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, env_and_host) -> BuildResult:
    return build(tmp_path_factory.mktemp("tiny"), env_and_host, "tiny-sm90", "upstream_tiny")


def test_tiny_builds_one_wheel_for_the_planned_arch(tiny):
    assert tiny.kind == "wheel" and tiny.artifacts == (tiny.artifact,)
    assert re.fullmatch(r"tiny_upstream-0\.1\.0-cp3\d+-cp3\d+-linux_x86_64\.whl", tiny.artifact.name)
    assert tiny.artifact.parent.name == "out" and tiny.artifact.is_file()
    assert so_report(tiny.artifact).sass_archs == ("sm_90",)  # TINY_CUDA_ARCHS=90 reached nvcc, and only it


def test_tiny_log_time_and_peak_memory(tiny):
    log = tiny.log.read_text()
    assert "==== kforge: pip wheel of tiny-sm90 (attempt 1, MAX_JOBS=2" in log
    assert "-gencode arch=compute_90,code=sm_90" in log and "-O0" in log  # the plan's knobs, as nvcc saw them
    assert "Successfully built tiny-upstream" in log
    assert tiny.seconds > 0 and tiny.retried_with_jobs is None
    assert 20 * 2**20 < tiny.peak_rss < 8 * 2**30  # cicc/ptxas: tens to hundreds of MB
    assert tiny.ninja_logs == () and tiny.units == ()  # no ninja, no torch hook in this project


def test_ninja_build_progress_logs_and_units(tmp_path, env_and_host, capsys):
    result = build(tmp_path, env_and_host, "nt-sm90", "ninja_tiny", progress=True)
    assert result.artifact.name.startswith("ninja_tiny-0.1.0-") and "sm_90" in so_report(result.artifact).sass_archs

    # live progress from ninja's [n/m] lines (stderr is not a terminal here: plain lines)
    err = capsys.readouterr().err
    assert re.search(r"building nt-sm90: 3/3 units, \d+:\d\d elapsed, ETA 0:00", err), err

    # the .ninja_log the build wrote inside the tree, readable by the build report
    (ninja_log,) = result.ninja_logs
    assert ninja_log.parent.parent == tmp_path / "tree" / "build" and ninja_log.parent.name.startswith("temp.")
    outputs = {Path(e.output).name for e in parse_ninja_log(ninja_log)}
    assert {"kernel.o", "api.o"} <= outputs and len(outputs) == 3

    # each unit measured through PYTORCH_NVCC, named as ninja names it
    units = {Path(u.output).name: u for u in result.units}
    assert {"kernel.o", "api.o"} <= set(units)
    for name in ("kernel.o", "api.o"):
        assert units[name].returncode == 0 and units[name].seconds > 0 and units[name].peak_rss > 20 * 2**20
    assert result.peak_rss >= max(u.peak_rss for u in result.units) * 0.5


def test_scikit_build_core_project(tmp_path, env_and_host, capsys):
    pytest.importorskip("scikit_build_core", reason="scikit-build-core builds this fixture without isolation")
    result = build(tmp_path, env_and_host, "sk-sm90", "skbuild_tiny", progress=True)
    assert result.artifact.name == "skbuild_tiny-0.1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(result.artifact) as zf:
        lib = zf.read("skbuild_tiny/libskbuild_tiny.so")
    assert read_elf(lib, "libskbuild_tiny.so").sass_archs == ("sm_90",)  # CMAKE_CUDA_ARCHITECTURES from the plan

    assert re.search(r"building sk-sm90: 3/3 units, \d+:\d\d elapsed, ETA 0:00", capsys.readouterr().err)
    # SKBUILD_BUILD_DIR put CMake's build dir (and its .ninja_log) under the build's work dir
    assert result.ninja_logs == ((tmp_path / "work" / "skbuild" / ".ninja_log").resolve(),)
    ninja_outputs = {e.output for e in parse_ninja_log(result.ninja_logs[0])}
    # units measured through CMAKE_CUDA_COMPILER_LAUNCHER, named as ninja names them; CMake's probes left out
    units = {u.output: u for u in result.units}
    assert set(units) == {"CMakeFiles/skbuild_tiny.dir/csrc/kernel.cu.o", "CMakeFiles/skbuild_tiny.dir/csrc/api.cu.o"}
    assert set(units) <= ninja_outputs
    assert all(u.peak_rss > 20 * 2**20 and u.returncode == 0 for u in units.values())


def _break(tree: Path) -> None:
    src = tree / "csrc" / "tiny.cu"
    src.write_text(src.read_text() + "\nthis_is_not_cuda oops;\n")


def test_a_broken_build_raises_build_error_with_the_tail(tmp_path, env_and_host):
    with pytest.raises(BuildError) as err:
        build(tmp_path, env_and_host, "tiny-sm90", "upstream_tiny", mutate=_break)
    text = err.value.render()
    assert err.value.what.startswith("pip wheel of tiny-sm90 failed: ") and " -m pip wheel " in err.value.what
    assert "exit code 1" in text.lower()
    assert "this_is_not_cuda" in text  # nvcc's error, from the tail of the output
    assert str(tmp_path / "work" / "build.log") in text
    assert "Traceback (most recent call last)" not in err.value.what
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())

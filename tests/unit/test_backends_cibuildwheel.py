"""The cibuildwheel backend: the generated CIBW_* configuration, checked by cibuildwheel itself
(``--print-build-identifiers`` and its own option reader, offline), and the fail-fast paths."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from kforge_testkit import forge_toml
from packaging.version import Version

from kforge.backends import BuildRequest
from kforge.backends.cibuildwheel import (
    CibuildwheelBackend,
    build_identifiers,
    cibuildwheel_env,
    container_engine,
    quote,
)
from kforge.build.host import HostFacts, Resources
from kforge.build.profiles import load_profile
from kforge.config.forge import load_forge
from kforge.config.targets import parse_target
from kforge.errors import BuildError, ConfigError
from kforge.plan import PlanOptions, make_plan

cibw_environment = pytest.importorskip("cibuildwheel.environment", reason="cibuildwheel is a test dependency")

PYTHONS = ("3.10", "3.11", "3.12", "3.13")
FORGE_TOML = forge_toml("""
[projects.fa]
source = { local = "fa" }
archs = ["sm_90", "sm_120"]
torch_abi = true
build_isolation = false
arch_knobs = [{ env = "FLASH_ATTN_CUDA_ARCHS", format = "numbers" }]
env = { FLASH_ATTENTION_FORCE_BUILD = "TRUE" }
local_version_env = "FLASH_ATTN_LOCAL_VERSION"
repair_exclude = ["libfoo.so*"]

[projects.mla]
source = { local = "mla" }
archs = ["sm_120a"]
torch_abi = true
build_isolation = false
arch_knobs = [{ env = "NVCC_APPEND_FLAGS", format = "gencode" }]

[projects.fmha]
source = { local = "fmha" }
archs = ["sm_90a"]
torch_abi = false
arch_knobs = [{ env = "CMAKE_CUDA_ARCHITECTURES", format = "cmake" }]
""", cuda=("13.0", "12.8"), arm=True, windows=True)


def plan_for(tmp_path: Path, target: str, **options):
    (tmp_path / "forge.toml").write_text(FORGE_TOML)
    forge = load_forge(tmp_path)
    host = HostFacts(platform="linux-x86_64", python="3.11", resources=Resources(16, 100 * 2**30, 128 * 2**30),
                     cuda_version=Version("13.0"), nvcc_path="/host/cuda/bin/nvcc",
                     cuda_home="/host/cuda")
    t = parse_target(forge, target, host.platform)
    return make_plan(forge, t, host, PlanOptions(**options), job_profile=load_profile(tmp_path / "c", t.project, 1))


def container_env(cibw: dict[str, str]) -> dict[str, str]:
    """CIBW_ENVIRONMENT as cibuildwheel evaluates it in a build whose PATH is /usr/bin."""
    parsed = cibw_environment.parse_environment(cibw["CIBW_ENVIRONMENT"])
    return parsed.as_dictionary(prev_environment={"PATH": "/usr/bin"})


# ---------------------------------------------------------------------------- generated configuration


def test_torch_project_on_linux(tmp_path):
    plan = plan_for(tmp_path, "fa-sm120")
    cibw = cibuildwheel_env(plan, PYTHONS, "linux")
    assert cibw["CIBW_BUILD"].split() == [f"cp3{m}-manylinux_x86_64" for m in (10, 11, 12, 13)]
    assert cibw["CIBW_ARCHS"] == "x86_64"
    assert cibw["CIBW_MANYLINUX_X86_64_IMAGE"] == "manylinux_2_28"
    assert cibw["CIBW_BUILD_FRONTEND"] == "pip; args: --no-build-isolation"
    assert cibw["CIBW_TEST_SKIP"] == "*" and cibw["CIBW_BUILD_VERBOSITY"] == "1"

    before_all = cibw["CIBW_BEFORE_ALL_LINUX"]
    assert "compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo" in before_all
    for pkg in ("cuda-nvcc-13-0", "cuda-cudart-devel-13-0", "cuda-cccl-13-0", "libcublas-devel-13-0"):
        assert pkg in before_all.split()
    assert "torch==2.11.0 --index-url https://download.pytorch.org/whl/cu130" in cibw["CIBW_BEFORE_BUILD"]
    assert cibw["CIBW_REPAIR_WHEEL_COMMAND_LINUX"].endswith(
        "kforge repair --target fa-sm120 --wheel {wheel} --dest-dir {dest_dir} --strip-debug --exclude 'libfoo.so*' "
        "--torch-abi")  # --strip-debug: the plan's debug line (strip_debug defaults to true), inside the container
    assert "pip install -q 'kforge[repair]==" in cibw["CIBW_REPAIR_WHEEL_COMMAND_LINUX"]

    env = container_env(cibw)
    # every knob of the plan, except paths of the host the plan was made on
    for key, value in plan.env.items():
        if key not in ("CUDA_HOME", "CUDACXX", "CPLUS_INCLUDE_PATH"):
            assert env[key] == value, key
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "120" and env["FLASH_ATTN_LOCAL_VERSION"] == "cu130torch2.11.sm120"  # arch label: not a release set
    assert env["MAX_JOBS"] == str(plan.jobs.max_jobs) and env["NVCC_THREADS"] == str(plan.jobs.nvcc_threads)
    assert env["CUDA_HOME"] == "/usr/local/cuda-13.0" and env["CUDACXX"] == "/usr/local/cuda-13.0/bin/nvcc"
    assert env["CPLUS_INCLUDE_PATH"] == "/usr/local/cuda-13.0/include/cccl"  # CUDA 13's CCCL for g++, in the container
    assert env["PATH"] == "/usr/local/cuda-13.0/bin:/usr/bin"
    assert "/host/cuda" not in cibw["CIBW_ENVIRONMENT"]


def test_torch_free_project_builds_once_with_the_lowest_python(tmp_path):
    plan = plan_for(tmp_path, "fmha-sm90")
    cibw = cibuildwheel_env(plan, ("3.12", "3.10", "3.11"), "linux")
    assert cibw["CIBW_BUILD"] == "cp310-manylinux_x86_64"
    assert "CIBW_BUILD_FRONTEND" not in cibw and "CIBW_BEFORE_BUILD" not in cibw  # isolated, no torch
    assert "libcublas" not in cibw["CIBW_BEFORE_ALL_LINUX"]
    assert container_env(cibw)["CMAKE_CUDA_ARCHITECTURES"] == plan.env["CMAKE_CUDA_ARCHITECTURES"]


def test_cuda_version_and_machine_follow_the_plan(tmp_path):
    plan = plan_for(tmp_path, "fa-sm90-linux-arm", cuda="12.8")
    cibw = cibuildwheel_env(plan, PYTHONS, "linux")
    assert cibw["CIBW_ARCHS"] == "aarch64" and cibw["CIBW_MANYLINUX_AARCH64_IMAGE"] == "manylinux_2_28"
    assert "repos/rhel8/sbsa/" in cibw["CIBW_BEFORE_ALL_LINUX"] and "cuda-nvcc-12-8" in cibw["CIBW_BEFORE_ALL_LINUX"]
    assert "whl/cu128" in cibw["CIBW_BEFORE_BUILD"]
    assert container_env(cibw)["CUDA_HOME"] == "/usr/local/cuda-12.8"


def test_windows_configuration(tmp_path):
    plan = plan_for(tmp_path, "mla-sm120-windows")
    cibw = cibuildwheel_env(plan, PYTHONS, "windows", kforge_command='"C:\\kf\\python.exe" -m kforge.cli')
    assert cibw["CIBW_BUILD"].split() == [f"cp3{m}-win_amd64" for m in (10, 11, 12, 13)]
    assert cibw["CIBW_ARCHS"] == "AMD64"
    assert not any(k.endswith("_LINUX") or "MANYLINUX" in k for k in cibw)
    assert cibw["CIBW_REPAIR_WHEEL_COMMAND_WINDOWS"] == (
        '"C:\\kf\\python.exe" -m kforge.cli repair --target mla-sm120-windows --wheel {wheel} --dest-dir {dest_dir} '
        "--torch-abi")
    env = container_env(cibw)
    assert env["DISTUTILS_USE_SDK"] == "1"
    assert env["NVCC_APPEND_FLAGS"] == plan.env["NVCC_APPEND_FLAGS"] and " " in env["NVCC_APPEND_FLAGS"]
    assert "CUDA_HOME" not in env  # Windows builds use the host's own CUDA_PATH


def test_environment_quoting_round_trips_through_cibuildwheel(tmp_path):
    nasty = {"Q": 'say "hi"', "D": "$HOME/x", "B": "back\\slash", "T": "`uname`", "S": "a;b c", "E": "it's"}
    plan = plan_for(tmp_path, "fmha-sm90", env=nasty)
    env = container_env(cibuildwheel_env(plan, PYTHONS, "linux"))
    for key, value in nasty.items():
        assert env[key] == value
    assert quote('a"b') == '"a\\"b"'


def test_unknown_python_version_is_an_error(tmp_path):
    with pytest.raises(BuildError, match="not a CPython version"):
        build_identifiers(True, ("3.11", "pypy3.10"), "linux", "x86_64")


# ---------------------------------------------------------------------------- checked by cibuildwheel itself


@pytest.fixture()
def package(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "pkg"\nversion = "1.0"\n')
    return pkg


@pytest.mark.parametrize(("target", "platform", "pythons"), [
    ("fa-sm120", "linux", PYTHONS),
    ("fa-sm90-linux-arm", "linux", ("3.11", "3.12")),
    ("mla-sm120-windows", "windows", PYTHONS),
    ("fmha-sm90", "linux", PYTHONS),
])
def test_cibuildwheel_lists_exactly_the_expected_identifiers(tmp_path, package, target, platform, pythons):
    plan = plan_for(tmp_path, target)
    cibw = cibuildwheel_env(plan, pythons, platform)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    proc = subprocess.run([sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", platform,
                           str(package)], env={**env, **cibw}, capture_output=True, text=True, cwd=package, timeout=120)
    assert proc.returncode == 0, proc.stderr
    machine = "aarch64" if "arm" in target else "x86_64"
    expected = build_identifiers(plan.project.torch_abi, pythons, platform, machine)
    assert proc.stdout.split() == list(expected)
    assert len(expected) == (len(pythons) if plan.project.torch_abi else 1)


@pytest.mark.parametrize(("target", "platform"), [("fa-sm120", "linux"), ("mla-sm120-windows", "windows")])
def test_cibuildwheel_reads_every_option_as_intended(tmp_path, package, target, platform):
    """cibuildwheel's own option reader (what a real run uses) parses each generated value."""
    from cibuildwheel.options import CommandLineArguments, compute_options

    plan = plan_for(tmp_path, target)
    cibw = cibuildwheel_env(plan, PYTHONS, platform)
    args = dataclasses.replace(CommandLineArguments.defaults(), platform=platform, package_dir=package,
                               output_dir=tmp_path / "wh")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}, **cibw}
    options = compute_options(platform, args, env)
    for ident in cibw["CIBW_BUILD"].split():
        bo = options.build_options(ident)
        assert bo.build_frontend is not None and bo.build_frontend.name == "pip"
        assert bo.build_frontend.args == ["--no-build-isolation"]
        assert bo.build_verbosity == 1
        assert "--target " + plan.id in bo.repair_command
        assert f"torch=={plan.toolchain.torch}" in (bo.before_build or "")
        parsed = bo.environment.as_dictionary(prev_environment={"PATH": "/usr/bin"})
        assert parsed["MAX_JOBS"] == plan.env["MAX_JOBS"]
        if platform == "linux":
            assert bo.manylinux_images is not None and "manylinux_2_28_x86_64" in bo.manylinux_images["x86_64"]
            assert bo.before_all.startswith("dnf install")


# ---------------------------------------------------------------------------- fail fast


def _fake_tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _request(tmp_path, plan, env) -> BuildRequest:
    tree = tmp_path / "tree"
    tree.mkdir(exist_ok=True)
    return BuildRequest(plan=plan, tree=tree, out_dir=tmp_path / "out", work_dir=tmp_path / "work",
                        env=env, python=sys.executable, forge_pythons=PYTHONS, progress=False)


def test_no_container_engine_fails_fast_and_points_at_native(tmp_path):
    plan = plan_for(tmp_path, "fa-sm120")
    with pytest.raises(BuildError) as err:
        CibuildwheelBackend(host_os="linux").build(_request(tmp_path, plan, {"PATH": str(tmp_path / "empty")}))
    text = err.value.render()
    assert "container engine" in text and "--backend native" in text
    assert "docker is not installed; podman is not installed" in text.lower()
    assert not (tmp_path / "work").exists()  # nothing ran


def test_a_docker_without_daemon_is_reported(tmp_path):
    bin_dir = tmp_path / "bin"
    _fake_tool(bin_dir, "docker",
               'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1\n')
    plan = plan_for(tmp_path, "fa-sm120")
    with pytest.raises(BuildError) as err:
        CibuildwheelBackend(host_os="linux").build(_request(tmp_path, plan, {"PATH": str(bin_dir)}))
    assert "`docker info` failed with exit code 1: Cannot connect to the Docker daemon" in err.value.render()


def test_container_engine_picks_the_first_that_works(tmp_path):
    bin_dir = tmp_path / "bin"
    _fake_tool(bin_dir, "docker", "exit 1\n")
    _fake_tool(bin_dir, "podman", "echo ok\n")
    assert container_engine({"PATH": str(bin_dir)}) == ("podman", "")
    engine, why = container_engine({"PATH": str(bin_dir), "CIBW_CONTAINER_ENGINE": "docker; create_args: --gpus all"})
    assert engine is None and "`docker info` failed" in why  # the configured engine only


def test_windows_wheels_need_a_windows_host(tmp_path):
    plan = plan_for(tmp_path, "mla-sm120-windows")
    with pytest.raises(BuildError) as err:
        CibuildwheelBackend(host_os="linux").build(_request(tmp_path, plan, dict(os.environ)))
    assert "only on Windows" in err.value.render() and "--backend native" in err.value.render()


def test_this_machine_fails_fast_when_no_engine_works(tmp_path):
    """The real check against the real environment (skipped where docker or podman does work)."""
    if container_engine(os.environ)[0] is not None:
        pytest.skip("a container engine works here; the fail-fast path is covered with fake engines above")
    plan = plan_for(tmp_path, "fa-sm120")
    with pytest.raises(BuildError, match="--backend native"):
        CibuildwheelBackend().build(_request(tmp_path, plan, dict(os.environ)))


def test_pass_jobs_lets_the_oom_retry_reach_the_container(tmp_path, package):
    from cibuildwheel.options import CommandLineArguments, compute_options

    plan = plan_for(tmp_path, "fa-sm120")
    cibw = cibuildwheel_env(plan, PYTHONS, "linux", pass_jobs=True)
    assert cibw["CIBW_ENVIRONMENT_PASS_LINUX"].split() == ["MAX_JOBS", "NVCC_THREADS", "CMAKE_BUILD_PARALLEL_LEVEL"]
    assert "MAX_JOBS" not in cibw["CIBW_ENVIRONMENT"]
    args = dataclasses.replace(CommandLineArguments.defaults(), platform="linux", package_dir=package)
    host_env = {**{k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}, **cibw,
                "MAX_JOBS": "1", "NVCC_THREADS": "1", "CMAKE_BUILD_PARALLEL_LEVEL": "1"}  # as after a halving
    bo = compute_options("linux", args, host_env).build_options("cp311-manylinux_x86_64")
    inside = bo.environment.as_dictionary(prev_environment={"PATH": "/usr/bin"})
    assert inside["MAX_JOBS"] == "1" and inside["NVCC_THREADS"] == "1"
    assert inside["FLASH_ATTN_CUDA_ARCHS"] == "120"  # the rest of the plan still fixed in CIBW_ENVIRONMENT
    # a project's own thread variable (flashinfer's) is passed too, so the retry's halving reaches it
    own = dataclasses.replace(plan, jobs=dataclasses.replace(plan.jobs, thread_vars=("NVCC_THREADS", "FI_THREADS")),
                              env={**plan.env, "FI_THREADS": plan.env["NVCC_THREADS"]})
    cibw = cibuildwheel_env(own, PYTHONS, "linux", pass_jobs=True)
    assert "FI_THREADS" in cibw["CIBW_ENVIRONMENT_PASS_LINUX"].split() and "FI_THREADS" not in cibw["CIBW_ENVIRONMENT"]


def test_a_kforge_image_bakes_cuda_in_uses_its_python_and_leaves_repair_to_the_host(tmp_path):
    plan = plan_for(tmp_path, "fmha-sm90", backend="cibuildwheel", image="kforge:bullseye")
    assert plan.image == "kforge:bullseye" and plan.platform_tag == "manylinux_2_31"  # the image's glibc
    ref = "localhost/kforge-build:bullseye-cu130-0123456789ab"
    cibw = cibuildwheel_env(plan, PYTHONS, "linux", image_ref=ref, image_pythons=("3.9",))
    assert cibw["CIBW_MANYLINUX_X86_64_IMAGE"] == ref and cibw["CIBW_BUILD"] == "cp39-manylinux_x86_64"
    assert "CIBW_BEFORE_ALL_LINUX" not in cibw  # nvcc is in the image
    assert cibw["CIBW_REPAIR_WHEEL_COMMAND_LINUX"] == ""  # kforge repairs on the host, against the platform tag
    assert cibw["CIBW_CONTAINER_ENGINE"] == "podman; create_args: --network=host"
    assert container_env(cibw)["CUDA_HOME"] == "/usr/local/cuda-13.0"


def test_a_torch_project_needs_an_image_with_one_of_its_pythons(tmp_path):
    plan = plan_for(tmp_path, "fa-sm90", backend="cibuildwheel", image="kforge:bullseye")
    with pytest.raises(BuildError) as err:
        cibuildwheel_env(plan, PYTHONS, "linux", image_ref="localhost/x:1", image_pythons=("3.9",))
    assert "has Python 3.9" in str(err.value) and "manylinux_2_28" in str(err.value)


def test_a_torch_project_in_a_kforge_images_torch_layer_builds_its_python_with_pypis_torch(tmp_path):
    plan = plan_for(tmp_path, "fa-sm90", backend="cibuildwheel", image="kforge:bullseye", torch="2.11.0", python="3.12")
    ref = "localhost/kforge-build:bullseye-cu130-cp312-torch2.11.0-0123456789ab"
    cibw = cibuildwheel_env(plan, PYTHONS, "linux", image_ref=ref, image_pythons=("3.9", "3.12"))
    assert cibw["CIBW_BUILD"] == "cp312-manylinux_x86_64"  # the layer's Python, one of forge.toml's
    assert "python -m pip install torch==2.11.0" in cibw["CIBW_BEFORE_BUILD"]
    assert "--index-url" not in cibw["CIBW_BEFORE_BUILD"]  # the layer's torch came from PyPI: same pin, no other index
    assert cibw["CIBW_BUILD_FRONTEND"] == "pip; args: --no-build-isolation"
    # nothing is provisioned on this host: Python and torch are the container's
    assert plan.provisioning is not None and not plan.provisioning.env_needed
    assert "in the build container (kforge:bullseye" in plan.provisioning.part("torch").how


def test_the_platform_tag_reaches_the_repair_inside_official_images(tmp_path):
    plan = plan_for(tmp_path, "fmha-sm90", backend="cibuildwheel", platform_tag="manylinux_2_28")
    cibw = cibuildwheel_env(plan, PYTHONS, "linux")
    assert cibw["CIBW_MANYLINUX_X86_64_IMAGE"] == "manylinux_2_28"
    assert "--plat manylinux_2_28_x86_64" in cibw["CIBW_REPAIR_WHEEL_COMMAND_LINUX"]


def test_an_image_option_on_a_native_build_is_refused_at_plan_time(tmp_path):
    with pytest.raises(ConfigError) as err:
        plan_for(tmp_path, "fmha-sm90", image="kforge:bullseye")
    assert "--backend cibuildwheel" in str(err.value)

"""The whole chain with a fake backend, repairer, nvcc, doctor and GPU: every step's wiring, in well under a second.

The real tools are covered by tests/integration/test_pipeline.py; here the steps' order, their frozen
results, the cmake path, the lock's work dir, and the GPU-test step's skip/fail/pass rules
(``KFORGE_REQUIRE_GPU``) run against fakes injected through :class:`kforge.pipeline.Services`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import zipfile
from pathlib import Path

import pytest
from kforge_testkit import forge_toml

from kforge import cli, pipeline
from kforge.backends import BuildRequest, BuildResult
from kforge.build.host import HostFacts
from kforge.build.measure import UnitMeasure
from kforge.build.toolchain import Nvcc
from kforge.build.venv import BuildEnv
from kforge.commands import _common
from kforge.cuda.arch import parse_arch
from kforge.doctor import BinaryReport, FatbinEntry, WheelReport
from kforge.errors import BuildError, DoctorError, GPUError, GpuTestError
from kforge.gputest import run_gpu_tests
from kforge.log import StepLog
from kforge.wheels.repair import RepairResult

PROJECTS = """
[projects.tiny]
source = { local = "tiny" }
archs = ["sm_90"]
threads_env = "TINY_THREADS"
gpu_tests = { paths = ["tests"], args = ["-x"] }

[projects.cm]
source = { local = "tiny" }
archs = ["sm_90"]
backend = "cmake"

[projects.pf]
source = { local = "tiny" }
archs = ["sm_90"]

[projects.pf.profiles.small]
compile_units = 1

[projects.pf.profiles.full]
compile_units = 9
"""


class FakeBackend:
    """Writes a wheel (or, as cmake, an install prefix with a library) and reports what it was asked."""

    name = "fake"

    def __init__(self) -> None:
        self.requests: list[BuildRequest] = []

    def build(self, request: BuildRequest) -> BuildResult:
        self.requests.append(request)
        request.out_dir.mkdir(parents=True)
        if not request.plan.makes_wheel:
            lib = request.work_dir / "prefix" / "lib" / "libtiny.so"
            lib.parent.mkdir(parents=True)
            lib.write_bytes(b"\x7fELF fake")
            artifact = request.out_dir / "tiny-install.tar.gz"
            artifact.write_bytes(b"archive")
            return BuildResult(artifact, "cmake-install", 0.1, 1 << 20, (), request.work_dir / "log", None)
        wheel = request.out_dir / "tiny-0.1.0-cp311-cp311-linux_x86_64.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("tiny/_k.so", b"\x7fELF fake")
            zf.writestr("tiny-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny\nVersion: 0.1.0\n")
        units = (UnitMeasure("k.o", 2.0, 1 << 30, 0, 1),)
        return BuildResult(wheel, "wheel", 0.1, 1 << 30, (), request.work_dir / "log", None, units=units)


def fake_repair(wheel: Path, out_dir: Path, *, platform, repairer, policy, platform_policy, lib_paths, python,  # noqa: ANN001
                env) -> RepairResult:
    assert repairer == {"linux": "auditwheel", "windows": "delvewheel"}[platform]  # the plan's choice reached the step
    out_dir.mkdir(parents=True, exist_ok=True)
    fixed = out_dir / wheel.name.replace("linux_x86_64", "manylinux_2_28_x86_64")
    fixed.write_bytes(wheel.read_bytes())
    return RepairResult(fixed, "manylinux_2_28_x86_64", excluded=(), grafted=(), log="")


def fatbin(arch: str) -> FatbinEntry:
    kind, a = "ptx" if arch.startswith("compute_") else "sass", parse_arch(arch)
    return FatbinEntry(kind=kind, arch=arch, major=a.major, minor=a.minor, variant=a.variant, compressed=False,
                       compression=None, size=10, uncompressed_size=10, version="1.8", section=".nv_fatbin",
                       container=0, offset=0, relocatable=False)


def binary_with(*archs: str) -> BinaryReport:
    return BinaryReport(path="tiny/_k.so", format="elf", size=10, fatbins=tuple(fatbin(a) for a in archs), containers=1)


def inspect_as(*archs: str):  # noqa: ANN201
    def inspect(wheel: Path) -> WheelReport:
        return WheelReport(path=str(wheel), filename=wheel.name, name="tiny", version="0.1.0",
                           tags=("cp311-cp311-manylinux_2_28_x86_64",), size=1, sha256="0" * 64,
                           binaries=(binary_with(*archs),), files=("tiny/_k.so",))
    return inspect


def fake_nvcc(tmp_path: Path):  # noqa: ANN201
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True, exist_ok=True)

    def find(plan, environ, cache_dir, say) -> Nvcc:  # noqa: ANN001
        return Nvcc(path=home / "bin" / "nvcc", home=home, version=plan.toolchain.cuda, gpu_archs=frozenset())
    return find


@pytest.fixture()
def mono(tmp_path: Path, forge_and_plan):  # noqa: ANN001
    (tmp_path / "tiny" / "tests").mkdir(parents=True)
    (tmp_path / "tiny" / "tests" / "test_k.py").write_text("def test_k():\n    assert True\n")
    return forge_and_plan(tmp_path, forge_toml(PROJECTS), gpu_arch="sm_90")


def make_run(tmp_path: Path, plan, host, *, inspect=None, environ=None) -> tuple[pipeline.Run, FakeBackend]:  # noqa: ANN001
    backend = FakeBackend()
    services = pipeline.Services(backend=backend, repair_wheel=fake_repair, find_nvcc=fake_nvcc(tmp_path),
                                 detect_torch=lambda python: None,
                                 # what kforge's nvcc wrapper makes a sm_90 build hold (kforge.cuda.enforce)
                                 inspect_wheel=inspect or inspect_as("sm_90", "compute_90"),
                                 inspect_binary=lambda path: binary_with("sm_90", "compute_90"))
    env = {"PATH": "/usr/bin:/bin", "KFORGE_COMPILER_CACHE": "none", **(environ or {})}
    run = pipeline.Run(host=host, environ=env, wheelhouse_root=tmp_path / "wheelhouse", cache_dir=tmp_path / "cache",
                       services=services, log=StepLog(total=9, title=plan.id, environ={}), progress=False)
    return run, backend


def test_the_whole_chain_with_fakes_publishes_a_verified_wheel_and_runs_gpu_tests(tmp_path: Path, mono) -> None:
    plan, host = mono("tiny-sm90", env={"NVCC_THREADS": "3"})
    run, backend = make_run(tmp_path, plan, host)
    outcome = pipeline.run_build(plan, run)

    (request,) = backend.requests
    assert request.env["TINY_THREADS"] == request.env["NVCC_THREADS"] == "3"  # --env reached the project's variable
    assert request.tree == outcome.done.source.tree and request.forge_pythons == plan.pythons
    # kforge's nvcc wrapper (a shadow CUDA home, kforge.cuda.enforce) comes first, then the toolkit's bin
    assert request.env["PATH"].split(os.pathsep)[:2] == [str(plan.work_dir / "nvcc-wrap" / "cuda" / "bin"), str(tmp_path / "cuda" / "bin")]
    assert request.env["PYTORCH_NVCC"] == request.env["CUDA_HOME"] + "/bin/nvcc"
    # what the plan's reproducibility part says (kforge plan --json) is what the build got: seed and path maps
    repro = plan.to_dict()["reproducible"]
    assert repro["path_maps"] == [[str(plan.root), "/kforge"]] and repro["device_maps"]
    assert request.env["NVCC_APPEND_FLAGS"].split() == repro["nvcc_append_flags"]
    assert request.env["CFLAGS"].split() == request.env["CXXFLAGS"].split() == repro["host_flags"]["CFLAGS"]
    wrapper = json.loads(shlex.split(Path(request.env["PYTORCH_NVCC"]).read_text().splitlines()[-1])[-2])
    assert wrapper["path_maps"] == repro["path_maps"]  # the nvcc wrapper maps device code by the same map
    assert [s for s in run.log.timings] == ["preflight", "source", "patches", "toolchain", "build", "report", "repair", "doctor",
                                           "publish"]
    done = outcome.done
    assert done.source is not None and (done.source.tree / "tests" / "test_k.py").is_file()
    assert done.repair and done.repair[0].tag == "manylinux_2_28_x86_64"
    # relabelled with its arch set (kforge.config.wheelname), so other builds of tiny never overwrite it
    assert outcome.wheel == tmp_path / "wheelhouse" / "tiny" / "tiny-0.1.0+sm90-cp311-cp311-manylinux_2_28_x86_64.whl"
    manifest = json.loads(outcome.manifest.read_text())
    assert manifest["archs"] == ["sm_90"] and manifest["toolchain"]["nvcc_threads"] == 3
    assert manifest["repaired_tag"] == "manylinux_2_28_x86_64" and manifest["source_kind"] == "local"
    profile = json.loads((tmp_path / "cache" / "jobs" / "tiny.json").read_text())
    assert profile["arch_counts"]["1"]["samples"] == 1  # the build's measured units reached the job profile

    # the GPU-test step, on the wheel the chain just published: a matching fake GPU runs pip, then pytest
    calls: list[list[str]] = []
    result = run_gpu_tests(plan, host, wheelhouse_root=run.wheelhouse_root, environ=run.environ, log=run.log,
                           runner=lambda cmd, env, cwd=None, capture=False: (calls.append(list(cmd)), (0, ""))[1],
                           inspect_wheel=inspect_as("sm_90"))
    assert result.status == "passed" and result.wheel == outcome.wheel
    assert calls[0][1:4] == ["-m", "pip", "install"] and calls[0][-1] == "tiny==0.1.0+sm90"  # exactly this build
    assert calls[1][1:3] == ["-m", "pytest"] and "/test-tiny-sm90/src/" in calls[1][3] and calls[1][3].endswith("/tests") and "-x" in calls[1]


def test_gpu_test_rules_skip_fail_and_report(tmp_path: Path, mono) -> None:
    plan, host = mono("tiny-sm90")
    run, _ = make_run(tmp_path, plan, host)
    pipeline.run_build(plan, run)
    never = lambda cmd, env, cwd=None, capture=False: pytest.fail(f"ran {cmd}")  # noqa: E731

    def gpu_test(h: HostFacts, environ: dict, **kw):  # noqa: ANN003, ANN202
        return run_gpu_tests(plan, h, wheelhouse_root=run.wheelhouse_root, environ=environ, log=run.log, **kw)

    no_gpu = host.with_(gpu_arch=None, gpu_name=None)
    skipped = gpu_test(no_gpu, {}, runner=never)
    assert skipped.status == "skipped" and "no NVIDIA GPU" in skipped.reason
    with pytest.raises(GPUError, match="no NVIDIA GPU"):
        gpu_test(no_gpu, {"KFORGE_REQUIRE_GPU": "1"}, runner=never)
    # a GPU the wheel has no kernels for (an sm_120 card, the wheel holds sm_90 only): skipped, or failed on demand
    other = host.with_(gpu_arch=parse_arch("sm_120"), gpu_name="RTX 5090")
    skipped = gpu_test(other, {}, runner=never, inspect_wheel=inspect_as("sm_90"))
    assert skipped.status == "skipped" and "RTX 5090" in skipped.reason and "sm_120" in skipped.reason
    with pytest.raises(GPUError):
        gpu_test(other, {"KFORGE_REQUIRE_GPU": "1"}, runner=never, inspect_wheel=inspect_as("sm_90"))
    # a matching GPU whose tests fail: a GpuTestError with pytest's exit code
    failing = lambda cmd, env, cwd=None, capture=False: (1 if "pytest" in cmd else 0, "")  # noqa: E731
    with pytest.raises(GpuTestError, match="exit code 1"):
        gpu_test(host, {}, runner=failing, inspect_wheel=inspect_as("sm_90"))


def test_doctor_step_stops_a_wheel_without_the_planned_arch(tmp_path: Path, mono) -> None:
    plan, host = mono("tiny-sm90")
    run, _ = make_run(tmp_path, plan, host, inspect=inspect_as("sm_80"))
    with pytest.raises(DoctorError, match="sm_90"):
        pipeline.run_build(plan, run)
    assert not (tmp_path / "wheelhouse" / "tiny").exists()  # nothing published
    assert list(run.log.timings)[-1] == "doctor"


def test_cmake_path_verifies_the_library_and_publishes_nothing(tmp_path: Path, mono) -> None:
    plan, host = mono("cm-sm90")
    assert not plan.makes_wheel
    run, _ = make_run(tmp_path, plan, host)
    outcome = pipeline.run_build(plan, run)
    assert list(run.log.timings) == ["preflight", "source", "patches", "toolchain", "build", "report", "doctor"]
    assert outcome.manifest is None and outcome.wheel.name == "tiny-install.tar.gz"
    assert outcome.done.doctor is not None and [p.name for p in outcome.done.doctor.binaries] == ["libtiny.so"]
    assert not (tmp_path / "wheelhouse").exists()


def test_a_torch_free_projects_binaries_may_not_need_torch_in_a_wheel_or_a_cmake_archive(tmp_path: Path, mono) -> None:
    """tiny and cm have torch_abi = false: the doctor step fails a binary that needs libc10/libtorch_python."""
    def needing(lib: str) -> BinaryReport:
        return dataclasses.replace(binary_with("sm_90", "compute_90"), needed=(lib, "libc.so.6"))

    plan, host = mono("cm-sm90")
    assert plan.repair_policy.torch_free
    run, _ = make_run(tmp_path / "cm", plan, host)
    run = dataclasses.replace(run, services=dataclasses.replace(run.services, inspect_binary=lambda _: needing("libc10.so")))
    with pytest.raises(DoctorError, match="needs libc10.so"):
        pipeline.run_build(plan, run)

    plan, host = mono("tiny-sm90")
    wheel = inspect_as("sm_90", "compute_90")
    run, _ = make_run(tmp_path / "tiny", plan, host,
                      inspect=lambda w: dataclasses.replace(wheel(w), binaries=(needing("libtorch_python.so"),)))
    with pytest.raises(DoctorError, match="needs libtorch_python.so"):
        pipeline.run_build(plan, run)
    assert not (tmp_path / "tiny" / "wheelhouse" / "tiny").exists()  # nothing published
    run, _ = make_run(tmp_path / "ok", plan, host)
    outcome = pipeline.run_build(plan, run)
    judged = json.loads(outcome.manifest.read_text())["doctor"]["judged_by"]
    assert judged["torch_free"] is True  # `kforge doctor` on the published wheel checks it again
    assert any(f["code"] == "torch-free" for f in json.loads(outcome.manifest.read_text())["doctor"]["findings"])


def test_a_build_profiles_measured_units_go_to_that_profiles_job_profile(tmp_path: Path, mono) -> None:
    plan, host = mono("pf-sm90", profile="small")
    assert "estimate: 1 units of" in plan.jobs.reason  # the profile's compile_units sized the choice
    pipeline.run_build(plan, make_run(tmp_path, plan, host)[0])
    jobs_dir = tmp_path / "cache" / "jobs"
    assert (jobs_dir / "pf.small.json").is_file() and not (jobs_dir / "pf.full.json").exists()
    assert not (jobs_dir / "pf.json").exists()


def test_a_windows_target_is_refused_before_any_step(tmp_path: Path, forge_and_plan) -> None:
    (tmp_path / "tiny").mkdir()
    make = forge_and_plan(tmp_path, forge_toml(PROJECTS, windows=True), gpu_arch="sm_90")
    plan, host = make("tiny-sm90-windows")
    run, backend = make_run(tmp_path, plan, host)
    with pytest.raises(BuildError, match="this host is linux-x86_64"):
        pipeline.run_build(plan, run)
    assert run.log.timings == {} and backend.requests == []


def test_another_python_adds_the_environment_step_and_the_build_runs_with_its_interpreter(tmp_path: Path, mono) -> None:
    plan, host = mono("tiny-sm90", python="3.10")
    assert plan.variant is not None and plan.variant.id == "cu130-cp310"
    asked: list[object] = []

    def provision(prov, cache_dir, **kw):  # noqa: ANN001, ANN003
        asked.append((prov.variant.id, kw["find_links"]))
        return BuildEnv(tmp_path / "env", tmp_path / "env" / "bin" / "python", prov.variant, prov.requirements, False)

    run, backend = make_run(tmp_path, plan, host)
    run = pipeline.Run(**{**run.__dict__, "services": pipeline.Services(**{**run.services.__dict__, "provision_env": provision})})
    outcome = pipeline.run_build(plan, run)
    assert asked == [("cu130-cp310", None)]
    assert list(run.log.timings)[:4] == ["preflight", "source", "patches", "environment"]
    assert backend.requests[0].python == str(tmp_path / "env" / "bin" / "python")
    assert outcome.done.environment is not None


def test_the_backend_gets_the_environment_and_jobs_of_kforge_plan_json(tmp_path: Path, mono, monkeypatch, capsys) -> None:
    """The plan decides, the steps obey: what ``kforge plan --json`` prints (env, jobs, thread variables) is what
    the backend receives, even where the shell that runs the build says otherwise."""
    plan, host = mono("tiny-sm90", env={"MAX_JOBS": "3", "TINY_THREADS": "2"})
    monkeypatch.setattr(_common, "detect_host", lambda environ: host)
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    assert cli.main(["-C", str(tmp_path), "plan", "tiny-sm90", "--json", "--env", "MAX_JOBS=3",
                     "--env", "TINY_THREADS=2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(plan.to_json())  # the plan the pipeline runs is the one the command printed

    shell = {"MAX_JOBS": "99", "NVCC_THREADS": "7", "TINY_THREADS": "5", "CMAKE_BUILD_PARALLEL_LEVEL": "99"}
    run, backend = make_run(tmp_path, plan, host, environ=shell)
    outcome = pipeline.run_build(plan, run)
    (request,) = backend.requests
    # the one exception, on purpose: kforge's nvcc wrapper (kforge.cuda.enforce) stands in for the toolkit
    wrapper = outcome.done.toolchain.wrapper
    assert wrapper is not None and set(wrapper.env) <= {"PATH", "CUDA_HOME", "CUDA_PATH", "CUDACXX", "PYTORCH_NVCC",
                                                     "CUDA_NVCC_EXECUTABLE"}
    assert all(str(plan.work_dir / "nvcc-wrap") in request.env[k] for k in wrapper.env)
    planned = {k: v for k, v in printed["env"].items() if k not in wrapper.env}
    assert {k: request.env[k] for k in planned} == planned and len(planned) >= 5
    jobs = printed["jobs"]
    assert (jobs["max_jobs"], jobs["nvcc_threads"]) == (3, 2)
    assert (request.plan.jobs.max_jobs, request.plan.jobs.nvcc_threads) == (jobs["max_jobs"], jobs["nvcc_threads"])
    assert request.env["MAX_JOBS"] == request.env["CMAKE_BUILD_PARALLEL_LEVEL"] == str(jobs["max_jobs"])
    assert jobs["thread_vars"] == ["NVCC_THREADS", "TINY_THREADS"]
    assert {var: request.env[var] for var in jobs["thread_vars"]} == {var: "2" for var in jobs["thread_vars"]}

"""Plans: the exact env and flags of the issue's examples, the cascade, and toolchain checks."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import MappingProxyType

import pytest
from packaging.version import Version

from kforge.build.host import HostFacts, Resources
from kforge.build.profiles import JobProfile, load_profile
from kforge.build.run import run_with_oom_retry
from kforge.config.forge import load_forge
from kforge.config.targets import parse_target
from kforge.errors import ConfigError, TargetError, ToolchainError
from kforge.plan import PlanOptions, make_plan

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30
NVCC_13_ARCHS = frozenset(f"compute_{n}" for n in (75, 80, 86, 87, 88, 89, 90, 100, 110, 103, 120, 121))


@pytest.fixture(scope="module")
def forge():
    return load_forge(ROOT)


def host(**kw) -> HostFacts:
    base = dict(platform="linux-x86_64", python="3.11", resources=Resources(16, 100 * GiB, 128 * GiB),
                cuda_version=Version("13.0.88"), nvcc_path="/usr/local/cuda-13.0/bin/nvcc",
                cuda_home="/usr/local/cuda-13.0", nvcc_archs=NVCC_13_ARCHS, torch_version=Version("2.11.0"))
    base.update(kw)
    return HostFacts(**base)


def profile(project: str):
    return load_profile(Path("/nonexistent-kforge-cache"), project, 1)  # nothing measured: seed or default


def plan_for(forge, text, *, h=None, **opts):
    h = h or host()
    target = parse_target(forge, text, h.platform)
    return make_plan(forge, target, h, PlanOptions(**opts), job_profile=profile(target.project))


def test_flashmla_sm120(forge) -> None:
    plan = plan_for(forge, "flashmla-sm120")
    assert plan.env["FLASH_MLA_DISABLE_SM90"] == "1"
    assert plan.env["FLASH_MLA_DISABLE_SM100"] == "1"
    assert "-gencode=arch=compute_120a,code=sm_120a" in plan.nvcc_flags
    # With both DISABLE flags FlashMLA passes no arch flag, so torch's cpp_extension reads
    # TORCH_CUDA_ARCH_LIST; NVCC_APPEND_FLAGS never reached it (issue 11). No +PTX: upstream ships SASS only.
    assert plan.env["TORCH_CUDA_ARCH_LIST"].split(";") == ["12.0a"]
    assert "NVCC_APPEND_FLAGS" not in plan.env
    assert [a.sm for a in plan.archs] == ["sm_120a"]
    assert plan.source_kind == "git" and "9241ae3ef9bac614dd25e45e507e089f888280e0" in plan.source_pin


def test_flashmla_sm90_disables_only_sm100(forge) -> None:
    plan = plan_for(forge, "flashmla-sm90")
    assert plan.env["FLASH_MLA_DISABLE_SM100"] == "1"
    assert "FLASH_MLA_DISABLE_SM90" not in plan.env
    assert "TORCH_CUDA_ARCH_LIST" not in plan.env  # the torch knob is only for 120/121: FlashMLA hard-codes 90a


def test_a_profile_that_switches_off_an_arch_of_the_target_is_refused(forge) -> None:
    # sm120-port sets FLASH_MLA_DISABLE_SM100=1: flashmla-release (sm_90a + sm_100f) would lose sm_100f's kernels,
    # and the doctor refused exactly that wheel after a whole build on the GPU host (2026-11-27)
    with pytest.raises(ConfigError) as err:
        plan_for(forge, "flashmla-release", profile="sm120-port")
    assert "FLASH_MLA_DISABLE_SM100=1" in err.value.what and "sm_100f" in err.value.what
    assert plan_for(forge, "flashmla-sm90", profile="sm120-port").env["FLASH_MLA_DISABLE_SM100"] == "1"


def test_flash_attn_sm120_windows(forge) -> None:
    plan = plan_for(forge, "flash-attn-sm120-windows")
    assert plan.env["FLASH_ATTN_CUDA_ARCHS"] == "120"
    assert plan.env["DISTUTILS_USE_SDK"] == "1"
    assert plan.env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert plan.platform_os == "windows"
    assert "CUDA_HOME" not in plan.env  # this Linux host's toolkit is not the Windows build's
    assert "windows-amd64 host" in plan.toolchain.action
    assert any(p.startswith("0003-setup-MSVC") for p in plan.patches)  # the windows-only patch is selected


def test_flash_attn_linux_skips_windows_patch(forge) -> None:
    plan = plan_for(forge, "flash-attn-sm90")
    assert not any("MSVC" in p for p in plan.patches)
    assert plan.env["FLASH_ATTN_LOCAL_VERSION"] == "cu130torch2.11.sm90"  # not the release set: an arch label
    assert plan.local_version == "cu130torch2.11.sm90"


@pytest.mark.parametrize(("target", "cuda", "rendered"), [
    ("flashinfer-sm120", "13.0", "12.0f"), ("flashinfer-sm120", "12.9", "12.0f"), ("flashinfer-sm120", "12.8", "12.0a"),
    ("flashinfer-sm121", "13.0", "12.1a"),  # FlashInfer 0.6.x: each 12.x minor but 12.0 gets 'a'
])
def test_flashinfer_suffix_follows_cuda(forge, target, cuda, rendered) -> None:
    plan = plan_for(forge, target, cuda=cuda)
    assert plan.env["FLASHINFER_CUDA_ARCH_LIST"] == rendered
    assert plan.env["FLASHINFER_NVCC_THREADS"] == plan.env["NVCC_THREADS"]


def _bumped(forge, name: str, version: str):
    projects = dict(forge.projects)
    projects[name] = dataclasses.replace(projects[name], upstream_version=version)
    return dataclasses.replace(forge, projects=MappingProxyType(projects))


def test_a_pin_bump_past_the_checked_knobs_fails_the_plan(forge) -> None:
    assert plan_for(forge, "flash-attn3-sm90").project.knobs_valid_for == "==3.0.0"
    with pytest.raises(ConfigError, match="checked for upstream ==3.0.0, and the pin is 3.1.0") as exc:
        plan_for(_bumped(forge, "flash-attn3", "3.1.0"), "flash-attn3-sm90")
    assert "kforge audit flash-attn3" in exc.value.fix


def test_flashinfer_rule_is_only_trusted_for_the_versions_it_was_read_from(forge) -> None:
    bumped = _bumped(forge, "flashinfer", "0.7.0")
    bumped = _bumped_knobs(bumped, "flashinfer", ">=0.6.17")  # the knobs were re-checked, the rule was not
    with pytest.raises(ConfigError, match="arch-suffix rule, which kforge knows for <0.7,>=0.6"):
        plan_for(bumped, "flashinfer-sm90")


def _bumped_knobs(forge, name: str, spec: str):
    projects = dict(forge.projects)
    projects[name] = dataclasses.replace(projects[name], knobs_valid_for=spec)
    return dataclasses.replace(forge, projects=MappingProxyType(projects))


def test_cccl_host_include_path_is_a_toolchain_fact(forge) -> None:
    for target in ("flashmla-sm90", "flash-attn-sm90", "flashinfer-sm90", "fmha-sm90"):
        assert plan_for(forge, target).env["CPLUS_INCLUDE_PATH"] == "/usr/local/cuda-13.0/include/cccl"
    old = host(cuda_version=Version("12.8.93"), cuda_home="/usr/local/cuda-12.8", nvcc_path="/usr/local/cuda-12.8/bin/nvcc")
    assert "CPLUS_INCLUDE_PATH" not in plan_for(forge, "flashmla-sm90", h=old).env


def test_fa3_is_offline_and_has_no_sm100(forge) -> None:
    plan = plan_for(forge, "flash-attn3-sm90")
    assert plan.env["FLASH_ATTENTION_OFFLINE_BUILD"] == "TRUE"
    assert plan.env["FLASH_ATTN_LOCAL_VERSION"] == "cu130torch2.11.sm90a"  # not a release set: an arch label (kforge.config.wheelname)
    assert all(a.major != 10 for a in forge.projects["flash-attn3"].archs)


def test_fmha_is_torch_free_and_uses_cmake_archs(forge) -> None:
    plan = plan_for(forge, "fmha-sm90")
    assert plan.env["CMAKE_CUDA_ARCHITECTURES"] == "90a"
    assert plan.local_version == "sm90a" and plan.toolchain.torch is None  # torch-free: only the arch label
    assert plan.env["CUDA_HOME"] == "/usr/local/cuda-13.0"


def test_fa3_minimal_profile(forge) -> None:
    full = plan_for(forge, "flash-attn3-sm90")
    assert full.profile == "full" and "FLASH_ATTENTION_DISABLE_FP8" not in full.env
    assert full.env["FLASH_ATTENTION_DISABLE_SM80"] == "TRUE"
    minimal = plan_for(forge, "flash-attn3-sm90", profile="minimal")
    assert minimal.env["FLASH_ATTENTION_DISABLE_FP8"] == "TRUE"
    assert minimal.env["FLASH_ATTENTION_DISABLE_HDIM256"] == "TRUE"
    with pytest.raises(TargetError, match="did you mean 'minimal'"):
        plan_for(forge, "flash-attn3-sm90", profile="minimall")


def test_cuda_too_old_fails_before_any_build(forge) -> None:
    with pytest.raises(ToolchainError) as info:
        plan_for(forge, "flashinfer-sm103", cuda="12.8")
    assert "12.9" in info.value.render() and "12.8" in info.value.render()
    with pytest.raises(ToolchainError, match="12.3"):
        plan_for(forge, "flash-attn3-sm90", cuda="12.2")


def test_installed_nvcc_list_is_authoritative(forge) -> None:
    h = host(nvcc_archs=NVCC_13_ARCHS - {"compute_120"})
    with pytest.raises(ToolchainError):
        plan_for(forge, "fmha-sm120", h=h)


def test_provisioning_action(forge) -> None:
    assert "provision nvidia-cuda-nvcc==13.1" in plan_for(forge, "fmha-sm90", cuda="13.1").toolchain.action
    assert "no nvcc on PyPI" in plan_for(forge, "fmha-sm90", cuda="12.8").toolchain.action
    no_nvcc = plan_for(forge, "fmha-sm90", h=host(cuda_version=None, nvcc_path=None, nvcc_archs=None))
    assert no_nvcc.toolchain.cuda_from == "forge.toml" and "provision" in no_nvcc.toolchain.action


def test_cascade_cli_over_env_over_forge(forge) -> None:
    env = {"KFORGE_MAX_JOBS": "3", "KFORGE_NVCC_THREADS": "2", "KFORGE_CUDA": "12.9"}
    opts = PlanOptions.from_cascade(env, cuda=None, max_jobs=5, env={"NVCC_THREADS": " 7 ", "EXTRA": "a  b"})
    assert (opts.cuda, opts.max_jobs, opts.nvcc_threads) == ("12.9", 5, 2)
    h = host()
    plan = make_plan(forge, parse_target(forge, "fmha-sm90", h.platform), h, opts, job_profile=profile("fmha"))
    assert plan.toolchain.cuda == Version("12.9") and plan.toolchain.cuda_from == "KFORGE_CUDA"
    assert plan.env["MAX_JOBS"] == "5"
    assert plan.env["NVCC_THREADS"] == "7"  # --env is applied last, and normalised
    assert plan.env["EXTRA"] == "a b"
    with pytest.raises(ConfigError, match="KFORGE_MAX_JOBS"):
        PlanOptions.from_cascade({"KFORGE_MAX_JOBS": "many"})


def test_jobs_never_exceed_memory(forge) -> None:
    profile = JobProfile(project="flash-attn", arch_count=1, peak_rss_per_unit=6 * GiB, unit_seconds=120.0,
                         unit_seconds_max=250.0, samples=10, source="test")
    h = host(resources=Resources(64, 20 * GiB, 128 * GiB))
    plan = make_plan(forge, parse_target(forge, "flash-attn-sm90", h.platform), h, job_profile=profile)
    assert plan.jobs.max_jobs * 6 * GiB <= 20 * GiB
    assert plan.env["MAX_JOBS"] == str(plan.jobs.max_jobs)


def test_plan_json_round_trip(forge) -> None:
    import json

    data = json.loads(plan_for(forge, "flashmla-sm120").to_json())
    assert data["target"] == "flashmla-sm120"
    assert data["env"]["FLASH_MLA_DISABLE_SM90"] == "1"
    assert data["toolchain"]["min_cuda"] == "12.8"
    assert data["patches"]["dir"] == "patches/flashmla"


def test_build_isolation_can_be_turned_off(forge) -> None:
    assert plan_for(forge, "fmha-sm90").build_isolation is True
    assert plan_for(forge, "fmha-sm90", build_isolation=False).build_isolation is False
    opts = PlanOptions.from_cascade({"KFORGE_BUILD_ISOLATION": "0"})
    assert opts.build_isolation is False
    assert plan_for(forge, "flash-attn-sm90", build_isolation=True).build_isolation is False  # its setup.py needs torch
    with pytest.raises(ConfigError, match="KFORGE_BUILD_ISOLATION"):
        PlanOptions.from_cascade({"KFORGE_BUILD_ISOLATION": "maybe"})


def test_env_nvcc_threads_reaches_the_projects_own_thread_variable(forge) -> None:
    """--env NVCC_THREADS=1 is read back into the job choice, so flashinfer's FLASHINFER_NVCC_THREADS follows it."""
    default = plan_for(forge, "flashinfer-sm90")
    assert default.jobs.thread_vars == ("NVCC_THREADS", "FLASHINFER_NVCC_THREADS")
    assert default.env["FLASHINFER_NVCC_THREADS"] == default.env["NVCC_THREADS"] == str(default.jobs.nvcc_threads)
    plan = plan_for(forge, "flashinfer-sm90", nvcc_threads=4, env={"NVCC_THREADS": "1", "MAX_JOBS": "3"})
    assert plan.jobs.nvcc_threads == 1 and plan.jobs.max_jobs == 3
    assert plan.env["NVCC_THREADS"] == plan.env["FLASHINFER_NVCC_THREADS"] == "1"
    assert plan.env["MAX_JOBS"] == plan.env["CMAKE_BUILD_PARALLEL_LEVEL"] == "3"
    assert plan.jobs.env()["FLASHINFER_NVCC_THREADS"] == "1"  # what the build command's environment gets
    own = plan_for(forge, "flashinfer-sm90", env={"FLASHINFER_NVCC_THREADS": "2"})  # the project's own name works too
    assert own.jobs.nvcc_threads == 2 and own.env["NVCC_THREADS"] == "2"
    with pytest.raises(ConfigError, match="--env NVCC_THREADS"):
        plan_for(forge, "flashinfer-sm90", env={"NVCC_THREADS": "lots"})


def test_plan_is_complete_and_json_shows_it(forge) -> None:
    import json

    plan = plan_for(forge, "flashmla-sm120")
    assert plan.root == ROOT and plan.work_dir == ROOT / ".kforge" / "work" / "flashmla-sm120"
    assert plan.series.entries and plan.patches == tuple(e.name for e in plan.series.entries)
    assert plan.repair_policy.name == "flashmla" and plan.pythons == forge.toolchains.python
    data = json.loads(plan.to_json())
    assert data["work_dir"] == str(plan.work_dir) and data["root"] == str(ROOT)
    assert data["patches"]["hash"] == plan.series_hash and data["patches"]["series"] == list(plan.patches)
    assert data["jobs"]["thread_vars"] == ["NVCC_THREADS"]
    assert data["repair"]["exclude"] == list(plan.repair_policy.exclude) and "libcuda.so*" in data["repair"]["exclude"]
    assert data["pythons"] == list(forge.toolchains.python) and data["makes_wheel"] is True
    fi = json.loads(plan_for(forge, "flashinfer-sm90").to_json())
    assert fi["jobs"]["thread_vars"] == ["NVCC_THREADS", "FLASHINFER_NVCC_THREADS"]
    assert "FLASHINFER_NVCC_THREADS=" in plan_for(forge, "flashinfer-sm90").render()


def test_oom_retry_of_a_flashinfer_plan_lowers_flashinfer_nvcc_threads(forge, tmp_path: Path) -> None:
    """The plan's job choice carries FLASHINFER_NVCC_THREADS, so the OOM retry halves it (it used to stay put)."""
    plan = plan_for(forge, "flashinfer-sm90", max_jobs=1, env={"NVCC_THREADS": "4"})
    assert plan.env["FLASHINFER_NVCC_THREADS"] == "4"
    seen = tmp_path / "seen"
    build = ("import os, sys\n"
             f"open({str(seen)!r}, 'a').write(os.environ['FLASHINFER_NVCC_THREADS'] + '\\n')\n"
             f"sys.exit(137 if len(open({str(seen)!r}).read().split()) == 1 else 0)\n")
    run = run_with_oom_retry([sys.executable, "-c", build], dict(plan.env), plan.jobs, log=lambda m: None)
    assert run.retried and seen.read_text().split() == ["4", "2"]


# ---------------------------------------------------------------------------------------------- variants


def test_plan_names_the_variant_and_how_each_part_is_provisioned(forge):
    target = parse_target(forge, "flash-attn-sm90", "linux-x86_64")
    plan = make_plan(forge, target, host(python="3.12"), PlanOptions(torch="2.9.1", python="3.10"),
                     job_profile=profile("flash-attn"))
    data = plan.to_dict()
    assert data["variant"] == "cu130-torch2.9-cp310"
    prov = data["provisioning"]
    assert prov["env_needed"] is True
    assert prov["torch"]["present"] is False and "uv pip install torch==2.9.1" in prov["torch"]["how"]
    assert prov["python"]["present"] is False and "uv venv --python 3.10" in prov["python"]["how"]
    assert prov["cuda"]["present"] is True
    assert plan.local_version == "cu130torch2.9.sm90"  # kforge.config.wheelname: variant part, then arch
    assert "variant     cu130-torch2.9-cp310" in plan.render()


def test_plan_default_variant_is_the_hosts(forge):
    target = parse_target(forge, "flash-attn-sm90", "linux-x86_64")
    plan = make_plan(forge, target, host(), None, job_profile=profile("flash-attn"))
    assert plan.variant is not None and plan.variant.id == "cu130-torch2.11-cp311"
    assert plan.provisioning is not None and not plan.provisioning.env_needed


def test_torch_for_a_torch_free_project_is_an_error(forge):
    target = parse_target(forge, "fmha-sm90", "linux-x86_64")
    with pytest.raises(ConfigError, match="torch-free"):
        make_plan(forge, target, host(), PlanOptions(torch="2.9.1"), job_profile=profile("fmha"))


def test_fmha_variant_drops_torch(forge):
    target = parse_target(forge, "fmha-sm90", "linux-x86_64")
    plan = make_plan(forge, target, host(), PlanOptions(python="3.12"), job_profile=profile("fmha"))
    assert plan.variant is not None and plan.variant.id == "cu130-cp312"
    assert plan.local_version == "sm90a"  # no torch part; the arch part (not fmha's release set)


def test_cuda_12_comes_from_the_system(forge):
    target = parse_target(forge, "flash-attn-sm90", "linux-x86_64")
    plan = make_plan(forge, target, host(), PlanOptions(cuda="12.8"), job_profile=profile("flash-attn"))
    assert "/usr/local/cuda-12.8" in plan.toolchain.action
    assert plan.variant is not None and plan.variant.id.startswith("cu128-")


# ------------------------------------------------------------------ multi-arch targets (issue 12)


def test_flash_attn_sm80_sm120_windows_renders_the_set(forge) -> None:
    plan = plan_for(forge, "flash-attn-sm80+sm120-windows")
    assert plan.env["FLASH_ATTN_CUDA_ARCHS"] == "80;120"
    assert [a.sm for a in plan.archs] == ["sm_80", "sm_120"]
    assert plan.local_version == plan.env["FLASH_ATTN_LOCAL_VERSION"] == "cu130torch2.11.sm80.sm120"
    assert any(p.startswith("0003-setup-MSVC") for p in plan.patches)  # the Windows patch is selected


def test_flashmla_sm100_sm120_plans_both_families(forge) -> None:
    plan = plan_for(forge, "flashmla-sm100+sm120")
    assert [a.sm for a in plan.archs] == ["sm_100f", "sm_120a"]
    assert plan.env["FLASH_MLA_DISABLE_SM90"] == "1" and "FLASH_MLA_DISABLE_SM100" not in plan.env
    assert "12.0a" in plan.env["TORCH_CUDA_ARCH_LIST"]  # sm_120 reaches torch's extension builder (upstream has no gencode for it)
    assert "-gencode=arch=compute_100f,code=sm_100f" in plan.nvcc_flags
    assert plan.local_version == "cu130torch2.11.sm100f.sm120a"
    # a listed build (forge.toml arch_sets "sm100+sm120"): exactly these two gencodes, and the prefill port's patches
    assert plan.nvcc_flags == ("-gencode=arch=compute_100f,code=sm_100f", "-gencode=arch=compute_120a,code=sm_120a")
    assert plan.env["TORCH_CUDA_ARCH_LIST"] == "12.0a"
    assert any(p.startswith("0015-sm120-dense-prefill") for p in plan.patches)
    assert plan_for(forge, "flashmla-sm120+sm100").target.id == "flashmla-sm100+sm120"


def test_flashinfer_set_applies_its_variant_rule_to_every_arch(forge) -> None:
    plan = plan_for(forge, "flashinfer-sm90+sm120")
    assert plan.env["FLASHINFER_CUDA_ARCH_LIST"] == "9.0a 12.0f"
    assert [a.sm for a in plan.archs] == ["sm_90a", "sm_120f"]


def test_fmha_set_renders_cmake_and_release_has_no_arch_label(forge) -> None:
    pair = plan_for(forge, "fmha-sm80+sm90")
    assert pair.env["CMAKE_CUDA_ARCHITECTURES"] == "80-real;90a"
    assert pair.local_version == "sm80.sm90a"
    release = plan_for(forge, "fmha-release")
    assert release.env["CMAKE_CUDA_ARCHITECTURES"] == "80-real;86-real;89-real;90a-real;100a-real;120a"
    assert release.local_version is None
    assert plan_for(forge, "flash-attn-release").local_version == "cu130torch2.11"


def test_builds_that_differ_in_archs_never_share_a_label(forge) -> None:
    ids = ["fmha-sm80", "fmha-sm90", "fmha-sm80+sm90", "fmha-release", "fmha-sm120", "fmha-sm86+sm89"]
    labels = [plan_for(forge, i).local_version for i in ids]
    assert len(set(labels)) == len(ids), dict(zip(ids, labels, strict=True))


def test_the_jobs_line_is_one_short_sentence_and_verbose_gives_the_model(forge):
    plan = plan_for(forge, "flash-attn-sm90")
    line = next(s for s in plan.render().splitlines() if s.strip().startswith("jobs "))
    assert line.endswith("(kforge -v plan: why)") and "GB/unit" not in line and len(line) < 140
    assert f"MAX_JOBS={plan.jobs.max_jobs}" in line and "nvcc thread" in line
    detailed = next(s for s in plan.render(verbose=True).splitlines() if s.strip().startswith("jobs "))
    assert plan.jobs.reason in detailed


def test_a_plan_that_needs_uv_says_so_when_uv_is_missing(forge):
    target = parse_target(forge, "flash-attn-sm90", "linux-x86_64")
    wanted = PlanOptions(torch="2.9.1", python="3.10")
    missing = make_plan(forge, target, host(python="3.12"), wanted, job_profile=profile("flash-attn"))
    assert missing.provisioning is not None and missing.provisioning.env_needed
    assert "uv          NOT FOUND" in missing.render() and "pip install uv" in missing.render()
    found = make_plan(forge, target, host(python="3.12", uv="/usr/bin/uv"), wanted,
                      job_profile=profile("flash-attn"))
    assert "NOT FOUND" not in found.render()
    assert "NOT FOUND" not in plan_for(forge, "flash-attn-sm90").render()  # no uv environment: no word of uv


# -- flash-attn3-standalone: FA3's forward kernels as a torch-free C library (issue 30) --------------------------


def standalone(forge, profile_name: str, h: HostFacts | None = None, **opts):
    h = h or host()
    target = parse_target(forge, "flash-attn3-standalone-sm90", h.platform)
    job_profile = load_profile(Path("/nonexistent-kforge-cache"), target.project, 1, profile_name)
    return make_plan(forge, target, h, PlanOptions(profile=profile_name, **opts), job_profile=job_profile)


def test_fa3_standalone_passes_its_profile_to_cmake_and_builds_torch_free(forge) -> None:
    from kforge.pipeline import judgement

    minimal = standalone(forge, "minimal")
    assert minimal.env["CMAKE_ARGS"] == "-DFA3S_PROFILE=minimal" and minimal.env["CMAKE_CUDA_ARCHITECTURES"] == "90a-real"
    assert standalone(forge, "full").env["CMAKE_ARGS"] == "-DFA3S_PROFILE=full"
    assert plan_for(forge, "flash-attn3-standalone-sm90").profile == "full"
    assert not any(k.startswith("FLASH_ATTENTION_") for k in minimal.env)  # flash-attn3's setup.py knobs are not ours
    assert minimal.build_dir == "hopper/standalone" and minimal.build_isolation and minimal.backend == "native"
    assert minimal.toolchain.torch is None and minimal.local_version == "sm90a" and minimal.local_version_in_wheel
    assert minimal.patches_dir == "patches/flash-attn3" and minimal.gpu_tests is not None
    assert minimal.repair_policy.torch_free and not minimal.repair_policy.excludes("libc10.so")
    assert "torch-free: no binary may need libtorch*, libc10*" in minimal.render()
    assert "CMAKE_ARGS=-DFA3S_PROFILE=minimal" in minimal.render()
    # the doctor holds every binary to exactly the plan's arch: SASS sm_90a, and no PTX (FA3's own build ships none)
    judged = judgement(minimal)
    assert judged.exact and judged.expect == ("sm_90a",) and judged.policy.torch_free
    cmake = standalone(forge, "minimal", backend="cmake")
    assert not cmake.makes_wheel and cmake.env["CMAKE_ARGS"] == "-DFA3S_PROFILE=minimal"


def test_fa3_standalone_jobs_come_from_the_measured_unit_and_each_profiles_unit_count(forge) -> None:
    minimal, full = standalone(forge, "minimal"), standalone(forge, "full")
    for plan, units in ((minimal, 23), (full, 225)):
        assert f"estimate: {units} units of 248 s" in plan.jobs.reason
        assert "6.7 GB/unit (seed: FA3 fwd units hdim128 bf16 (+split) sm_90a" in plan.jobs.reason
        assert "6.7 GB/unit" in plan.render(verbose=True) and f"MAX_JOBS={plan.jobs.max_jobs}" in plan.render()
    assert full.jobs.predicted_seconds > minimal.jobs.predicted_seconds


@pytest.mark.parametrize(("cpus", "available", "total"), [(2, 18 * GiB, 24 * GiB), (16, 118 * GiB, 125 * GiB),
                                                          (16, 60 * GiB, 125 * GiB), (4, 16 * GiB, 16 * GiB)])
@pytest.mark.parametrize("profile_name", ["minimal", "full"])
def test_fa3_standalone_never_plans_more_memory_than_the_host_has(forge, cpus, available, total, profile_name) -> None:
    from kforge.build.jobs import headroom, unit_memory

    resources = Resources(cpus, available, total)
    plan = standalone(forge, profile_name, host(resources=resources))
    per_unit = unit_memory(load_profile(Path("/nonexistent-kforge-cache"), "flash-attn3-standalone", 1), 1)
    assert per_unit == 6_572_204 * 1024  # the measured hdim128 bf16 forward unit
    assert 1 <= plan.jobs.max_jobs <= cpus and plan.jobs.nvcc_threads == 1
    assert plan.jobs.max_jobs * per_unit <= available - headroom(resources)
    assert "WARNING" not in plan.jobs.reason


def test_fa3_standalone_on_the_build_hosts_we_have(forge) -> None:
    """This 2-core 24 GB machine runs both cores; the 16-core 125 GiB GPU host's full build uses most of its cores
    and stays under its memory (the flash-attn3 minimal build there peaked at 60 GiB with 16 jobs, verified.md)."""
    small = standalone(forge, "minimal", host(resources=Resources(2, 18 * GiB, 24 * GiB)))
    assert (small.jobs.max_jobs, small.jobs.est_peak_memory) == (2, 2 * 6_572_204 * 1024)
    big = standalone(forge, "full", host(resources=Resources(16, 118 * GiB, 125 * GiB)))
    assert 12 <= big.jobs.max_jobs <= 16 and big.jobs.est_peak_memory <= 118 * GiB * 0.9


def test_the_plan_applies_and_prints_the_ptx_and_debug_policy(forge) -> None:
    """flash-attn's own build ships SASS only: so do the plan's flags, and the plan says where that came from."""
    plan = plan_for(forge, "flash-attn-sm90")
    assert plan.nvcc_flags == ("-gencode=arch=compute_90,code=sm_90",)
    assert plan.enforce is not None and plan.enforce.ptx == () and plan.enforce.sass == ("sm_90",)
    text = plan.render()
    assert "\n  ptx         none (upstream's: SASS only)\n" in text
    assert "\n  debug       stripped (forge.toml strip_debug)" in text
    data = plan.to_dict()
    assert data["binaries"]["ptx"] == "none" and data["repair"]["strip_debug"] is True


def test_ptx_all_reaches_the_flags_and_the_knobs_that_can_say_ptx(forge) -> None:
    plan = plan_for(forge, "flashmla-sm120", ptx="all")
    assert plan.env["TORCH_CUDA_ARCH_LIST"] == "12.0a+PTX"
    assert plan.nvcc_flags == ("-gencode=arch=compute_120a,code=sm_120a", "-gencode=arch=compute_120a,code=compute_120a")
    fmha = plan_for(forge, "fmha-release")  # ptx = "highest": the cmake knob's last entry keeps its PTX
    assert fmha.env["CMAKE_CUDA_ARCHITECTURES"] == "80-real;86-real;89-real;90a-real;100a-real;120a"
    assert plan_for(forge, "fmha-release", ptx="none").env["CMAKE_CUDA_ARCHITECTURES"].endswith(";120a-real")


def test_ptxas_threads_reach_the_wrapper_the_plan_and_the_doctors_judgement(forge) -> None:
    from kforge.pipeline import judgement

    one = plan_for(forge, "flash-attn-sm90", ptxas_threads=1)
    assert one.enforce is not None and one.enforce.ptxas_threads is None and "\n  ptxas " not in one.render()
    two = plan_for(forge, "flash-attn-sm90")  # forge.toml's
    assert "\n  ptxas       --split-compile=2 in every device step (forge.toml ptxas_threads;" in two.render()
    assert "\n  ptxas " not in plan_for(forge, "fmha-sm90").render()  # 1, the default: no line
    four = plan_for(forge, "flash-attn-sm90", ptxas_threads=4)
    assert four.enforce is not None and four.enforce.policy.ptxas_threads == 4
    assert ("\n  ptxas       --split-compile=4 in every device step (--ptxas-threads / KFORGE_PTXAS_THREADS; "
            "kforge's nvcc wrapper)") in four.render()
    assert four.to_dict()["arch_enforce"]["ptxas_threads"] == 4 and judgement(four).ptxas_threads == 4
    win = plan_for(forge, "flash-attn-sm120-windows", ptxas_threads=4)  # no wrapper on Windows: said, not applied
    assert win.enforce is not None and win.enforce.ptxas_threads is None and judgement(win).ptxas_threads is None
    assert "\n  ptxas       1 thread: --ptxas-threads / KFORGE_PTXAS_THREADS asks for 4" in win.render()
    with pytest.raises(ConfigError, match="more than 64"):
        plan_for(forge, "flash-attn-sm90", ptxas_threads=65)


def test_keep_debug_and_windows_keep_the_debug_info(forge) -> None:
    kept = plan_for(forge, "flash-attn-sm90", strip_debug=False)
    assert kept.binary is not None and not kept.binary.strip_debug and kept.to_dict()["repair"]["strip_debug"] is False
    win = plan_for(forge, "flash-attn-sm120-windows")
    assert win.binary is not None and not win.binary.strip_debug


def test_the_projects_platform_floor_is_enforced_where_the_build_reaches_it(forge) -> None:
    """forge.toml's floor (manylinux_2_31): enforced on an old enough host and in kforge's image; a native build on
    a newer host is a development build whose plan says why and how to reach the floor."""
    old = plan_for(forge, "flashmla-sm90", h=host(glibc="2.31"))
    assert old.platform_tag == "manylinux_2_31"
    newer = plan_for(forge, "flashmla-sm90", h=host(glibc="2.36"))
    assert newer.platform_tag is None and "--image kforge:bullseye" in newer.platform_note
    assert "this host's glibc 2.36 is above flashmla's release floor manylinux_2_31" in newer.render()
    image = plan_for(forge, "flashmla-sm90", h=host(glibc="2.36"), backend="cibuildwheel", image="kforge:bullseye")
    assert image.platform_tag == "manylinux_2_31"
    explicit = plan_for(forge, "flashmla-sm90", h=host(glibc="2.36"), platform_tag="manylinux_2_36")
    assert explicit.platform_tag == "manylinux_2_36" and explicit.to_dict()["platform_note"] == "--platform-tag"

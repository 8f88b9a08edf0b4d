"""The generated workflows: in sync with forge.toml, jobs that prepare what their plans need, and safe by construction."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from kforge.ci.workflows import (
    ACTIONLINT_CONFIG,
    ACTIONS,
    RELEASE_WORKFLOW,
    WORKFLOW,
    ZIZMOR_CONFIG,
    ci_targets,
    generated_files,
    workflow_data,
    write_workflow,
)
from kforge.config.forge import load_forge
from kforge.config.model import CiSettings
from kforge.config.targets import expand_matrix

ROOT = Path(__file__).resolve().parents[2]
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml reads the same data, faster


def _load(text: str):
    return yaml.load(text, Loader=_Loader)


@pytest.fixture(scope="module")
def forge():
    return load_forge(ROOT)


@pytest.fixture(scope="module")
def files(forge):
    return generated_files(forge)


@pytest.fixture(scope="module")
def dev(files):
    return _load(files[WORKFLOW])


@pytest.fixture(scope="module")
def release(files):
    return _load(files[RELEASE_WORKFLOW])


def _steps(job):
    return job["steps"]


def _runs(job):
    return [s["run"] for s in job["steps"] if "run" in s]


def test_checked_in_files_match_forge_toml(files) -> None:
    for rel, text in files.items():
        assert (ROOT / rel).read_text() == text, f"{rel}: run `kforge ci generate` and commit the result"


def test_the_dump_is_the_data(forge, files) -> None:
    """The YAML GitHub reads is exactly the data built in memory (the version comments change nothing)."""
    assert _load(files[WORKFLOW]) == workflow_data(forge)  # 'on' is quoted: YAML 1.1 reads on: as True


def test_a_build_job_per_buildable_target(forge, dev) -> None:
    expected = set()
    for platform in forge.ci.runners:
        for t in expand_matrix(forge, platform):
            # named arch-set targets (fmha-release) are not CI jobs; the '+' ones forge.toml lists are
            listed = len(t.archs) == 1 or "+" in t.arch_token
            if t.platform == platform and listed and not any(forge.projects[t.project].unbuildable_reason(a) for a in t.archs):
                expected.add((t.id, platform))
    assert not any(len(t.target.archs) > 1 and "+" not in t.session_id for t in ci_targets(forge))
    got = {(t.session_id, t.platform.name) for t in ci_targets(forge)}
    assert got == expected
    # flashmla-sm100+sm120 (forge.toml arch_sets "sm100+sm120"): a job next to flashmla-sm120's, its id without
    # the '+' GitHub refuses there, GPU-tested on a GPU of its first arch; flashmla-release is not a job.
    assert ("flashmla-sm100+sm120", "linux-x86_64") in got and ("flashmla-release", "linux-x86_64") not in got
    assert "python -m nox -s build-flashmla-sm100+sm120" in _runs(dev["jobs"]["build-flashmla-sm100_sm120-linux"])
    assert dev["jobs"]["test-flashmla-sm100_sm120-linux"]["runs-on"][-1] == "sm100"
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", k) for k in dev["jobs"]), "GitHub job ids: letters, digits, - and _"
    assert {k for k in dev["jobs"] if k.startswith("build-")} == {f"build-{t.key}" for t in ci_targets(forge)}
    # flashmla-sm120 builds (our port, patches/flashmla 0011-0013): a job on each of its platforms, and a GPU test.
    assert forge.projects["flashmla"].unbuildable_reason(forge.projects["flashmla"].archs[-1]) is None
    assert {"build-flashmla-sm120-linux", "build-flashmla-sm120-windows", "test-flashmla-sm120-linux"} <= set(dev["jobs"])
    assert "python -m nox -s build-flashmla-sm120" in _runs(dev["jobs"]["build-flashmla-sm120-linux"])


def test_an_unbuildable_arch_is_left_out_on_every_platform(forge) -> None:
    """Declared and planned, but marked `unbuildable` in forge.toml: no build or test job on any platform."""
    mla = replace(forge.projects["flashmla"], unbuildable=MappingProxyType({"sm_120": "needs a kernel port"}))
    marked = replace(forge, projects=MappingProxyType({**forge.projects, "flashmla": mla}))
    jobs = workflow_data(marked)["jobs"]
    assert not any(k.startswith(("build-flashmla-sm120", "test-flashmla-sm120")) for k in jobs)
    assert {"build-flashmla-sm90-linux", "test-flashmla-sm90-linux"} <= set(jobs)
    assert not any(t.session_id == "flashmla-sm120" for t in ci_targets(marked))


def test_torch_abi_builds_run_on_self_hosted_build_runners_with_their_torch(forge, dev) -> None:
    job = dev["jobs"]["build-flash-attn-sm90-linux"]
    assert job["runs-on"] == list(forge.ci.runners["linux-x86_64"].self_hosted)
    torch = str(forge.toolchains.torch[0])
    cuda = forge.toolchains.cuda[0]
    index = f"https://download.pytorch.org/whl/cu{cuda.major}{cuda.minor}"
    assert any(f'"torch=={torch}"' in r and index in r for r in _runs(job))
    assert job["env"]["KFORGE_CUDA"] == f"{cuda.major}.{cuda.minor}"
    assert "python -m kforge.cli ci toolchain flash-attn-sm90" in _runs(job)
    assert "python -m nox -s build-flash-attn-sm90" in _runs(job)
    # A git-sourced project fetches its pinned submodule (only its own).
    mla = dev["jobs"]["build-flashmla-sm90-linux"]
    assert "git submodule update --init --recursive -- externals/FlashMLA" in _runs(mla)
    # The compiler cache is keyed by (platform, project, variant).
    cache = next(s for s in _steps(job) if s.get("uses", "").startswith("actions/cache@"))
    assert cache["with"]["restore-keys"] == f"kforge-linux-x86_64-flash-attn-cu{cuda.major}{cuda.minor}-torch2.11-"


def test_fmha_builds_on_hosted_runners_without_torch(forge, dev) -> None:
    linux = dev["jobs"]["build-fmha-sm90-linux"]
    assert linux["runs-on"] == "ubuntu-24.04"
    assert not any("torch==" in r for r in _runs(linux))
    assert any("apt-get install" in r and "ccache" in r for r in _runs(linux))
    windows = dev["jobs"]["build-fmha-sm90-windows"]
    assert windows["runs-on"] == "windows-2022"
    uses = [s.get("uses", "") for s in _steps(windows)]
    assert any(u.startswith("Jimver/cuda-toolkit@") for u in uses)  # the pinned toolkit action on hosted Windows
    msvc = next(s for s in _steps(windows) if s["name"] == "MSVC developer environment")
    assert msvc["shell"] == "pwsh" and "vcvars64.bat" in msvc["run"] and "GITHUB_ENV" in msvc["run"]


def test_gpu_tests_on_the_right_gpu_needing_only_their_build(forge, dev) -> None:
    tests = {k: v for k, v in dev["jobs"].items() if k.startswith("test-")}
    assert tests, "no GPU test jobs"
    for name, job in tests.items():
        key = name.removeprefix("test-")
        assert job["needs"] == [f"build-{key}"]
        assert job["runs-on"][:5] == ["self-hosted", "linux", "x64", "gpu", job["runs-on"][4]]
        assert re.fullmatch(r"sm\d+", job["runs-on"][-1])
        assert job["timeout-minutes"] == forge.ci.test_timeout
        assert job["env"]["KFORGE_REQUIRE_GPU"] == "1"
        last = _steps(job)[-1]
        assert last["if"] == "always()" and "ci cleanup" in last["run"]
        assert "if" not in job  # a failed build skips its own test job only
    assert dev["jobs"]["test-flash-attn3-sm90-linux"]["runs-on"][-1] == "sm90"
    assert dev["jobs"]["test-flashinfer-sm121-linux"]["runs-on"][-1] == "sm121"
    assert all(k.endswith("-linux") for k in tests)  # the GPU runners are Linux x86_64


def test_release_publishes_one_index_after_every_test(forge, release, dev) -> None:
    assert "publish" not in dev["jobs"]
    publish = release["jobs"]["publish"]
    tests = {k for k in release["jobs"] if k.startswith("test-")}
    builds = {k for k in release["jobs"] if k.startswith("build-")}
    assert tests <= set(publish["needs"]) and builds <= set(publish["needs"])
    merge = next(r for r in _runs(publish) if "wheelhouse" in r and " merge " in r)
    assert merge.startswith("python -m kforge.cli wheelhouse --wheelhouse kforge-ci/site merge kforge-ci/parts/")
    assert release["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert publish["permissions"] == {"contents": "read"}
    # A release builds from scratch: no cache a branch run wrote can reach its wheels.
    assert not any(s.get("uses", "").startswith("actions/cache") for j in release["jobs"].values() for s in j["steps"])
    assert release["on"] == {"push": {"tags": ["v*"]}}


def test_release_assets_instead_of_pages(forge) -> None:
    data = workflow_data(replace(forge, ci=replace(forge.ci, publish="release")), release=True)
    assert "deploy" not in data["jobs"]
    publish = data["jobs"]["publish"]
    assert publish["permissions"] == {"contents": "write"}
    upload = _steps(publish)[-1]
    assert 'gh release upload "$TAG"' in upload["run"] and upload["env"]["TAG"] == "${{ github.ref_name }}"


@pytest.mark.parametrize("name", [WORKFLOW, RELEASE_WORKFLOW])
def test_safe_by_construction(files, name) -> None:
    text = files[name]
    data = _load(text)
    triggers = data["on"]
    assert not {"pull_request", "pull_request_target", "workflow_run"} & set(triggers)
    assert data["permissions"] == {}
    assert "github.ref" in data["concurrency"]["group"]
    pins = {a.ref for a in ACTIONS.values()}
    for job_id, job in data["jobs"].items():
        assert job["permissions"], job_id
        assert isinstance(job["timeout-minutes"], int)
        for step in job["steps"]:
            if "uses" in step:
                assert step["uses"] in pins and re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", step["uses"])
            if "run" in step:
                assert "${{" not in step["run"], f"{job_id}: {step['name']} expands a template inside run:"
    for action in ACTIONS.values():  # each pin carries its version as a comment
        if action.ref in text:
            assert f"uses: {action.ref}  # {action.version}\n" in text


def test_linter_configs(files, dev) -> None:
    labels = set(_load(files[ACTIONLINT_CONFIG])["self-hosted-runner"]["labels"])
    used = set()
    for job in dev["jobs"].values():
        used.update([job["runs-on"]] if isinstance(job["runs-on"], str) else job["runs-on"])
    custom = {lab for lab in used if not lab.startswith(("ubuntu-", "windows-"))}
    assert custom - {"self-hosted", "linux", "x64", "arm64", "windows"} <= labels
    assert {"gpu", "build", "sm90", "sm120"} <= labels
    zizmor = _load(files[ZIZMOR_CONFIG])
    assert zizmor == {"rules": {"self-hosted-runner": {"ignore": ["kforge.yml", "kforge-release.yml"]}}}


def test_ci_settings_reach_the_jobs(forge) -> None:
    ci = replace(forge.ci, gpu_labels=("self-hosted", "linux", "x64", "h100"), test_timeout=5, build_timeout=7)
    data = workflow_data(replace(forge, ci=ci))
    assert data["jobs"]["test-fmha-sm90-linux"]["runs-on"] == ["self-hosted", "linux", "x64", "h100", "sm90"]
    assert data["jobs"]["test-fmha-sm90-linux"]["timeout-minutes"] == 5
    assert data["jobs"]["build-fmha-sm90-linux"]["timeout-minutes"] == 7
    assert CiSettings().gpu_labels == ("self-hosted", "linux", "x64", "gpu")


def test_write_is_atomic_and_reports_drift(tmp_path: Path, forge, files) -> None:
    paths, changed = write_workflow(forge, check=True, root=tmp_path)
    assert changed and not any(p.exists() for p in paths)  # --check writes nothing
    paths, changed = write_workflow(forge, root=tmp_path)
    assert changed and all((tmp_path / rel).read_text() == text for rel, text in files.items())
    assert write_workflow(forge, root=tmp_path) == (paths, False)
    # atomic writes leave no temp file behind
    assert sorted(p.name for p in (tmp_path / ".github" / "workflows").iterdir()) == ["kforge-release.yml", "kforge.yml"]
    assert sorted(p.name for p in (tmp_path / ".github").iterdir()) == ["actionlint.yaml", "workflows", "zizmor.yml"]
    (tmp_path / WORKFLOW).write_text("stale")
    assert write_workflow(forge, check=True, root=tmp_path)[1] is True

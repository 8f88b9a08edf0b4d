"""kforge release's analysis: the matrix planned, priced, and compared with what is published."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from kforge_testkit import forge_toml
from packaging.version import Version

from kforge import buildinputs, release
from kforge.build import profiles
from kforge.build.host import HostFacts, Resources
from kforge.build.measure import UnitMeasure
from kforge.config.forge import load_forge
from kforge.config.options import PlanOptions
from kforge.cuda.arch import parse_arch
from kforge.errors import BuildError, ConfigError, GPUError
from kforge.gputest import GpuTestOutcome, PytestCounts
from kforge.log import StepLog
from kforge.pipeline import steps_for
from kforge.wheels import wheelhouse
from kforge.wheels.wheelhouse import Manifest

PROJECTS = """
[projects.tiny]
source = { local = "tiny" }
archs = ["sm_80", "sm_90a"]

[projects.tiny.release]
archs = ["sm_90a", "sm_80"]
variants = [{ cuda = "13.0" }]

[projects.norel]
source = { local = "tiny" }
archs = ["sm_90a"]
"""


@pytest.fixture()
def setup(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "k.cu").write_text("// kernel\n")
    (tmp_path / "forge.toml").write_text(forge_toml(PROJECTS))
    host = HostFacts(platform="linux-x86_64", python="3.11", resources=Resources(2, 16 * 2**30, 24 * 2**30),
                     cuda_version=Version("13.0"), nvcc_path="/opt/cuda/bin/nvcc", cuda_home="/opt/cuda")
    return load_forge(tmp_path), host


def _plan(forge, host, tmp_path, only=(), **kw):
    return release.plan_release(forge, "tiny", host, PlanOptions(**kw), cache_dir=tmp_path / "cache",
                                wheelhouse_root=tmp_path / "wh", only=only)


def test_the_matrix_less_excludes_with_variants_and_arch_labels(setup, tmp_path):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path)
    assert [(i.plan.id, i.variant) for i in rplan.items] == [("tiny-sm90", "cu130-cp311"), ("tiny-sm80", "cu130-cp311")]
    # several archs in one index: each wheel's label names its arch
    assert [i.plan.local_version for i in rplan.items] == ["sm90a", "sm80"]
    assert all(i.estimate_s is None for i in rplan.items)
    text = rplan.render()
    assert "2 to build, 0 already published" in text and "unknown (nothing measured yet" in text
    first = json.loads(json.dumps(rplan.to_dict()))["builds"][0]
    assert first["variant"] == "cu130-cp311" and first["local_version"] == "sm90a"
    assert first["provisioning"]["python"]["present"] is True


def test_a_published_wheel_with_the_same_inputs_is_skipped_and_another_is_not(setup, tmp_path):
    forge, host = setup
    first = _plan(forge, host, tmp_path)
    item = first.items[0]
    wheel = tmp_path / "tiny-0.1+sm90a-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tiny/__init__.py", "")
    wheelhouse.publish(tmp_path / "wh", "tiny", wheel, Manifest(target=item.plan.id, variant=item.variant,
                                                               inputs_hash=item.inputs_hash, doctor={"ok": True}))
    again = _plan(forge, host, tmp_path)
    assert [i.published is not None for i in again.items] == [True, False]
    assert "skip: tiny-0.1+sm90a-py3-none-any.whl" in again.render()
    # a changed source is another input: nothing is skipped
    (tmp_path / "tiny" / "k.cu").write_text("// kernel, changed\n")
    assert all(i.published is None for i in _plan(forge, host, tmp_path).items)


def test_inputs_hash_ignores_job_counts_but_not_the_arch_or_the_source(setup, tmp_path):
    forge, host = setup
    a = _plan(forge, host, tmp_path).items[0].plan
    b = _plan(forge, host, tmp_path, max_jobs=1, nvcc_threads=1).items[0].plan
    assert a.jobs != b.jobs
    assert buildinputs.inputs_hash(a, "x") == buildinputs.inputs_hash(b, "x")
    c = _plan(forge, host, tmp_path).items[1].plan  # sm80
    assert buildinputs.inputs_hash(a, "x") != buildinputs.inputs_hash(c, "x")
    assert buildinputs.inputs_hash(a, "x") != buildinputs.inputs_hash(a, "y")


def test_release_refuses_variant_flags_and_projects_without_a_matrix(setup, tmp_path):
    forge, host = setup
    with pytest.raises(ConfigError, match="--cuda"):
        _plan(forge, host, tmp_path, cuda="12.8")
    with pytest.raises(ConfigError, match="declares no release matrix"):
        release.plan_release(forge, "norel", host, PlanOptions(), cache_dir=tmp_path / "cache", wheelhouse_root=tmp_path / "wh")


def test_manifest_lists_every_wheel_or_refuses(setup, tmp_path):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path)
    with pytest.raises(Exception, match="has no published wheel"):
        release.write_manifest(rplan)
    assert not (tmp_path / "wh" / "releases").exists()


def test_two_variants_of_a_torch_free_wheel_would_collide(tmp_path, setup):
    (tmp_path / "forge.toml").write_text(forge_toml(PROJECTS.replace(
        'variants = [{ cuda = "13.0" }]', 'variants = [{ cuda = "13.0" }, { cuda = "13.0", python = "3.10" }]')))
    forge, host = load_forge(tmp_path), setup[1]
    with pytest.raises(ConfigError, match="same file name"):
        _plan(forge, host, tmp_path)


def _publish_as_built(tmp_path, item):  # noqa: ANN001, ANN202
    """What a build of ``item`` publishes: a wheel whose manifest carries its target, variant and inputs hash."""
    wheel = tmp_path / "built" / f"tiny-0.1+{item.plan.local_version}-py3-none-any.whl"
    wheel.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tiny/__init__.py", item.plan.id)
    return wheelhouse.publish(tmp_path / "wh", "tiny", wheel, Manifest(
        target=item.plan.id, variant=item.variant, inputs_hash=item.inputs_hash, doctor={"ok": True, "findings": []}))


def _make_run(plan, n):  # noqa: ANN001, ANN202
    """What run_release reads of a Run: its log, whose timings the pipeline fills step by step."""
    return SimpleNamespace(log=StepLog(total=3, title=plan.id))


def _built(run, published):  # noqa: ANN001, ANN202
    """What run_build leaves behind: the log's step timings and an outcome with the build's wall time."""
    run.log.timings.update({"source": 0.5, "build": 11.0, "doctor": 1.0})
    return SimpleNamespace(seconds=12.49, wheel=published.wheel)


def test_run_release_builds_in_order_then_writes_the_manifest(setup, tmp_path, monkeypatch):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path)
    by_plan = {id(i.plan): i for i in rplan.items}
    order: list[str] = []

    def fake_build(plan, run):  # noqa: ANN001, ANN202
        order.append(plan.id)
        return _built(run, _publish_as_built(tmp_path, by_plan[id(plan)]))

    monkeypatch.setattr(release, "run_build", fake_build)
    result = release.run_release(rplan, _make_run, say=lambda text: None)
    assert order == ["tiny-sm90", "tiny-sm80"] and len(result.built) == 2
    data = json.loads(result.manifest.read_text())
    assert [(w["target"], w["variant"], w["doctor"], w["skipped"]) for w in data["wheels"]] == [
        ("tiny-sm90", "cu130-cp311", "ok", False), ("tiny-sm80", "cu130-cp311", "ok", False)]
    assert all(len(w["sha256"]) == 64 for w in data["wheels"])
    # each build's wall time and its steps' times, as the pipeline's log measured them
    first = data["wheels"][0]
    assert first["build"] == "sm_90a/cu130-cp311" and first["wall_seconds"] == 12.5
    assert first["steps"] == {"source": 0.5, "build": 11.0, "doctor": 1.0}
    assert first["gpu_tests"]["status"] == "not run" and "without --gpu-tests" in first["gpu_tests"]["reason"]
    assert data["complete"] is True and data["missing"] == [] and data["selection"] == []


def test_a_failed_build_stops_the_release_without_a_manifest(setup, tmp_path, monkeypatch):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path)
    first = rplan.items[0]

    def fake_build(plan, run):  # noqa: ANN001, ANN202
        if plan is first.plan:
            return _built(run, _publish_as_built(tmp_path, first))
        raise BuildError("nvcc failed", fix="read the log")

    monkeypatch.setattr(release, "run_build", fake_build)
    with pytest.raises(BuildError) as err:
        release.run_release(rplan, _make_run, say=lambda text: None)
    assert "stopped at tiny-sm80" in err.value.why and "built before it: tiny-sm90 (cu130-cp311)" in err.value.why
    assert "kforge release tiny" in err.value.fix
    assert not (tmp_path / "wh" / "releases").exists()
    # the next run skips the wheel that was published
    assert [i.published is not None for i in _plan(forge, host, tmp_path).items] == [True, False]


def test_only_selects_part_of_the_matrix_and_says_so(setup, tmp_path):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path, only=["sm_80"])
    assert [(i.plan.id, i.key) for i in rplan.items] == [("tiny-sm80", "sm_80/cu130-cp311")]
    assert [(m.key, m.selected) for m in rplan.matrix] == [("sm_90a/cu130-cp311", False), ("sm_80/cu130-cp311", True)]
    assert "(--only sm_80: 1 of the matrix's 2)" in rplan.render()
    data = rplan.to_dict()
    assert data["selection"] == ["sm_80"] and [b["target"] for b in data["builds"]] == ["tiny-sm80"]
    # an arch/variant pair, and a variant alone, select the same way; two selectors add up
    assert [i.plan.id for i in _plan(forge, host, tmp_path, only=["sm_90a/cu130-cp311"]).items] == ["tiny-sm90"]
    assert len(_plan(forge, host, tmp_path, only=["cu130-cp311"]).items) == 2
    assert [i.plan.id for i in _plan(forge, host, tmp_path, only=["sm80", "sm_90"]).items] == ["tiny-sm90", "tiny-sm80"]


@pytest.mark.parametrize("only,message", [
    ("sm_86", "--only sm_86 matches no build of the release matrix of tiny"),
    ("cu129-cp311", "--only cu129-cp311 matches no build"),
    ("sm_80/cu130-cp312", "matches no build"),
    ("sm_80/cu130", "is not a build selector"),
    ("nonsense", "is not a build selector"),
])
def test_an_only_that_matches_nothing_lists_what_exists(setup, tmp_path, only, message):
    forge, host = setup
    with pytest.raises(ConfigError) as err:
        _plan(forge, host, tmp_path, only=[only])
    assert message in err.value.what
    if "matches no build" in message:
        assert "sm_90a/cu130-cp311, sm_80/cu130-cp311" in err.value.why and "--only sm_90a/cu130-cp311" in err.value.fix


def test_gpu_tests_are_recorded_per_wheel_and_a_failure_does_not_stop_the_release(setup, tmp_path, monkeypatch):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path)
    by_plan = {id(i.plan): i for i in rplan.items}
    monkeypatch.setattr(release, "run_build",
                        lambda plan, run: _built(run, _publish_as_built(tmp_path, by_plan[id(plan)])))
    tested: list[str] = []

    def gpu_test(item, wheel):  # noqa: ANN001, ANN202
        tested.append(wheel.filename)
        if item.plan.id == "tiny-sm90":
            return GpuTestOutcome("failed", "pytest exit code 1", wheel.wheel, PytestCounts(passed=7, failed=1))
        raise GPUError("no NVIDIA GPU on this machine", why="KFORGE_REQUIRE_GPU=1 turns a skip into a failure")

    result = release.run_release(rplan, _make_run, say=lambda text: None, gpu_test=gpu_test)
    assert len(tested) == 2 and [g.outcome.status for g in result.gpu_failures] == ["failed", "error"]
    wheels = json.loads(result.manifest.read_text())["wheels"]
    assert wheels[0]["gpu_tests"] == {"status": "failed", "reason": "pytest exit code 1", "passed": 7, "failed": 1,
                                      "errors": 0, "skipped": 0}
    assert wheels[1]["gpu_tests"]["status"] == "error" and "KFORGE_REQUIRE_GPU=1" in wheels[1]["gpu_tests"]["reason"]
    assert wheels[0]["doctor"] == "ok"  # next to the doctor's verdict

    # a second run builds nothing and tests the published wheels again
    again = _plan(forge, host, tmp_path)
    monkeypatch.setattr(release, "run_build", lambda plan, run: pytest.fail("nothing should build"))
    result = release.run_release(again, _make_run, say=lambda text: None,
                                 gpu_test=lambda item, wheel: GpuTestOutcome("skipped", "no GPU", wheel.wheel))
    wheels = json.loads(result.manifest.read_text())["wheels"]
    assert [(w["skipped"], w["gpu_tests"]["status"], w["steps"]) for w in wheels] == [(True, "skipped", None)] * 2
    assert not result.gpu_failures


def test_a_partial_run_keeps_the_manifest_entries_of_the_rest(setup, tmp_path, monkeypatch):
    forge, host = setup
    full = _plan(forge, host, tmp_path)
    by_plan = {id(i.plan): i for i in full.items}
    monkeypatch.setattr(release, "run_build",
                        lambda plan, run: _built(run, _publish_as_built(tmp_path, by_plan[id(plan)])))
    release.run_release(full, _make_run, say=lambda text: None)
    part = _plan(forge, host, tmp_path, only=["sm_80"])
    result = release.run_release(part, _make_run, say=lambda text: None)
    data = json.loads(result.manifest.read_text())
    assert [w["target"] for w in data["wheels"]] == ["tiny-sm90", "tiny-sm80"] and data["complete"] is True
    assert data["selection"] == ["sm_80"]
    # an entry whose wheel is gone is dropped, and the manifest says the matrix is incomplete
    gone = Path(tmp_path / "wh" / data["wheels"][0]["wheel"])
    gone.unlink()
    data = json.loads(release.write_manifest(_plan(forge, host, tmp_path, only=["sm_80"])).read_text())
    assert [w["target"] for w in data["wheels"]] == ["tiny-sm80"]
    assert data["complete"] is False and data["missing"] == ["sm_90a/cu130-cp311"]


def test_variant_problem_says_when_this_interpreter_cannot_import_the_wheel(tmp_path):
    forge = load_forge(ROOT)
    here = _gpu_host(python="3.12")
    rplan = release.plan_release(forge, "flash-attn", here, PlanOptions(), cache_dir=tmp_path / "cache",
                                 wheelhouse_root=tmp_path / "wh", only=["sm_90"])
    problems = {i.variant: release.variant_problem(i) for i in rplan.items}
    assert problems["cu130-torch2.11-cp312"] is None
    assert "python 3.10" in problems["cu130-torch2.11-cp310"]
    assert "torch 2.9.1" in problems["cu128-torch2.9-cp312"]


ROOT = Path(__file__).resolve().parents[2]


def _gpu_host(python: str = "3.12") -> HostFacts:
    """The lead's GPU host: Python 3.12, torch 2.11+cu130, nvcc 13.0, an H100."""
    return HostFacts(platform="linux-x86_64", python=python, resources=Resources(16, 128 * 2**30, 64 * 2**30),
                     cuda_version=Version("13.0.88"), nvcc_path="/usr/local/cuda-13.0/bin/nvcc",
                     cuda_home="/usr/local/cuda-13.0", torch_version=Version("2.11.0+cu130"),
                     gpu_arch=parse_arch("sm_90"), gpu_name="NVIDIA H100 80GB HBM3")


def test_the_gpu_host_command_builds_one_wheel_with_the_hosts_interpreter(tmp_path):
    """`kforge release flash-attn --only sm_90/cu130-torch2.11-cp312 --gpu-tests` on the GPU host: one build,
    every part of the variant present, so no environment step (the host has no network to provision one)."""
    forge = load_forge(ROOT)
    options = PlanOptions.from_cascade({"KFORGE_BUILD_ISOLATION": "0"})  # as the GPU host runs it
    assert options.build_isolation is False
    rplan = release.plan_release(forge, "flash-attn", _gpu_host(), options, cache_dir=tmp_path / "cache",
                                 wheelhouse_root=tmp_path / "wh", only=["sm_90/cu130-torch2.11-cp312"])
    assert [(i.plan.id, i.variant) for i in rplan.items] == [("flash-attn-sm90", "cu130-torch2.11-cp312")]
    plan = rplan.items[0].plan
    prov = plan.provisioning
    assert prov is not None and not prov.env_needed
    assert {p.name: p.present for p in prov.parts} == {"cuda": True, "python": True, "torch": True, "cxx11_abi": True}
    assert rplan.items[0].provisioning_summary() == "present"
    assert "environment" not in [s.name for s in steps_for(plan)]
    assert [a.sm for a in plan.archs] == ["sm_90"] and plan.local_version == "cu130torch2.11.sm90"


def test_an_arch_set_in_the_matrix_builds_the_sets_target(setup, tmp_path):
    """archs = ["release"]: one fat wheel per variant, the same build as the target tiny-release (no arch label);
    another set keeps its arch label, so its wheel's name differs from the per-arch ones."""
    (tmp_path / "forge.toml").write_text(forge_toml(PROJECTS.replace(
        'archs = ["sm_80", "sm_90a"]\n\n[projects.tiny.release]\narchs = ["sm_90a", "sm_80"]',
        'archs = ["sm_80", "sm_90a"]\narch_sets = { release = ["sm_80", "sm_90a"], hopper = ["sm_90a"] }\n\n'
        '[projects.tiny.release]\narchs = ["release", "hopper", "sm_80"]')))
    forge, host = load_forge(tmp_path), setup[1]
    rplan = _plan(forge, host, tmp_path)
    assert [(i.key, i.plan.id, [a.sm for a in i.plan.archs], i.plan.local_version) for i in rplan.items] == [
        ("release/cu130-cp311", "tiny-release", ["sm_80", "sm_90a"], None),
        ("hopper/cu130-cp311", "tiny-hopper", ["sm_90a"], "sm90a"),
        ("sm_80/cu130-cp311", "tiny-sm80", ["sm_80"], "sm80")]
    assert [i.plan.id for i in _plan(forge, host, tmp_path, only=["release"]).items] == ["tiny-release"]
    # a set of just sm_90a next to sm_90a itself: the same label, the same wheel name; refused before anything runs
    (tmp_path / "forge.toml").write_text((tmp_path / "forge.toml").read_text().replace(
        'archs = ["release", "hopper", "sm_80"]', 'archs = ["hopper", "sm_90a"]'))
    with pytest.raises(ConfigError) as err:
        _plan(load_forge(tmp_path), host, tmp_path)
    assert "has hopper/cu130-cp311 and sm_90a/cu130-cp311" in err.value.what
    assert "tiny-hopper and tiny-sm90 compile the same archs" in err.value.why


def test_estimate_is_the_longest_first_schedule_once_units_were_measured(setup, tmp_path):
    forge, host = setup
    units = [UnitMeasure(f"/t/build/k{i}.o", 10.0 * (i + 1), 2**30) for i in range(4)]  # 10, 20, 30, 40 s
    profiles.record(tmp_path / "cache", "tiny", 1, units, jobs=1, cpus=2)
    rplan = _plan(forge, host, tmp_path)
    item = rplan.items[0]
    # 2 cpus, the default curve: c(2) = 1.73; 2 lanes, longest first: 40+10 | 30+20 -> 50 s x 1.73
    assert item.plan.jobs.max_jobs == 2 and item.estimate_s == pytest.approx(50 * 1.73)


FLOORED = PROJECTS.replace('[projects.tiny]\nsource = { local = "tiny" }\n',
                           '[projects.tiny]\nsource = { local = "tiny" }\nplatform_tag = "manylinux_2_31"\n')


def test_a_release_on_a_host_newer_than_the_floor_builds_in_kforges_image(setup, tmp_path):
    (tmp_path / "forge.toml").write_text(forge_toml(FLOORED))
    forge, host = load_forge(tmp_path), setup[1].with_(glibc="2.36")
    rplan = release.plan_release(forge, "tiny", host, PlanOptions(), cache_dir=tmp_path / "cache",
                                 wheelhouse_root=tmp_path / "wh", image_tools=True)
    assert {(i.plan.backend, i.plan.image, i.plan.platform_tag) for i in rplan.items} == {
        ("cibuildwheel", "kforge:bullseye", "manylinux_2_31")}
    assert "platform floor: cibuildwheel in kforge:bullseye" in rplan.render() and rplan.to_dict()["route"]
    # an old enough host builds as planned, and the repair holds it to the floor
    old = release.plan_release(forge, "tiny", host.with_(glibc="2.31"), PlanOptions(), cache_dir=tmp_path / "cache",
                               wheelhouse_root=tmp_path / "wh", image_tools=True)
    assert {(i.plan.backend, i.plan.platform_tag) for i in old.items} == {("native", "manylinux_2_31")}


def test_a_release_that_cannot_reach_its_floor_is_refused_before_anything_builds(setup, tmp_path):
    (tmp_path / "forge.toml").write_text(forge_toml(FLOORED))
    forge, host = load_forge(tmp_path), setup[1].with_(glibc="2.36")
    with pytest.raises(ConfigError) as err:
        release.plan_release(forge, "tiny", host, PlanOptions(), cache_dir=tmp_path / "cache",
                             wheelhouse_root=tmp_path / "wh", image_tools=False)
    assert "kforge:bullseye" in str(err.value) and "apt-get install podman runc debootstrap" in str(err.value)
    with pytest.raises(ConfigError) as err:
        release.plan_release(forge, "tiny", host, PlanOptions(backend="native"), cache_dir=tmp_path / "cache",
                             wheelhouse_root=tmp_path / "wh", image_tools=True)
    assert "--backend native" in str(err.value)

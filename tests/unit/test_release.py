"""kforge release's analysis: the matrix planned, priced, and compared with what is published."""

from __future__ import annotations

import json
import zipfile

import pytest
from kforge_testkit import forge_toml
from packaging.version import Version

from kforge import buildinputs, release, wheelhouse
from kforge.config import load_forge
from kforge.errors import BuildError, ConfigError
from kforge.host import HostFacts, Resources
from kforge.options import PlanOptions
from kforge.wheelhouse import Manifest

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


def _plan(forge, host, tmp_path, **kw):
    return release.plan_release(forge, "tiny", host, PlanOptions(**kw), cache_dir=tmp_path / "cache",
                                wheelhouse_root=tmp_path / "wh")


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


def test_run_release_builds_in_order_then_writes_the_manifest(setup, tmp_path, monkeypatch):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path)
    by_plan = {id(i.plan): i for i in rplan.items}
    order: list[str] = []

    def fake_build(plan, run):  # noqa: ANN001, ANN202
        order.append(plan.id)
        return _publish_as_built(tmp_path, by_plan[id(plan)])

    monkeypatch.setattr(release, "run_build", fake_build)
    result = release.run_release(rplan, lambda plan, n: None, say=lambda text: None)
    assert order == ["tiny-sm90", "tiny-sm80"] and len(result.built) == 2
    data = json.loads(result.manifest.read_text())
    assert [(w["target"], w["variant"], w["doctor"], w["skipped"]) for w in data["wheels"]] == [
        ("tiny-sm90", "cu130-cp311", "ok", False), ("tiny-sm80", "cu130-cp311", "ok", False)]
    assert all(len(w["sha256"]) == 64 for w in data["wheels"])


def test_a_failed_build_stops_the_release_without_a_manifest(setup, tmp_path, monkeypatch):
    forge, host = setup
    rplan = _plan(forge, host, tmp_path)
    first = rplan.items[0]

    def fake_build(plan, run):  # noqa: ANN001, ANN202
        if plan is first.plan:
            return _publish_as_built(tmp_path, first)
        raise BuildError("nvcc failed", fix="read the log")

    monkeypatch.setattr(release, "run_build", fake_build)
    with pytest.raises(BuildError) as err:
        release.run_release(rplan, lambda plan, n: None, say=lambda text: None)
    assert "stopped at tiny-sm80" in err.value.why and "built before it: tiny-sm90 (cu130-cp311)" in err.value.why
    assert "kforge release tiny" in err.value.fix
    assert not (tmp_path / "wh" / "releases").exists()
    # the next run skips the wheel that was published
    assert [i.published is not None for i in _plan(forge, host, tmp_path).items] == [True, False]

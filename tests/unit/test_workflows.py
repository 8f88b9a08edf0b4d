"""The generated workflow: valid YAML, one build job per target and platform, and in sync with forge.toml."""

from __future__ import annotations

from pathlib import Path

import yaml

from kforge.config import load_forge
from kforge.targets import expand_matrix
from kforge.workflows import RUNNERS, WORKFLOW, render_workflow, write_workflow

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_workflow_matches_forge_toml() -> None:
    forge = load_forge(ROOT)
    assert (ROOT / WORKFLOW).read_text() == render_workflow(forge), "run `kforge ci generate` and commit the result"


def test_workflow_structure() -> None:
    forge = load_forge(ROOT)
    doc = yaml.safe_load(render_workflow(forge))
    build = doc["jobs"]["build"]
    rows = build["strategy"]["matrix"]["include"]
    expected = {(t.id, p) for p in RUNNERS for t in expand_matrix(forge, p) if t.platform == p}
    assert {(r["target"], r["platform"]) for r in rows} == expected
    assert {"target": "flash-attn-sm120", "platform": "windows-amd64", "arch": "sm120", "runner": "windows-2022"} in rows
    assert any(step.get("run") == 'nox -s "build-${{ matrix.target }}"' for step in build["steps"])
    gpu = doc["jobs"]["gpu-test"]
    assert gpu["env"]["KFORGE_REQUIRE_GPU"] == "1" and gpu["needs"] == "build"
    assert all(r["platform"] == "linux-x86_64" for r in gpu["strategy"]["matrix"]["include"])


def test_write_is_atomic_and_reports_drift(tmp_path: Path) -> None:
    forge = load_forge(ROOT)
    moved = type(forge)(**{**forge.__dict__, "root": tmp_path})
    path, changed = write_workflow(moved, check=True)
    assert changed and not path.exists()  # --check writes nothing
    path, changed = write_workflow(moved)
    assert changed and path.read_text() == render_workflow(forge)
    assert write_workflow(moved) == (path, False)
    assert [p.name for p in path.parent.iterdir()] == ["kforge.yml"]  # no temp file left behind

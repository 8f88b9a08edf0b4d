"""``kforge matrix`` run as a user would: the table, --markdown and --check on a page, and a bad record's message."""

from __future__ import annotations

import json
from pathlib import Path

import kforge_testkit

from kforge.errors import ConfigError, TargetError
from kforge.verified.render import BEGIN, END

ROOT = Path(__file__).resolve().parents[2]

PROJECTS = """
[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a"]
"""

RUN = """
[[run]]
target = "{target}"
via = "kforge"
status = "built-doctor"
host = "cpu-2core"
date = "2026-11-27"
section = "Run log"
"""

PAGE = f"# What has really been built\n\nintro\n\n{BEGIN}\n{END}\n\n## Run log\n\n| target |\n|---|\n"


def checkout(tmp_path: Path, target: str = "demo-sm90") -> Path:
    kforge_testkit.write_forge_toml(tmp_path, PROJECTS)
    (tmp_path / "docs" / "verified").mkdir(parents=True)
    (tmp_path / "docs" / "verified" / "records.toml").write_text(RUN.format(target=target))
    (tmp_path / "docs" / "verified.md").write_text(PAGE)
    return tmp_path


def kforge(*args: str):
    return kforge_testkit.kforge(*args, cwd=ROOT, timeout=120)


def test_the_table_lists_every_target_with_its_status(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    out = kforge("-C", str(root), "matrix")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["TARGET", "PROFILE", "STATUS"]
    assert lines[1].split()[:2] == ["demo-sm80", "-"] and "planned only" in lines[1]
    assert lines[2].startswith("demo-sm90 ") and "built + doctor" in lines[2]
    assert lines[-1].startswith("(2 rows: 0 GPU-tested, 1 built + doctor, 1 planned only, 0 unbuildable here")
    data = json.loads(kforge("-C", str(root), "matrix", "--json").stdout)
    assert [(r["id"], r["status"]) for r in data] == [("demo-sm80", "planned"), ("demo-sm90", "built-doctor")]


def test_markdown_writes_the_section_and_check_fails_until_it_has(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    stale = kforge("-C", str(root), "matrix", "--check")
    assert stale.returncode == ConfigError.exit_code and "kforge matrix --markdown" in stale.stderr
    assert "Traceback" not in stale.stderr
    wrote = kforge("-C", str(root), "matrix", "--markdown")
    assert wrote.returncode == 0 and "wrote the matrix section" in wrote.stdout, wrote.stderr
    page = (root / "docs" / "verified.md").read_text()
    assert page.startswith("# What has really been built\n\nintro\n\n" + BEGIN)
    assert page.endswith(END + "\n\n## Run log\n\n| target |\n|---|\n")
    assert "| `demo-sm90` | sm_90a | linux-x86_64 | - | **built + doctor** |" in page
    assert kforge("-C", str(root), "matrix", "--check").returncode == 0
    again = kforge("-C", str(root), "matrix", "--markdown")
    assert "was current" in again.stdout and (root / "docs" / "verified.md").read_text() == page


def test_a_record_naming_an_unknown_target_is_one_paragraph_and_a_target_error(tmp_path: Path) -> None:
    root = checkout(tmp_path, target="demo-sm91")
    for args in ((), ("--markdown",)):
        out = kforge("-C", str(root), "matrix", *args)
        assert out.returncode == TargetError.exit_code, out.stdout
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert "run[0]" in out.stderr and "'demo-sm91'" in out.stderr and "kforge targets" in out.stderr
    assert (root / "docs" / "verified.md").read_text() == PAGE  # nothing written


def test_the_committed_page_is_current() -> None:
    out = kforge("matrix", "--check")
    assert out.returncode == 0, out.stderr

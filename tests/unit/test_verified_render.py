"""The matrix as text, and docs/verified.md's generated section, which must be what the committed records give."""

from __future__ import annotations

import sys
from pathlib import Path

import kforge_testkit
import pytest

from kforge.config.forge import load_forge
from kforge.config.targets import expand_matrix
from kforge.errors import ConfigError
from kforge.verified.matrix import build_rows
from kforge.verified.records import RECORDS_FILE, load_runs, load_unfit, parse_runs
from kforge.verified.render import (
    BEGIN,
    DOC_FILE,
    END,
    as_json,
    markdown,
    outside,
    replace_section,
    summary,
    text_table,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
HOST = "linux-x86_64"


def committed():
    forge = load_forge(ROOT)
    return forge, build_rows(forge, load_runs(forge), HOST, load_unfit(forge))


def test_the_committed_page_holds_exactly_what_the_committed_records_give() -> None:
    forge, rows = committed()
    page = (ROOT / DOC_FILE).read_text(encoding="utf-8")
    assert replace_section(page, markdown(rows, HOST)) == page, "run `kforge matrix --markdown` and commit the page"


def test_the_page_has_a_row_for_every_declared_target_and_profile() -> None:
    forge, _ = committed()
    page = (ROOT / DOC_FILE).read_text(encoding="utf-8")
    section = page[page.index(BEGIN) : page.index(END)]
    listed = [line.split(" | ")[0].strip("| `") for line in section.splitlines() if line.startswith("| `")]
    expected = [t.id for t in expand_matrix(forge, HOST) for _ in (forge.projects[t.project].profiles or [None])]
    assert listed == expected


PROJECTS = """
[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_90a"]
platforms = ["linux-x86_64", "windows-amd64"]
"""

RUNS = """
[[run]]
target = "demo-sm90"
via = "kforge"
status = "gpu-tested"
host = "nvidia-h200"
device = "NVIDIA H200"
date = "2026-11-27"
time = "02:34"
tests = "5 passed, 0 failed"
section = "Run log"

[[run]]
target = "demo-sm90"
via = "kforge"
status = "failed"
host = "nvidia-h100-x1"
device = "NVIDIA H100 80GB HBM3"
date = "2026-11-28"
tests = "4 passed, 1 failed"
section = "Run log"

[[run]]
target = "demo-sm90"
via = "cmake"
status = "gpu-tested"
host = "nvidia-h200"
device = "NVIDIA H200"
date = "2026-11-20"
section = "Run log"
"""


@pytest.fixture()
def rows(tmp_path: Path):
    kforge_testkit.write_forge_toml(tmp_path, PROJECTS, windows=True)
    forge = load_forge(tmp_path)
    return build_rows(forge, parse_runs(forge, tomllib.loads(RUNS), tmp_path / RECORDS_FILE), HOST)


def test_the_markdown_section_says_the_counts_and_each_rows_evidence(rows) -> None:
    text = markdown(rows, HOST)
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "2 rows: 1 GPU-tested, 0 built + doctor, 0 planned only, 1 unbuildable here" in text
    (demo,) = [line for line in text.splitlines() if line.startswith("| `demo-sm90` ")]
    cells = [c.strip() for c in demo.split(" | ")]
    assert cells[4] == "**GPU-tested on NVIDIA H200**"
    assert cells[5] == (
        "2026-11-27 02:34, nvidia-h200: 5 passed, 0 failed; 2 runs (1 gpu-tested, 1 failed); "
        "newest failed: 2026-11-28, nvidia-h100-x1: 4 passed, 1 failed"
    )
    assert cells[6].rstrip(" |") == "GPU-tested on NVIDIA H200 (1 record, cmake)"
    assert "unbuildable here: needs a windows-amd64 host" in text


def test_text_table_and_json_carry_the_same_rows(rows) -> None:
    table = text_table(rows).splitlines()
    assert table[0].split()[:3] == ["TARGET", "PROFILE", "STATUS"]
    assert table[1].startswith("demo-sm90 ") and "outside kforge: GPU-tested on NVIDIA H200" in table[1]
    assert table[-1] == f"({summary(rows)}; the runs: {RECORDS_FILE})"
    data = as_json(rows)
    assert [r["id"] for r in data] == ["demo-sm90", "demo-sm90-windows"]
    assert [r["status"] for r in data[0]["runs"]] == ["gpu-tested", "failed"]
    assert data[0]["outside_kforge"][0]["via"] == "cmake" and data[1]["reason"] == "needs a windows-amd64 host"


def test_replace_section_keeps_every_line_outside_the_markers() -> None:
    page = f"# Title\n\nintro\n\n{BEGIN}\nold table\n{END}\n\n## Run log\n| a |\n"
    new = replace_section(page, f"{BEGIN}\nnew\n{END}")
    assert new == f"# Title\n\nintro\n\n{BEGIN}\nnew\n{END}\n\n## Run log\n| a |\n"


@pytest.mark.parametrize("page", ["# no markers\n", f"{BEGIN}\n{BEGIN}\n{END}\n", f"{END}\nx\n{BEGIN}\n"])
def test_a_page_without_one_pair_of_markers_is_refused(page: str) -> None:
    with pytest.raises(ConfigError, match="no single generated matrix section"):
        replace_section(page, f"{BEGIN}\n{END}")


def test_a_stopped_run_is_shown_as_stopped_and_leaves_the_row_as_its_other_runs_make_it(tmp_path: Path) -> None:
    kforge_testkit.write_forge_toml(tmp_path, PROJECTS, windows=True)
    forge = load_forge(tmp_path)
    stopped = (
        '[[run]]\ntarget = "demo-sm90"\nvia = "kforge"\nstatus = "stopped"\nhost = "nvidia-h200-x4"\n'
        'date = "2026-11-29"\ntests = "stopped after 565 s: the device time ran out"\nsection = "Run log"\n'
    )
    alone = build_rows(forge, parse_runs(forge, tomllib.loads(stopped), tmp_path / RECORDS_FILE), HOST)
    assert alone[0].status == "planned" and alone[0].label == "planned only"  # a stopped run alone is no build
    rows = build_rows(forge, parse_runs(forge, tomllib.loads(RUNS + stopped), tmp_path / RECORDS_FILE), HOST)
    (demo,) = [line for line in markdown(rows, HOST).splitlines() if line.startswith("| `demo-sm90` ")]
    cells = [c.strip() for c in demo.split(" | ")]
    assert cells[4] == "**GPU-tested on NVIDIA H200**"
    assert cells[5].endswith(
        "3 runs (1 gpu-tested, 1 failed, 1 stopped); "
        "newest stopped: 2026-11-29, nvidia-h200-x4: stopped after 565 s: the device time ran out"
    )
    outside_only = stopped.replace('via = "kforge"', 'via = "cmake"')
    rows = build_rows(forge, parse_runs(forge, tomllib.loads(outside_only), tmp_path / RECORDS_FILE), HOST)
    assert outside(rows[0]) == "stopped (1 record, cmake)"

"""A tiny real ninja build (gcc units wrapped by kforge's measure wrapper) -> .ninja_log -> report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.build import measure, report

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if not shutil.which("ninja") or not shutil.which("gcc"):
        pytest.skip("ninja and gcc are needed")
    d = tmp_path_factory.mktemp("ninja")
    for i in range(3):
        (d / f"u{i}.c").write_text(f"int f{i}(int x) {{ return x * {i + 2}; }}\n")
    (d / "big.c").write_text(  # a unit that takes the compiler visibly longer
        "".join(f"int g{i}(int x) {{ return x * {i} + {i}; }}\n" for i in range(3000))
    )
    measure = f"{sys.executable} -m kforge.build.measure measure --log units.jsonl --output $out --"
    (d / "build.ninja").write_text(
        "rule cc\n"
        f"  command = {measure} gcc -O2 -c $in -o $out\n"
        "rule link\n  command = gcc -shared $in -o $out\n"
        + "".join(f"build u{i}.o: cc u{i}.c\n" for i in range(3))
        + "build big.o: cc big.c\n"
        + "build libtiny.so: link u0.o u1.o u2.o big.o\n"
    )
    out = subprocess.run(["ninja", "-C", str(d), "-j", "2"], capture_output=True, text=True, check=True)
    return d, out.stdout


def test_real_ninja_log_becomes_a_report(built: tuple[Path, str], tmp_path: Path) -> None:
    d, _ = built
    entries = report.parse_ninja_log(d / ".ninja_log")
    assert {e.output for e in entries} == {"u0.o", "u1.o", "u2.o", "big.o", "libtiny.so"}
    measures = {m.output: m for m in measure.read_measures(d / "units.jsonl")}
    assert set(measures) == {"u0.o", "u1.o", "u2.o", "big.o"}
    assert all(m.peak_rss > 1_000_000 and m.returncode == 0 for m in measures.values())
    rep = report.build_report(entries, {k: m.peak_rss for k, m in measures.items()}, title="tiny")
    assert rep.max_parallel <= 2  # -j 2
    by = {u.output: u for u in rep.units}
    link = by["libtiny.so"]
    assert all(link.start_s >= by[o].end_s - 0.002 for o in ("u0.o", "u1.o", "u2.o", "big.o"))
    assert by["big.o"].seconds >= by["u0.o"].seconds
    assert by["libtiny.so"].peak_rss is None and by["big.o"].peak_rss == measures["big.o"].peak_rss
    json_path, html_path = report.write_report(rep, tmp_path)
    data = json.loads(json_path.read_text())
    assert len(data["units"]) == 5 and data["wall_seconds"] == pytest.approx(rep.wall_seconds)
    assert html_path.read_text().count("<rect") == 5


def test_progress_from_real_ninja_output(built: tuple[Path, str]) -> None:
    _, stdout = built
    clock = iter(float(i) for i in range(100))
    progress = report.NinjaProgress(clock=lambda: next(clock))
    states = [s for line in stdout.splitlines() if (s := progress.feed(line))]
    assert [s.done for s in states] == [1, 2, 3, 4, 5]
    assert {s.total for s in states} == {5}
    assert states[-1].eta == 0


def test_rebuild_after_touch_appends_a_second_build(built: tuple[Path, str]) -> None:
    d, _ = built
    before = report.parse_ninja_log(d / ".ninja_log", last_build_only=False)
    (d / "u1.c").write_text("int f1(int x) { return x * 7; }\n")
    subprocess.run(["ninja", "-C", str(d)], capture_output=True, text=True, check=True)
    last = report.parse_ninja_log(d / ".ninja_log")
    assert {e.output for e in last} == {"u1.o", "libtiny.so"}
    assert len(report.parse_ninja_log(d / ".ninja_log", last_build_only=False)) == len(before)

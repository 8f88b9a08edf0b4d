"""kforge.build.report: .ninja_log parsing, the report, the timeline, and the [n/m] progress parser."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from kforge.build import report
from kforge.errors import BuildError


def _log(tmp: Path, version: int, lines: list[str]) -> Path:
    path = tmp / ".ninja_log"
    path.write_text(f"# ninja log v{version}\n" + "".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("version", [5, 6, 7])
def test_parse_versions(tmp_path: Path, version: int) -> None:
    # ninja appends a line when an edge finishes: end times rise within a build
    path = _log(tmp_path, version, ["0\t1500\t111\ta.o\tdeadbeef", "1500\t1600\t113\tc.o\t1", "10\t2500\t112\tb.o\tcafe"])
    entries = report.parse_ninja_log(path)
    assert [e.output for e in entries] == ["a.o", "b.o", "c.o"]  # sorted by start
    assert entries[1] == report.NinjaEntry(10, 2500, 112, "b.o", "cafe")


def test_only_the_last_build_and_last_entry_per_output(tmp_path: Path) -> None:
    path = _log(tmp_path, 5, [
        "0\t1000\t1\ta.o\th1", "0\t3000\t1\tb.o\th2",  # build 1
        "0\t400\t2\ta.o\th3",  # build 2: end time drops
        "junk line", "1\t2\tnot-a-number\tx\ty",
    ])
    last = report.parse_ninja_log(path)
    assert [(e.output, e.end_ms) for e in last] == [("a.o", 400)]
    everything = report.parse_ninja_log(path, last_build_only=False)
    assert {e.output: e.end_ms for e in everything} == {"a.o": 400, "b.o": 3000}


def test_bad_logs_raise_build_errors(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="cannot read"):
        report.parse_ninja_log(tmp_path / "missing")
    (tmp_path / "x").write_text("hello\n")
    with pytest.raises(BuildError, match="not a ninja log"):
        report.parse_ninja_log(tmp_path / "x")
    with pytest.raises(BuildError, match="v4"):
        report.parse_ninja_log(_log(tmp_path, 4, []))


def test_build_report_lanes_peaks_and_totals() -> None:
    e = report.NinjaEntry
    entries = [e(0, 4000, 0, "obj/a.o", ""), e(0, 2000, 0, "obj/b.o", ""), e(2000, 5000, 0, "obj/c.o", ""),
               e(4500, 6000, 0, "lib.so", "")]
    rep = report.build_report(entries, {"/abs/build/obj/a.o": 3_000_000_000, "obj/c.o": 1_000_000_000}, title="t")
    by = {u.output: u for u in rep.units}
    assert rep.wall_seconds == 6.0 and rep.busy_seconds == pytest.approx(4 + 2 + 3 + 1.5)
    assert rep.max_parallel == 2
    assert by["obj/a.o"].peak_rss == 3_000_000_000  # matched by path suffix
    assert by["obj/b.o"].peak_rss is None
    assert by["obj/c.o"].lane == by["obj/b.o"].lane  # c starts when b ends
    lanes_at = {}
    for u in rep.units:  # no two units overlap on a lane
        for other in lanes_at.get(u.lane, []):
            assert u.start_s >= other.end_s or u.end_s <= other.start_s
        lanes_at.setdefault(u.lane, []).append(u)
    assert rep.peak_rss_max == 3_000_000_000
    assert [u.output for u in rep.slowest(2)] == ["obj/a.o", "obj/c.o"]


def test_empty_report() -> None:
    rep = report.build_report([])
    assert rep.units == () and rep.wall_seconds == 0 and rep.peak_rss_max is None


def test_write_report_json_and_html(tmp_path: Path) -> None:
    e = report.NinjaEntry
    rep = report.build_report([e(0, 1000, 0, "x<&>.o", ""), e(0, 61000, 0, "long.o", "")], {"long.o": 5 * 10**9},
                              title="fmha-sm90")
    json_path, html_path = report.write_report(rep, tmp_path / "out")
    data = json.loads(json_path.read_text())
    assert data["title"] == "fmha-sm90" and len(data["units"]) == 2 and data["max_parallel"] == 2
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "</html>" in page
    assert "x&lt;&amp;&gt;.o" in page and "x<&>.o" not in page  # escaped
    assert "peak 5.00 GB" in page
    assert page.count("<rect") == 2
    assert not list((tmp_path / "out").glob(".*tmp"))
    svg = ElementTree.parse(tmp_path / "out" / "timeline.svg").getroot()  # a standalone picture, well-formed
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(svg.findall(".//{http://www.w3.org/2000/svg}rect")) == 2


def test_progress_parser_counts_elapsed_and_eta() -> None:
    now = [100.0]
    p = report.NinjaProgress(clock=lambda: now[0])
    assert p.feed("ninja: Entering directory `build'") is None
    now[0] = 110.0
    s = p.feed("[1/4] /usr/local/cuda/bin/nvcc -c a.cu -o a.o")
    assert (s.done, s.total, s.elapsed, s.eta) == (1, 4, 10.0, 30.0)
    now[0] = 120.0
    s = p.feed("  [3/4] c++ b.o")
    assert s.eta == pytest.approx(20 / 3)
    assert p.state.done == 3 and p.state.last.startswith("c++")
    assert report.NinjaProgress(clock=lambda: 0.0).feed("[0/9] starting").eta is None



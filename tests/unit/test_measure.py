"""kforge.build.measure: the one measuring wrapper (``run`` for a whole build command, ``unit`` as a compile
launcher, ``measure`` for a named rule), on real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kforge.build import measure


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_peak_wrapper_measures_the_largest_descendant(tmp_path):
    out = tmp_path / "peak.json"
    # a grandchild (python under sh) holding ~150 MB: wait4 on the sh must still see it
    child = f"{sys.executable} -c \"b = bytearray(150 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096])\""
    rc = measure.main(["run", str(out), "--", "sh", "-c", child])
    data = json.loads(out.read_text())
    assert rc == 0 and data["returncode"] == 0
    assert 150 * 2**20 <= data["peak_rss"] < 1024 * 2**20


def test_peak_wrapper_passes_exit_codes_and_signals(tmp_path):
    out = tmp_path / "peak.json"
    assert measure.main(["run", str(out), "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert measure.main(["run", str(out), "--", sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]) == 137
    assert measure.main(["run", str(out), "--", str(tmp_path / "no-such-compiler")]) == 127


def _fake_compiler(tmp_path: Path, worker_seconds: float | None) -> Path:
    """A 'compiler' driver that runs a worker process named cc1plus (as gcc does), or none at all
    (as a compiler cache's hit does), then exits 0."""
    (tmp_path / "cc1plus").symlink_to(sys.executable)
    work = f'"$(dirname "$0")/cc1plus" -c "import time; time.sleep({worker_seconds})"' if worker_seconds else "true"
    return script(tmp_path / "fakecc", f"{work}\n")


def test_unit_launcher_names_the_unit_by_its_object(tmp_path):
    log = tmp_path / "units.jsonl"
    cc = _fake_compiler(tmp_path, 0.3)
    rc = measure.main(["unit", str(log), "--", str(cc), "-c", "a.cu", "-o", "obj/a.o", "--threads", "2", "-O0"])
    assert rc == 0
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["output"] == "obj/a.o" and entry["nvcc_threads"] == 2 and entry["peak_rss"] > 0
    assert 0.3 <= entry["seconds"] < 5
    # a link (no -c) runs, keeps its exit code, and is not recorded as a compile unit
    link = tmp_path / "link.py"
    link.write_text("raise SystemExit(4)\n")
    assert measure.main(["unit", str(log), "--", sys.executable, str(link), "-o", "lib.so", "a.o"]) == 4
    assert len(log.read_text().splitlines()) == 1


def test_unit_launcher_skips_compiler_cache_hits(tmp_path):
    """No compiler worker ran (a ccache hit): its milliseconds and MB must not reach the job model."""
    log = tmp_path / "units.jsonl"
    cc = _fake_compiler(tmp_path, None)
    assert measure.main(["unit", str(log), "--", str(cc), "-c", "a.cu", "-o", "obj/a.o"]) == 0
    assert not log.exists()


@pytest.mark.parametrize(("cmd", "expected"), [
    (["nvcc", "-c", "a.cu", "-o", "a.o", "-O3"], "a.o"),
    (["nvcc", "--output-file=b.o", "-c", "b.cu"], "b.o"),
    (["nvcc", "-O0", "-c", "c.cu"], "c.cu"),  # no -o: the last argument
    (["nvcc", "-odir", "x", "-c", "d.cu", "-o", "d.o"], "d.o"),  # -odir is not -o
])
def test_output_of(cmd, expected):
    assert measure.output_of(cmd) == expected


def test_measure_wrapper_logs_time_and_peak(tmp_path: Path) -> None:
    log = tmp_path / "units.jsonl"
    code = "x = bytearray(80 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])"
    rc = measure.main(["measure", "--log", str(log), "--output", "big.o", "--", sys.executable, "-c", code])
    assert rc == 0
    rc = measure.main(["measure", "--log", str(log), "--output", "fail.o", "--", sys.executable, "-c", "raise SystemExit(3)"])
    assert rc == 3
    got = {m.output: m for m in measure.read_measures(log)}
    assert got["big.o"].peak_rss >= 80 * 1024 * 1024
    assert got["big.o"].returncode == 0 and got["big.o"].seconds > 0
    assert got["fail.o"].returncode == 3


def _sleeping_tree() -> subprocess.Popen:
    """A Python process with two children (a Python holding 64 MiB and a sleep)."""
    proc = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "a = subprocess.Popen([sys.executable, '-c', 'import time; x = bytearray(64 << 20); time.sleep(30)'])\n"
        "b = subprocess.Popen(['sleep', '30'])\n"
        "time.sleep(30)\n")])
    return proc


def _wait_for_tree(pid: int, names: set[str]) -> tuple[int, set[str]]:
    """The tree once it shows ``names`` and its memory has settled (two samples 0.1 s apart within 1 MiB): on busy
    cores the children are still starting up (the interpreter, the 64 MiB) for a while after they appear."""
    last = -1
    for _ in range(300):
        total, seen = measure.process_tree(pid)
        if names <= seen and total > 64 << 20 and abs(total - last) < 1 << 20:
            return total, seen
        last = total
        time.sleep(0.1)
    raise AssertionError(f"the tree of {pid} never showed {names} with a steady size: {seen}, {total} bytes")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_tree_walks_children_and_matches_the_full_scan():
    proc = _sleeping_tree()
    try:
        total, seen = _wait_for_tree(proc.pid, {"sleep"})
        scan_total, scan_seen = measure._process_tree_by_scan(proc.pid, os.sysconf("SC_PAGE_SIZE"))
        assert seen == scan_seen
        assert abs(total - scan_total) < 8 << 20  # the same processes, sampled a moment apart
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_process_tree_falls_back_to_the_scan_without_children_files(monkeypatch):
    proc = _sleeping_tree()
    try:
        _wait_for_tree(proc.pid, {"sleep"})
        monkeypatch.setattr(measure, "_children", lambda pid: None)
        total, seen = measure.process_tree(proc.pid)
        assert "sleep" in seen and total > 64 << 20
    finally:
        proc.kill()
        proc.wait()


def test_process_tree_of_a_gone_process_is_empty():
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert measure.process_tree(proc.pid) == (0, set())

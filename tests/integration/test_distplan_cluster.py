"""The plan against a real sccache-dist scheduler: one build server pinned to one core, asked by ``kforge plan``.

Needs what tests/integration/test_sccache_dist.py needs (sccache, sccache-dist, bubblewrap, root, nvcc); skips
naming what is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kforge_doctor_builders import find_nvcc

from kforge.build import distcluster

ROOT = Path(__file__).resolve().parents[2]
SEARCH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _missing() -> str | None:
    return distcluster.missing(SEARCH) or (None if find_nvcc() else "no nvcc")


pytestmark = [pytest.mark.integration, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def test_plan_sizes_the_jobs_by_the_clusters_cpus(tmp_path: Path):
    one_cpu = [(sorted(os.sched_getaffinity(0))[0],)]
    with distcluster.LocalCluster(tmp_path / "cluster", servers=1, cpus=one_cpu, search=SEARCH) as cluster:
        cluster.wait_for_servers()
        env = {**cluster.client_env(), "KFORGE_CACHE": str(tmp_path / "cache")}
        out = subprocess.run([sys.executable, "-m", "kforge", "plan", "fmha-sm90", "--json"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        text = subprocess.run([sys.executable, "-m", "kforge", "plan", "fmha-sm90"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120).stdout
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["distribute"]["servers"] == 1 and plan["distribute"]["cpus"] == 1
    assert plan["jobs"]["max_jobs"] == 1  # the cluster's one cpu, not this host's cores
    assert f"scheduler http://{cluster.sched}" in text and "1 server, 1 cpu;" in text

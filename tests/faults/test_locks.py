"""A build or publish that meets a lock says who holds it and keeps saying it waits; --no-wait fails at once;
SIGINT while waiting ends it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from faultkit import DRIVER, ROOT, fake_root, publish_a, run_driver
from kforge_wheelfixtures import snapshot

from kforge import locking
from kforge.errors import BuildError, PublishError
from kforge.wheels import wheelhouse

CUDA_ENV = {"CUDA_HOME": os.environ.get("CUDA_HOME", "/usr/local/cuda-13.0")}


def test_build_no_wait_names_the_holder_and_fails_at_once(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    lock = root / ".kforge" / "work" / "fmha-sm90.lock"
    lock.parent.mkdir(parents=True)
    with locking.hold(lock, target="fmha-sm90", what="the work folder of fmha-sm90", error=BuildError):
        out = run_driver("cli", "-C", str(root), "build", "fmha-sm90", "--wheelhouse", str(tmp_path / "wh"),
                         "--no-wait", "--no-progress", env=CUDA_ENV, cwd=root)
    assert out.returncode == 7, out.stderr
    assert f"the work folder of fmha-sm90 is locked by pid {os.getpid()} (fmha-sm90) since 20" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_waiting_build_says_so_and_sigint_ends_it(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    wh = tmp_path / "wh"
    publish_a(wh, tmp_path)
    before = snapshot(wh)
    lock = root / ".kforge" / "work" / "fmha-sm90.lock"
    lock.parent.mkdir(parents=True)
    with locking.hold(lock, target="fmha-sm90", what="the work folder of fmha-sm90", error=BuildError):
        proc = subprocess.Popen([sys.executable, str(DRIVER), "cli", "-C", str(root), "build", "fmha-sm90",
                                 "--wheelhouse", str(wh), "--no-progress"], cwd=root, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, **CUDA_ENV, "PYTHONPATH": str(ROOT / "src"),
                                     locking.REPORT_ENV: "0.3"})
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum("still waiting" in ln for ln in lines) < 2:
            lines.append(proc.stderr.readline())
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    waiting = [ln for ln in lines if "waiting for the work folder of fmha-sm90" in ln]
    assert waiting[0].startswith(f"kforge: waiting for the work folder of fmha-sm90: locked by pid {os.getpid()} "
                                 "(fmha-sm90) since 20"), lines
    assert sum("still waiting" in ln for ln in waiting) >= 2
    assert proc.returncode == 130 and "kforge: interrupted" in rest and "Traceback" not in rest
    assert snapshot(wh) == before
    assert not (root / ".kforge" / "work" / "fmha-sm90").exists()  # it never started


def test_wheelhouse_no_wait(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    publish_a(wh, tmp_path)
    with locking.hold(wh / wheelhouse.LOCK_NAME, target="flash-attn-sm90", what="the wheelhouse", error=PublishError):
        t0 = time.monotonic()
        out = run_driver("cli", "wheelhouse", "--wheelhouse", str(wh), "--no-wait", "index")
        took = time.monotonic() - t0
    assert out.returncode == 11 and "locked by pid" in out.stderr and "(flash-attn-sm90)" in out.stderr
    assert took < 30 and "Traceback" not in out.stderr

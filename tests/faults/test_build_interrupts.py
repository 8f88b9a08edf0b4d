"""SIGINT during each step of a real `kforge build fmha-sm90` (as Ctrl-C in a terminal: the whole process
group): exit 130, one line, no traceback, and the wheelhouse as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import DRIVER, ROOT, assert_kept, fake_root, publish_a
from kforge_wheelfixtures import snapshot

CUDA_ENV = {"CUDA_HOME": os.environ.get("CUDA_HOME", "/usr/local/cuda-13.0")}


@pytest.mark.parametrize("step", ["preflight", "source", "toolchain", "build"])
def test_sigint_during_a_build_step(tmp_path: Path, step: str) -> None:
    root = fake_root(tmp_path)
    wh = tmp_path / "wh"
    publish_a(wh, tmp_path)
    before = snapshot(wh)
    proc = subprocess.Popen([sys.executable, str(DRIVER), "cli", "-C", str(root), "build", "fmha-sm90",
                             "--wheelhouse", str(wh), "--no-progress"], cwd=root, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **CUDA_ENV, "PYTHONPATH": str(ROOT / "src"),
                                 "KFORGE_COMPILER_CACHE": "none"})
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("==> [") and f"] {step}" in line:
            break
    else:
        pytest.fail("the build never reached " + step)
    assert any(f"] {step}" in ln for ln in seen), "".join(seen)
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: kforge and whatever it runs (cmake, nvcc)
    _, rest = proc.communicate(timeout=120)
    out = "".join(seen) + rest
    if proc.returncode == 0:
        pytest.skip(f"the {step} step finished before the signal landed")  # a fast machine; nothing to check
    assert proc.returncode == 130, out[-3000:]
    assert "kforge: interrupted" in rest and "Traceback" not in out
    assert_kept(before, wh)
    assert snapshot(wh) == before  # nothing new published either

"""A nox session run for real, as a user runs it from a checkout: its own venv, kforge installed into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_patch_session_reports_the_series_against_the_pinned_sdist(tmp_path: Path) -> None:
    env = dict(os.environ, KFORGE_CACHE=str(tmp_path / "cache"), COLUMNS="200")
    out = subprocess.run([sys.executable, "-m", "nox", "-s", "patch-flash-attn", "--envdir", str(tmp_path / "nox")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "0001-setup-strip-whitespace-from-NVCC_THREADS.patch" in text and "applies" in text
    assert "Session patch-flash-attn was successful" in text

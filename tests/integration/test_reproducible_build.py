"""Two builds of fmha-sm90 from the same source give byte-identical wheels (no compiler cache: real compiles).

They share kforge's cache, so the second one starts its units longest first (the ninja shim, from the unit
times the first measured): the order must not change a byte either.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_two_fmha_builds_are_byte_identical(tmp_path: Path) -> None:
    digests = []
    for i in (1, 2):
        env = dict(os.environ, KFORGE_CACHE=str(tmp_path / "cache"), KFORGE_COMPILER_CACHE="none")
        env.pop("SOURCE_DATE_EPOCH", None)  # kforge sets it from the source
        wh = tmp_path / f"wh{i}"
        out = subprocess.run([sys.executable, "-m", "kforge.cli", "build", "fmha-sm90", "--wheelhouse", str(wh),
                              "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "reproducible: SOURCE_DATE_EPOCH=" in out.stderr and "-frandom-seed=fmha" in out.stderr
        if i == 2:
            assert "build order: longest first" in out.stderr and "statements moved" in out.stderr
        (wheel,) = (wh / "fmha").glob("*.whl")
        digests.append((wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()))
    assert digests[0] == digests[1]

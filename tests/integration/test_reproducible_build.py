"""Two builds of fmha-sm90 from the same source in two different folders give byte-identical wheels (no compiler
cache: real compiles).

Each build runs in its own clone of this repository (folders of different lengths, as two developers' or two
CI runners' checkouts are): the plan maps the checkout's folder to one name (kforge.build.reproducible), so no path
of either folder may reach the wheel. They share kforge's cache, so the second one starts its units longest
first (the ninja shim, from the unit times the first measured): the order must not change a byte either.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def clone(dest: Path) -> Path:
    """A real checkout of this repository's HEAD (kernels/fmha, forge.toml and the git history the build's
    SOURCE_DATE_EPOCH is read from; uncommitted changes are not in it). A local clone shares the object files,
    so it takes a second. kforge itself is the one under test (this interpreter's), not the clone's copy."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs this repository as a git checkout (the builds run in two clones of it)")
    dest.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True, timeout=300)
    return dest


def test_two_fmha_builds_in_two_folders_are_byte_identical(tmp_path: Path) -> None:
    folders = (clone(tmp_path / "a" / "x"), clone(tmp_path / "bb" / "yyy"))
    digests = []
    for i, folder in enumerate(folders, 1):
        env = dict(os.environ, KFORGE_CACHE=str(tmp_path / "cache"), KFORGE_COMPILER_CACHE="none")
        env.pop("SOURCE_DATE_EPOCH", None)  # kforge sets it from the source
        wh = tmp_path / f"wh{i}"
        out = subprocess.run([sys.executable, "-m", "kforge.cli", "build", "fmha-sm90", "--wheelhouse", str(wh),
                              "--no-progress"], cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "reproducible: SOURCE_DATE_EPOCH=" in out.stderr and "-frandom-seed=fmha" in out.stderr
        assert f"-ffile-prefix-map={folder}=/kforge" in out.stderr  # the plan's map, for host and device code
        if i == 2:
            assert "build order: longest first" in out.stderr and "statements moved" in out.stderr
        (wheel,) = (wh / "fmha").glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            leaks = [(n, str(f)) for n in zf.namelist() for f in folders if os.fsencode(str(f)) in zf.read(n)]
        assert leaks == []
        digests.append((wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest()))
    assert digests[0] == digests[1]

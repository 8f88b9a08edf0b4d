"""The suite's own caches (tests/conftest.py): a used developer machine runs the same tests as a fresh CI one."""

from __future__ import annotations

import os
from pathlib import Path

from kforge_testkit import CACHE_VARIABLES


def test_every_cache_lives_in_the_session_folder(own_caches: Path) -> None:
    for name, sub in CACHE_VARIABLES.items():
        assert Path(os.environ[name]) == own_caches / sub, name
        assert not Path(os.environ[name]).is_relative_to(Path.home() / ".cache"), name
    assert os.environ["UV_NO_CONFIG"] == "1"
    assert int(os.environ["SCCACHE_SERVER_PORT"]) != 4226  # not a machine's sccache daemon


def test_the_tools_themselves_use_the_session_caches(own_caches: Path) -> None:
    """Asked directly, not read back from the variables the fixture set."""
    import shutil
    import subprocess
    import sys

    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if Path(uv).exists() or shutil.which("uv"):
        out = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, timeout=60)
        assert Path(out.stdout.strip()) == own_caches / "uv", out.stderr
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, timeout=60)
    assert Path(out.stdout.strip()) == own_caches / "pip", out.stderr
    if shutil.which("ccache"):
        out = subprocess.run(["ccache", "-k", "cache_dir"], capture_output=True, text=True, timeout=60)
        assert Path(out.stdout.strip()) == own_caches / "ccache", out.stderr


def test_a_machines_build_options_do_not_reach_the_tests() -> None:
    assert not [n for n in os.environ if n.startswith(("SCCACHE_", "CCACHE_", "UV_"))
                and n not in ("SCCACHE_DIR", "SCCACHE_SERVER_PORT", "CCACHE_DIR", "CCACHE_CONFIGPATH", "UV_CACHE_DIR",
                              "UV_NO_CONFIG")]
    assert "KFORGE_CUDA" not in os.environ and "KFORGE_COMPILER_CACHE" not in os.environ


def test_kforge_finds_the_session_cache(own_caches: Path) -> None:
    from kforge.fsutil import cache_dir

    assert cache_dir() == own_caches / "kforge"

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


def test_kforge_finds_the_session_cache(own_caches: Path) -> None:
    from kforge.fsutil import cache_dir

    assert cache_dir() == own_caches / "kforge"

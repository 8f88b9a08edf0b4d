"""The real flash-attn series against the real pinned sdist from PyPI (sha256-verified).

Network: PyPI only, once; later runs use the cache ($KFORGE_CACHE or ~/.cache/kforge). Skips
with the reason when PyPI cannot be reached, and fails when it can and the series does not apply.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kforge.config.forge import load_forge
from kforge.errors import SourceError
from kforge.sources import patches
from kforge.sources.series import PatchContext, load_series

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _cache() -> Path:
    env = os.environ.get("KFORGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kforge"


@pytest.mark.parametrize("platform", ["linux-x86_64", "windows-amd64"])
def test_flash_attn_series_applies_to_pinned_sdist(platform: str) -> None:
    project = load_forge(REPO).project("flash-attn")
    sd = project.sdist
    assert sd is not None and project.patches is not None
    ctx = PatchContext(platform, tuple(a.sm for a in project.archs), project.upstream_version)
    try:
        report = patches.check_sdist(sd.name, sd.version, load_series(project.patches), ctx, cache_dir=_cache(),
                                     sha256=sd.sha256, index_url=sd.index_url)
    except SourceError as exc:
        if "could not read" in exc.what:  # no route to the index: not a verdict on the series
            pytest.skip(f"package index unreachable: {exc.render()}")
        raise
    assert report.sha256 == sd.sha256
    states = {s.name: str(s.state) for s in report.statuses}
    assert report.ok, states
    expected_applies = 5 if platform.startswith("windows") else 4  # 0003 is Windows-only
    assert list(states.values()).count("applies") == expected_applies

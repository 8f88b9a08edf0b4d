"""The kit's pure parts: wheel platform tags for pip, and the manifest's round trip and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.errors import SourceError
from kforge.sources.kit import MANIFEST, KitEntry, KitManifest, WheelTarget


def test_manylinux_platforms_expand_to_older_glibc_and_legacy_aliases() -> None:
    plats = WheelTarget("3.12", "manylinux_2_28_x86_64").platforms()
    assert plats[0] == "manylinux_2_28_x86_64" and plats[-1] == "manylinux1_x86_64"
    assert "manylinux_2_17_x86_64" in plats and "manylinux2014_x86_64" in plats and "manylinux_2_5_x86_64" in plats
    assert "manylinux_2_29_x86_64" not in plats
    aarch = WheelTarget("3.11", "manylinux_2_17_aarch64").platforms()
    assert "manylinux2014_aarch64" in aarch and "manylinux2010_aarch64" in aarch and all("aarch64" in p for p in aarch)
    assert WheelTarget("3.12", "win_amd64").platforms() == ["win_amd64"]


def test_pip_args_name_python_abi_and_every_platform() -> None:
    args = WheelTarget("3.13", "manylinux_2_28_x86_64").pip_args()
    assert args[:2] == ["--only-binary=:all:", "--python-version"] and "3.13" in args and "cp313" in args
    assert args.count("--platform") == len(WheelTarget("3.13", "manylinux_2_28_x86_64").platforms())


def test_manifest_round_trip(tmp_path: Path) -> None:
    m = KitManifest(("flashmla",), WheelTarget("3.12", "manylinux_2_28_x86_64"),
                    (KitEntry("git", "cache/git/a.tar.xz", "ab" * 32, 10, "https://x/a.git@" + "1" * 40),),
                    created="2026-11-23T00:00:00Z", notes=("a note",))
    (tmp_path / MANIFEST).write_text(m.to_json())
    back = KitManifest.read(tmp_path)
    assert back.entries == m.entries and back.target == m.target and back.notes == m.notes and back.size == 10


def test_missing_or_broken_manifest_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not a kforge kit"):
        KitManifest.read(tmp_path)
    (tmp_path / MANIFEST).write_text("{\"files\": [{}]}")
    with pytest.raises(SourceError, match="not a valid kit manifest"):
        KitManifest.read(tmp_path)

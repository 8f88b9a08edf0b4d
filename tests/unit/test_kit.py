"""The kit's pure parts: wheel platform tags for pip, and the manifest's round trip and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge.cli import main
from kforge.config.forge import load_forge
from kforge.errors import SourceError
from kforge.sources import kit
from kforge.sources.kit import MANIFEST, KitEntry, KitManifest, WheelTarget, isolated_build_requires


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


ROOT = Path(__file__).resolve().parents[2]


def test_isolated_builds_bring_their_build_backend_and_non_isolated_ones_do_not() -> None:
    forge = load_forge(ROOT)
    got = isolated_build_requires(list(forge.projects.values()))
    assert got["flash-attn3-standalone"] == ("scikit-build-core>=0.10", "cmake>=3.24", "ninja>=1.10")
    assert "flash-attn" not in got  # no build isolation: its setup.py uses the interpreter's packages


def test_a_standalone_fa3_kit_holds_the_shared_flash_attention_tree_and_the_backends_wheels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`kforge sources kit build --project flash-attn3-standalone`: the flash-attention pin (with its nested cutlass,
    shared with flash-attn3) and, besides kforge's wheels, those of scikit-build-core, cmake and ninja."""
    asked: dict = {}

    def fake_build(out: Path, **kw):  # noqa: ANN003, ANN202
        asked.update(kw)
        return KitManifest(tuple(kw["projects"]), kw["target"], ())

    monkeypatch.setattr(kit, "build", fake_build)
    assert main(["-C", str(ROOT), "sources", "kit", "build", str(tmp_path / "kit"),
                 "--project", "flash-attn3-standalone", "--with", "ninja>=1.10"]) == 0
    forge = load_forge(ROOT)
    assert asked["sources"] == [("flash-attn3-standalone", forge.projects["flash-attn3"].source)]
    assert asked["extra_requirements"] == ["ninja>=1.10", "scikit-build-core>=0.10", "cmake>=3.24"]  # once each
    assert "its isolated build installs scikit-build-core>=0.10" in capsys.readouterr().out
    main(["-C", str(ROOT), "sources", "kit", "build", str(tmp_path / "kit2"), "--project", "flash-attn3",
          "--project", "flash-attn3-standalone"])
    assert [label for label, _ in asked["sources"]] == ["flash-attn3"]  # one tree for both projects

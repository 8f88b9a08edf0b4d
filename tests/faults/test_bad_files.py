"""Corrupted wheels and manifests, and a forge.toml (or patch series) that can't be read: clear errors, no
traceback, nothing published before lost or changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import ROOT, assert_index_consistent, assert_kept, fake_root, publish_a, run_driver
from kforge_wheelfixtures import make_wheel, manifest, snapshot

from kforge.wheels import wheelhouse


def _two(tmp_path: Path) -> tuple[Path, wheelhouse.PublishedWheel, wheelhouse.PublishedWheel]:
    root = tmp_path / "wh"
    a = publish_a(root, tmp_path)
    b = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "b", version="0.2.0"), manifest())
    return root, a, b


def _cli(*args: str, **kw) -> subprocess.CompletedProcess[str]:  # noqa: ANN003
    return run_driver("cli", *args, **kw)


def test_a_corrupted_wheel_is_named_and_left_out_of_the_index(tmp_path: Path) -> None:
    root, a, b = _two(tmp_path)
    data = bytearray(b.wheel.read_bytes())
    data[len(data) // 2] ^= 0x55
    b.wheel.write_bytes(bytes(data))
    before = {k: v for k, v in snapshot(root).items() if not k.startswith("simple/")}
    verify = _cli("wheelhouse", "--wheelhouse", str(root), "verify")
    assert verify.returncode == 11 and "Traceback" not in verify.stderr
    assert f"{b.manifest}: it records sha256 {b.sha256[:12]}... and the wheel hashes to" in verify.stderr
    index = _cli("wheelhouse", "--wheelhouse", str(root), "index")
    assert index.returncode == 11 and "the index lists 1 wheel(s), and 1 problem(s)" in index.stderr
    assert assert_index_consistent(root) == [a.filename]  # pip is never offered the bad bytes
    assert_kept(before, root)


@pytest.mark.parametrize(("damage", "needle"), [
    (b'{"target": "tiny-sm90", "sha2', "is not a kforge manifest"),
    (b"\x00\x01\xff\xfe", "not UTF-8 (byte 2"),
    (b"", "is not a kforge manifest"),
])
def test_a_corrupt_manifest_is_named_with_the_fix(tmp_path: Path, damage: bytes, needle: str) -> None:
    root, a, b = _two(tmp_path)
    b.manifest.write_bytes(damage)
    before = {k: v for k, v in snapshot(root).items() if not k.startswith("simple/")}
    out = _cli("wheelhouse", "--wheelhouse", str(root), "index")
    assert out.returncode == 11, out.stderr
    assert f"{b.manifest}: {needle}" in out.stderr.replace("the manifest ", "") or needle in out.stderr
    assert "kforge build <target> --replace" in out.stderr and "Traceback" not in out.stderr
    listed = _cli("wheelhouse", "--wheelhouse", str(root), "list", "--json")
    assert listed.returncode == 11 and [m["wheel"] for m in json.loads(listed.stdout)] == [a.filename]
    assert assert_index_consistent(root) == [a.filename]
    assert_kept(before, root)


def _broken_forge(tmp_path: Path, data: bytes) -> Path:
    root = fake_root(tmp_path)
    (root / "forge.toml").write_bytes(data)
    return root


GOOD = (ROOT / "forge.toml").read_bytes()


@pytest.mark.parametrize(("data", "needle"), [
    (GOOD[:100] + b"\xe9" + GOOD[100:], "is not UTF-8 text: byte offset 100"),
    (b"\xff\xfe" + GOOD.decode().encode("utf-16-le"), "UTF-16 byte-order mark"),
    (GOOD + b"\n[projects.fmha\n", "is not valid TOML"),
    (GOOD.replace(b"\nbackend = ", b"\nbackedn = ", 1), "backedn is not a known key (did you mean 'backend'?)"),
])
def test_a_bad_forge_toml_is_one_paragraph_everywhere(tmp_path: Path, data: bytes, needle: str) -> None:
    root = _broken_forge(tmp_path, data)
    every = (["targets"], ["plan", "fmha-sm90"], ["build", "fmha-sm90", "--wheelhouse", str(tmp_path / "wh")])
    for argv in every if b"\xe9" in data else every[:1]:  # every entry point once, then one per case (time)
        out = _cli("-C", str(root), *argv, cwd=root)
        assert out.returncode == 2, (argv, out.stderr)
        assert out.stderr.startswith("kforge: config error:") and needle in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "wh").exists()
    if b"\xe9" in data:
        debug = _cli("-C", str(root), "targets", cwd=root, env={"KFORGE_DEBUG": "1"})
        assert debug.returncode == 2 and "Traceback" in debug.stderr  # KFORGE_DEBUG=1 shows it


def test_nox_lists_what_it_can_with_a_broken_forge_toml(tmp_path: Path) -> None:
    root = _broken_forge(tmp_path, GOOD.replace(b"\nbackend = ", b"\nbackedn = ", 1))
    out = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=root, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stdout + out.stderr
    assert "kforge: config error: forge.toml: projects.fmha.backedn is not a known key" in out.stderr
    assert "can't be listed until it is fixed" in out.stderr
    assert "* tests" in out.stdout and "- lint" in out.stdout and "build-fmha" not in out.stdout


def test_an_unreadable_forge_toml(tmp_path: Path) -> None:
    """EACCES/EIO on forge.toml (os-layer injection: as root, permissions don't stop a read)."""
    root = fake_root(tmp_path)
    for err, text in (("EACCES", "Permission denied"), ("EIO", "Input/output error")):
        out = _cli("-C", str(root), "targets", inject=f"{err}:{root / 'forge.toml'}", cwd=root)
        assert out.returncode == 2, out.stderr
        assert f"kforge: config error: cannot read {root / 'forge.toml'}: {text}" in out.stderr
        assert "Traceback" not in out.stderr


def test_a_patch_series_that_is_not_utf8(tmp_path: Path) -> None:
    root = fake_root(tmp_path, copy_patches=True)
    series = root / "patches" / "flash-attn" / "series"
    series.write_bytes(b"# series\n0001-\xff.patch\n")
    out = _cli("-C", str(root), "plan", "flash-attn-sm90", cwd=root)
    assert out.returncode == 2, out.stderr
    assert f"{series} is not UTF-8 text: byte offset 14" in out.stderr and "Traceback" not in out.stderr


def test_publish_keeps_working_next_to_a_corrupt_manifest(tmp_path: Path) -> None:
    """One bad manifest doesn't stop others from publishing (and is still reported)."""
    root, a, b = _two(tmp_path)
    b.manifest.write_text("{")
    c = make_wheel(tmp_path / "c", version="0.3.0")
    out = run_driver("publish", str(root), "tiny", str(c))
    assert out.returncode == 0, out.stderr
    assert assert_index_consistent(root) == sorted([a.filename, c.name])
    assert [p.path for p in wheelhouse.verify(root).problems] == [b.manifest]


def test_invoke_tasks_pass_the_error_and_its_code_through(tmp_path: Path) -> None:
    root = _broken_forge(tmp_path, GOOD[:100] + b"\xe9" + GOOD[100:])
    out = subprocess.run([sys.executable, "-m", "invoke", "externals.status"], cwd=root, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "kforge: config error:" in out.stderr and "byte offset 100" in out.stderr
    assert "Traceback" not in out.stdout + out.stderr

"""Full and read-only disks under the wheelhouse, the work folder and TMPDIR; builds fail in preflight.

Each case checks the exit code, the message, and that nothing published before is lost or changed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from faultkit import Disk, assert_index_consistent, assert_kept, fake_root, publish_a, run_driver
from kforge_wheelfixtures import make_wheel, snapshot

from kforge.wheels import wheelhouse

CUDA_ENV = {"CUDA_HOME": os.environ.get("CUDA_HOME", "/usr/local/cuda-13.0")}


def _broken_wheelhouse(disks, tmp_path: Path, how: str) -> tuple[Disk, dict[str, bytes]]:  # noqa: ANN001
    disk: Disk = disks(tmp_path / "wh")
    publish_a(disk.path, tmp_path)
    before = snapshot(disk.path)
    disk.fill() if how == "full" else disk.readonly()
    return disk, before


def _publish(disk: Disk, tmp_path: Path, **env: str):  # noqa: ANN202
    b = make_wheel(tmp_path / "b", version="0.2.0", pad=256 << 10)
    return run_driver("publish", str(disk.path), "tiny", str(b), inject=disk.inject, env=env)


def test_publish_into_a_full_wheelhouse(disks, tmp_path: Path) -> None:  # noqa: ANN001
    disk, before = _broken_wheelhouse(disks, tmp_path, "full")
    out = _publish(disk, tmp_path)
    print(disk.how, out.stderr.strip())
    assert out.returncode == 11, out.stderr
    assert ("publish error: cannot publish kforge_tiny-0.2.0-py3-none-any.whl" in out.stderr
            or "publish error: cannot lock the wheelhouse" in out.stderr)  # where the os layer said no first
    assert "No space left on device" in out.stderr and "Free space on that disk" in out.stderr and "Traceback" not in out.stderr
    assert_kept(before, disk.path)
    assert snapshot(disk.path).keys() - {"ballast"} == before.keys()  # no temp file, no half wheel
    assert_index_consistent(disk.path)


def test_publish_into_a_read_only_wheelhouse(disks, tmp_path: Path) -> None:  # noqa: ANN001
    disk, before = _broken_wheelhouse(disks, tmp_path, "ro")
    out = _publish(disk, tmp_path)
    print(disk.how, out.stderr.strip())
    assert out.returncode == 11, out.stderr
    assert "Read-only file system" in out.stderr and "read-write" in out.stderr and "Traceback" not in out.stderr
    assert snapshot(disk.path) == before
    verify = run_driver("cli", "wheelhouse", "--wheelhouse", str(disk.path), "verify", inject=disk.inject)
    assert verify.returncode == 0, verify.stderr  # reading a read-only wheelhouse is fine


def _build(root: Path, wheelhouse_dir: Path, inject: str | None, **env: str):  # noqa: ANN202
    t0 = time.monotonic()
    out = run_driver("cli", "-C", str(root), "build", "fmha-sm90", "--wheelhouse", str(wheelhouse_dir),
                     "--no-progress", inject=inject, env={**CUDA_ENV, **env}, cwd=root)
    return out, time.monotonic() - t0


def test_build_into_a_read_only_wheelhouse_fails_in_preflight(disks, tmp_path: Path) -> None:  # noqa: ANN001
    disk, before = _broken_wheelhouse(disks, tmp_path, "ro")
    root = fake_root(tmp_path)
    out, took = _build(root, disk.path, disk.inject)
    print(disk.how, f"{took:.1f} s", out.stderr.strip().splitlines()[-1])
    assert out.returncode == 11, out.stderr
    assert "preflight failed" in out.stderr and "Read-only file system" in out.stderr
    assert "==> [3/" not in out.stderr  # no step after preflight ran: nothing was compiled
    assert "Traceback" not in out.stderr
    assert took < 30  # seconds, not a build (docs/reliability.md has the time on a quiet machine)
    assert snapshot(disk.path) == before
    assert not (root / ".kforge" / "work" / "fmha-sm90").exists()


def test_build_into_a_full_wheelhouse_fails_in_preflight(disks, tmp_path: Path) -> None:  # noqa: ANN001
    disk, before = _broken_wheelhouse(disks, tmp_path, "full")
    out, took = _build(fake_root(tmp_path), disk.path, disk.inject)
    print(disk.how, f"{took:.1f} s", out.stderr.strip().splitlines()[-1])
    assert out.returncode == 11, out.stderr
    assert "preflight failed" in out.stderr and "Traceback" not in out.stderr
    assert "No space left on device" in out.stderr or "not enough free space in the wheelhouse" in out.stderr
    assert_kept(before, disk.path)


def test_build_with_a_read_only_work_folder(disks, tmp_path: Path) -> None:  # noqa: ANN001
    root = fake_root(tmp_path)
    work = disks(root / ".kforge")
    work.readonly()
    wh = tmp_path / "wh"
    publish_a(wh, tmp_path)
    before = snapshot(wh)
    out, _ = _build(root, wh, work.inject)
    print(work.how, out.stderr.strip().splitlines()[-1])
    assert out.returncode == 7, out.stderr
    assert "build error: the work folder" in out.stderr and "Read-only file system" in out.stderr
    assert "Traceback" not in out.stderr
    assert_kept(before, wh)


def test_build_with_a_full_work_folder(disks, tmp_path: Path) -> None:  # noqa: ANN001
    root = fake_root(tmp_path)
    work = disks(root / ".kforge")
    work.fill()
    wh = tmp_path / "wh"
    publish_a(wh, tmp_path)
    before = snapshot(wh)
    out, _ = _build(root, wh, work.inject)
    print(work.how, out.stderr.strip().splitlines()[-1])
    assert out.returncode == 7, out.stderr
    assert "Traceback" not in out.stderr
    assert ("not enough free space for the work folder" in out.stderr
            or "No space left on device" in out.stderr), out.stderr
    assert_kept(before, wh)


def test_build_with_a_full_tmp(disks, tmp_path: Path) -> None:  # noqa: ANN001
    tmp = disks(tmp_path / "tmp")
    tmp.fill()
    wh = tmp_path / "wh"
    publish_a(wh, tmp_path)
    before = snapshot(wh)
    out, _ = _build(fake_root(tmp_path), wh, tmp.inject, TMPDIR=str(tmp.path))
    print(tmp.how, out.stderr.strip().splitlines()[-1])
    assert out.returncode == 7, out.stderr
    assert f"the temp folder {tmp.path}" in out.stderr and "TMPDIR" in out.stderr and "Traceback" not in out.stderr
    assert_kept(before, wh)


def test_publish_does_not_need_tmp(disks, tmp_path: Path) -> None:  # noqa: ANN001
    """A full /tmp does not stop a publish: it writes only beside the wheelhouse's files."""
    tmp = disks(tmp_path / "tmp")
    tmp.fill()
    wh = tmp_path / "wh"
    publish_a(wh, tmp_path)
    before = snapshot(wh)
    b = make_wheel(tmp_path / "b", version="0.2.0")
    out = run_driver("publish", str(wh), "tiny", str(b), inject=tmp.inject, env={"TMPDIR": str(tmp.path)})
    assert out.returncode == 0, out.stderr
    assert_kept(before, wh)
    assert wheelhouse.verify(wh).problems == ()

"""Fault-injection suite helpers: break disks, kill processes, compare wheelhouses before and after.

Full and read-only disks are real where this runs as root and ``mount -t tmpfs`` works (a small tmpfs,
remounted read-only for EROFS). Elsewhere the same cases run with the driver's ``--inject`` fallback,
which makes the os layer of the child process raise ENOSPC/EROFS under the folder; each such test's
output says ``[os-layer injection]``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kforge_wheelfixtures import make_wheel, manifest, snapshot

from kforge.wheels import wheelhouse

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "_driver.py"


def run_driver(*args: str, env: dict[str, str] | None = None, inject: str | None = None, cwd: Path | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(DRIVER), *(["--inject", inject] if inject else []), *args]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=full_env, cwd=cwd or ROOT, timeout=timeout)


def popen_driver(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.Popen([sys.executable, str(DRIVER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env)


def _can_mount() -> bool:
    if os.environ.get("KFORGE_FAULTS_INJECT") == "1":  # force the os-layer fallback (to test it where mounts work)
        return False
    if os.name != "posix" or os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/kforge-mount-probe-{uuid.uuid4().hex[:8]}")
    probe.mkdir()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", str(probe)], check=True)
        return ok
    except OSError:
        return False
    finally:
        probe.rmdir()


REAL_MOUNTS = _can_mount()


@dataclass
class Disk:
    """A folder that is (or will be) full or read-only: a real tmpfs, or the driver's injection."""

    path: Path
    real: bool
    mode: str = "rw"  # "rw" | "full" | "ro"

    @property
    def inject(self) -> str | None:
        if self.real or self.mode == "rw":
            return None
        return f"{'ENOSPC' if self.mode == 'full' else 'EROFS'}:{self.path}"

    @property
    def how(self) -> str:
        return "[real tmpfs]" if self.real else "[os-layer injection]"

    def fill(self) -> None:
        """Take every free byte (ENOSPC from now on)."""
        self.mode = "full"
        if self.real:
            with open(self.path / "ballast", "wb") as fh:
                try:
                    while True:
                        fh.write(b"\0" * 65536)
                        fh.flush()
                except OSError:
                    pass
            os.sync()

    def readonly(self) -> None:
        self.mode = "ro"
        if self.real:
            subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


@pytest.fixture
def disks() -> Iterator[Callable[[Path], Disk]]:
    """``disks(path)``: a 4 MiB folder at ``path`` to break: ``.fill()`` for ENOSPC, ``.readonly()`` for EROFS."""
    mounted: list[Path] = []

    def make(path: Path) -> Disk:
        path.mkdir(parents=True, exist_ok=True)
        if REAL_MOUNTS:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(path)], check=True)
            mounted.append(path)
        return Disk(path, REAL_MOUNTS)

    yield make
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def fake_root(tmp_path: Path, *, copy_patches: bool = False) -> Path:
    """A monorepo root for `kforge build`/`nox -l`: this checkout's forge.toml and noxfile.py, and links to its
    kernels/, patches/ (or a copy), externals/ and src/."""
    root = tmp_path / "root"
    root.mkdir()
    for name in ("forge.toml", "noxfile.py", "tasks.py"):
        (root / name).write_bytes((ROOT / name).read_bytes())
    for name in ("kernels", "patches", "externals", "src"):
        if name == "patches" and copy_patches:
            shutil.copytree(ROOT / name, root / name)
        else:
            (root / name).symlink_to(ROOT / name, target_is_directory=True)
    return root


def publish_a(root: Path, tmp: Path) -> wheelhouse.PublishedWheel:
    """The wheel "published before": kforge_tiny 0.1.0 with a report."""
    report = tmp / "before-report" / "report.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text('{"before": true}')
    return wheelhouse.publish(root, "tiny", make_wheel(tmp / "before", version="0.1.0"), manifest(),
                              attachments=(report,))


def index_pages(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "simple").rglob("index.html"))}


def assert_index_consistent(root: Path) -> list[str]:
    """Every link on every page resolves to a file whose sha256 is the link's; return the linked file names."""
    files = []
    top = (root / "simple" / "index.html").read_text()
    for href in re.findall(r'href="([^"]+)"', top):
        assert (root / "simple" / href / "index.html").is_file(), f"root page links to missing {href}"
    for page in (root / "simple").glob("*/index.html"):
        for href in re.findall(r'href="([^"]+)"', page.read_text()):
            rel, _, frag = href.partition("#sha256=")
            target = (page.parent / rel).resolve()
            assert target.is_file(), f"{page} links to missing {rel}"
            assert hashlib.sha256(target.read_bytes()).hexdigest() == frag, f"{page}: {rel} does not match its hash"
            files.append(target.name)
    return sorted(files)


def assert_kept(before: dict[str, bytes], root: Path) -> None:
    """Nothing published before is lost or changed (the index pages may have been rewritten)."""
    after = snapshot(root)
    for rel, data in before.items():
        if rel.startswith("simple/"):
            continue
        assert rel in after, f"{rel} was lost"
        assert after[rel] == data, f"{rel} was changed"

"""Shared file helpers (the bottom layer: imports nothing from kforge): atomic writes, hashing, modes.

Every module that writes a file other processes may read (reports, profiles, manifests, index pages,
workflows) writes it through :func:`atomic_write_text` / :func:`atomic_write_bytes`: readers see the
old file or the new one, never a torn one. Published files are world-readable whatever the umask
(:data:`PUBLIC_FILE_MODE`), so a web server running as another user can serve them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

PUBLIC_FILE_MODE = 0o644
PUBLIC_DIR_MODE = 0o755
_BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = PUBLIC_FILE_MODE, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    ``mode`` is applied before the rename (``None`` keeps mkstemp's 0600). ``fsync`` flushes the data
    to disk before the rename, for files that must survive a power cut (published wheels, manifests).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str, *, mode: int | None = PUBLIC_FILE_MODE, fsync: bool = False) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode, fsync=fsync)


def work_root(root: Path) -> Path:
    """The monorepo's scratch space, ``<root>/.kforge/work`` (build trees, locks, reports)."""
    return Path(root) / ".kforge" / "work"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """kforge's cache (toolkits, sdists, job profiles): ``$KFORGE_CACHE``, else ``$XDG_CACHE_HOME/kforge``,
    else ``~/.cache/kforge`` (``environ`` defaults to the process's environment)."""
    environ = os.environ if environ is None else environ
    if environ.get("KFORGE_CACHE"):
        return Path(environ["KFORGE_CACHE"]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kforge"


def prepend_path(first: str | Path, rest: str | None) -> str:
    """``first`` in front of a ``PATH``-like list (``os.pathsep``-separated; an empty ``rest`` adds no separator).
    The one way kforge puts a folder first on ``PATH``, ``GIT_CEILING_DIRECTORIES`` and their kind."""
    return os.pathsep.join([str(first), rest]) if rest else str(first)


def write_executable(path: Path, text: str) -> Path:
    """An executable script (a shim in front of nvcc, c++ or ninja), written atomically with mode 0755."""
    return atomic_write_text(path, text, mode=0o755)

"""Child process for the fault suite: the kforge CLI, or one wheelhouse publish, with the CLI's error handling.

    python _driver.py [--inject ERRNO_NAME:PREFIX] cli ARGS...
    python _driver.py [--inject ERRNO_NAME:PREFIX] publish ROOT PROJECT WHEEL [--replace]

``--inject`` is the fallback where no small tmpfs can be mounted (not root): every write-side file
operation under PREFIX (open for writing, mkstemp, mkdir, rename, unlink) fails with that errno (EACCES
and EIO: reads too), and
``shutil.disk_usage`` there reports no free space for ENOSPC. It acts at the os layer of this process,
not at a real file system; the suite says which of the two a run used.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parent / "fixtures"))

from kforge.errors import KforgeError, as_error  # noqa: E402
from kforge.wheels import wheelhouse  # noqa: E402


def _inject(spec: str) -> None:
    name, _, prefix = spec.partition(":")
    code = getattr(errno, name)
    root = os.path.realpath(prefix)

    def under(path: object) -> bool:
        try:
            p = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        except TypeError:
            return False
        return p == root or p.startswith(root + os.sep)

    def fail(path: object) -> None:
        raise OSError(code, os.strerror(code), os.fsdecode(path))  # type: ignore[arg-type]

    reads_too = name in ("EACCES", "EIO")  # an unreadable file, not only an unwritable one
    real_open, real_os_open, real_mkstemp = builtins.open, os.open, tempfile.mkstemp
    real_mkdir, real_replace, real_rename, real_unlink, real_usage = (os.mkdir, os.replace, os.rename, os.unlink,
                                                                      shutil.disk_usage)

    def open_(file, mode="r", *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        writes = any(c in mode for c in "wax+")
        if isinstance(file, (str, bytes, os.PathLike)) and (writes or reads_too) and under(file):
            fail(file)
        return real_open(file, mode, *a, **k)

    def os_open(path, flags, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if (reads_too or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)) and under(path):
            fail(path)
        return real_os_open(path, flags, *a, **k)

    def mkstemp(*a, dir=None, **k):  # noqa: ANN001, ANN002, ANN003, ANN202, A002
        if under(dir or tempfile.gettempdir()):
            fail(dir or tempfile.gettempdir())
        return real_mkstemp(*a, dir=dir, **k)

    def guard(real):  # noqa: ANN001, ANN202
        def wrapped(path, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
            if under(path) or (a and under(a[0])):
                fail(path)
            return real(path, *a, **k)
        return wrapped

    def usage(path):  # noqa: ANN001, ANN202
        got = real_usage(path)
        return got._replace(free=0) if code == errno.ENOSPC and under(path) else got

    builtins.open = io.open = open_  # pathlib opens through io.open
    os.open = os_open
    tempfile.mkstemp = mkstemp
    os.mkdir, os.replace, os.rename, os.unlink = guard(real_mkdir), guard(real_replace), guard(real_rename), \
        guard(real_unlink)
    shutil.disk_usage = usage


def _publish(root: str, project: str, wheel: str, *flags: str) -> int:
    from kforge_wheelfixtures import manifest

    try:
        pub = wheelhouse.publish(Path(root), project, Path(wheel), manifest(f"{project}-sm90", project),
                                 replace="--replace" in flags, wait="--no-wait" not in flags)
    except KforgeError as exc:  # as kforge.cli reports it (not imported: publishers start faster without it)
        print(f"kforge: {exc.kind} error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"kforge: error: {as_error(exc).render()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return 130
    print(pub.wheel)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inject"]:
        _inject(argv[1])
        argv = argv[2:]
    if argv[0] == "cli":
        from kforge import cli

        return cli.main(argv[1:])
    if argv[0] == "publish":
        return _publish(*argv[1:])
    raise SystemExit(f"unknown driver verb {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

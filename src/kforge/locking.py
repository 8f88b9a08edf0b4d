"""Visible file locks: who holds a lock (pid, target, since when), and a waiter that keeps saying it waits.

A lock is a ``filelock.FileLock`` (``flock``; it dies with its process, so a killed build never leaves a
lock behind) plus an owner note beside it (``<lock>.owner``, JSON) that the holder writes after it got the
lock and removes before it lets go. A second build of the same target, or a publisher that finds the
wheelhouse busy, prints the owner and then a line every ``report_every`` seconds until it gets the lock;
``wait=False`` (``--no-wait``) fails at once with the owner in the message.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout

from kforge.errors import KforgeError, os_fix
from kforge.fsutil import atomic_write_text

OWNER_SUFFIX = ".owner"
#: How often a waiting process says it is still waiting (seconds; ``KFORGE_LOCK_REPORT_EVERY`` overrides).
REPORT_EVERY = 30.0
REPORT_ENV = "KFORGE_LOCK_REPORT_EVERY"
_POLL = 0.2


@dataclass(frozen=True)
class Owner:
    """Who holds a lock, from its owner note."""

    pid: int
    target: str
    since: str  # ISO 8601 UTC
    host: str = ""

    def describe(self) -> str:
        where = f" on {self.host}" if self.host and self.host != socket.gethostname() else ""
        return f"pid {self.pid}{where} ({self.target}) since {self.since}"


def read_owner(lock_path: Path) -> Owner | None:
    """The owner note of ``lock_path``, or None (no note, or one that can't be read)."""
    try:
        data = json.loads(Path(str(lock_path) + OWNER_SUFFIX).read_text(encoding="utf-8"))
        return Owner(int(data["pid"]), str(data["target"]), str(data["since"]), str(data.get("host", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _say(text: str) -> None:
    print(f"kforge: {text}", file=sys.stderr, flush=True)


@contextmanager
def hold(
    lock_path: Path,
    *,
    target: str,
    what: str,
    error: type[KforgeError],
    wait: bool = True,
    timeout: float | None = None,
    report_every: float | None = None,
    say: Callable[[str], None] = _say,
) -> Iterator[Owner]:
    """Hold the lock at ``lock_path`` for ``target`` (``what`` names it in messages: "the wheelhouse ...").

    Without ``wait`` a busy lock raises ``error`` at once; with a ``timeout`` (seconds) it raises after
    that long. While waiting, ``say`` hears who holds it, then a line every ``report_every`` seconds.
    """
    lock_path = Path(lock_path)
    if report_every is None:
        try:
            report_every = float(os.environ.get(REPORT_ENV, "") or REPORT_EVERY)
        except ValueError:
            report_every = REPORT_EVERY
    lock = FileLock(str(lock_path))
    started = time.monotonic()
    announced = False
    last = started
    while True:
        try:
            lock.acquire(timeout=0 if not wait else _POLL)
            break
        except Timeout:
            owner = read_owner(lock_path)
            holder = owner.describe() if owner else "another kforge process"
            waited = time.monotonic() - started
            if not wait:
                raise error(f"{what} is locked by {holder}", why=f"{lock_path} is held",
                            fix="wait for that build to finish (or leave out --no-wait to queue behind it)") from None
            if timeout is not None and waited >= timeout:
                raise error(f"{what} stayed locked for {waited:.0f} s by {holder}", why=f"{lock_path} is held",
                            fix="wait for that build to finish; a lock dies with its process, so one that is held "
                                "belongs to a running process") from None
            now = time.monotonic()
            if not announced:
                say(f"waiting for {what}: locked by {holder}")
                announced, last = True, now
            elif now - last >= report_every:
                say(f"still waiting for {what} ({waited:.0f} s): locked by {holder}")
                last = now
        except OSError as exc:
            raise error(f"cannot lock {what}: {exc.strerror}", why=f"creating {lock_path} failed",
                        fix=os_fix(exc.errno)) from None
    me = Owner(os.getpid(), target, datetime.now(timezone.utc).isoformat(timespec="seconds"), socket.gethostname())
    note = Path(str(lock_path) + OWNER_SUFFIX)
    try:
        try:
            atomic_write_text(note, json.dumps(me.__dict__) + "\n")
        except OSError:
            pass  # the note is a courtesy to waiters; the lock itself is held
        if announced:
            say(f"got {what} after {time.monotonic() - started:.0f} s")
        yield me
    finally:
        try:
            note.unlink()
        except OSError:
            pass
        lock.release()

"""kforge.locking: the owner note, waiting that says so, --no-wait, locks that die with their process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge import locking
from kforge.errors import BuildError, PublishError

HOLDER = """
import sys, time
from pathlib import Path
from kforge import locking
from kforge.errors import BuildError
with locking.hold(Path(sys.argv[1]), target="fmha-sm90", what="the work folder", error=BuildError):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(lock: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_owner_note_is_written_while_held_and_removed_after(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with locking.hold(lock, target="t1", what="x", error=BuildError) as me:
        owner = locking.read_owner(lock)
        assert owner == me and owner.target == "t1" and owner.pid > 0 and "T" in owner.since
    assert locking.read_owner(lock) is None


def test_no_wait_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / "w.lock"
    proc = _holder(lock, 30)
    try:
        t0 = time.monotonic()
        with pytest.raises(BuildError, match=rf"locked by pid {proc.pid} \(fmha-sm90\) since 20") as info:
            with locking.hold(lock, target="me", what="the work folder", error=BuildError, wait=False):
                pass
        assert time.monotonic() - t0 < 2
        assert "--no-wait" in (info.value.fix or "")
    finally:
        proc.kill()
        proc.wait()


def test_waiting_is_announced_and_repeated_then_acquired(tmp_path: Path) -> None:
    lock = tmp_path / "w.lock"
    proc = _holder(lock, 1.5)
    heard: list[str] = []
    try:
        with locking.hold(lock, target="me", what="the wheelhouse", error=PublishError, report_every=0.4,
                          say=heard.append):
            assert locking.read_owner(lock).target == "me"
    finally:
        proc.wait()
    assert heard[0].startswith(f"waiting for the wheelhouse: locked by pid {proc.pid} (fmha-sm90)")
    assert any(h.startswith("still waiting for the wheelhouse") for h in heard[1:-1])
    assert heard[-1].startswith("got the wheelhouse after")


def test_timeout_raises_the_given_error(tmp_path: Path) -> None:
    lock = tmp_path / "t.lock"
    proc = _holder(lock, 30)
    try:
        with pytest.raises(PublishError, match="stayed locked"):
            with locking.hold(lock, target="me", what="the wheelhouse", error=PublishError, timeout=0.5,
                              say=lambda _: None):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_leaves_no_lock(tmp_path: Path) -> None:
    lock = tmp_path / "k.lock"
    proc = _holder(lock, 60)
    proc.kill()
    proc.wait()
    assert locking.read_owner(lock) is not None  # its note stays behind ...
    with locking.hold(lock, target="next", what="x", error=BuildError, wait=False) as me:  # ... the lock does not
        assert locking.read_owner(lock) == me


def test_unwritable_folder_is_the_given_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(PublishError, match="cannot lock the wheelhouse"):
        with locking.hold(tmp_path / "a-file" / "x.lock", target="t", what="the wheelhouse",
                          error=PublishError):
            pass

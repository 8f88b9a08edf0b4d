"""kill -9 and SIGINT at every step of a publish, random kills during an index rewrite, concurrent publishes.

Each case checks the exit code, the message, that the index is always consistent (every page the old or
the new one, every link resolving to a file with the link's sha256), and that nothing published before
is lost or changed; then that `kforge wheelhouse index` recovers to a wheelhouse `verify` accepts.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from faultkit import (
    assert_index_consistent,
    assert_kept,
    index_pages,
    popen_driver,
    publish_a,
    run_driver,
)
from kforge_wheelfixtures import make_wheel, manifest, snapshot

from kforge import locking
from kforge.errors import PublishError
from kforge.wheels import wheelhouse

B_NAME = "kforge_tiny-0.2.0-py3-none-any.whl"
#: where the wheel of the interrupted publish is complete (and listed after recovery)
AFTER_COMMIT = ("wheel-renamed", "index-page", "index-root", "index-pruned")


def _setup(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
    """A wheelhouse with wheel A; wheel B to publish; (root, B, snapshot, old pages, new pages)."""
    root = tmp_path / "wh"
    publish_a(root, tmp_path)
    b = make_wheel(tmp_path / "b", version="0.2.0", body="X = 2\n")
    twin = tmp_path / "twin"
    shutil.copytree(root, twin)
    wheelhouse.publish(twin, "tiny", b, manifest())
    return root, b, snapshot(root), index_pages(root), index_pages(twin)


def _assert_old_or_new(root: Path, old: dict[str, bytes], new: dict[str, bytes]) -> None:
    now = index_pages(root)
    assert "simple/index.html" in now
    for rel, data in now.items():
        assert data in (old.get(rel), new.get(rel)), f"{rel} is neither the old nor the new page (torn?)"


def _recover_and_verify(root: Path, b_listed: bool) -> None:
    """What `kforge wheelhouse index` then `verify` do (in-process: the CLI runs them in other cases)."""
    assert wheelhouse.rebuild_index(root).problems == ()
    assert wheelhouse.verify(root).problems == ()
    names = [w.filename for w in wheelhouse.list_wheels(root)]
    assert (B_NAME in names) == b_listed, names
    assert not list(root.rglob(f"{wheelhouse.TMP_MARK}*"))


@pytest.mark.parametrize("point", wheelhouse.FAULT_POINTS)
def test_kill9_at_every_publish_step(tmp_path: Path, point: str) -> None:
    root, b, before, old, new = _setup(tmp_path)
    out = run_driver("publish", str(root), "tiny", str(b), env={wheelhouse.FAULT_ENV: point})
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert "Traceback" not in out.stderr
    _assert_old_or_new(root, old, new)
    assert_index_consistent(root)
    assert_kept(before, root)
    _recover_and_verify(root, b_listed=point in AFTER_COMMIT)
    assert_kept(before, root)


@pytest.mark.parametrize("point", wheelhouse.FAULT_POINTS)
def test_sigint_at_every_publish_step(tmp_path: Path, point: str) -> None:
    root, b, before, old, new = _setup(tmp_path)
    out = run_driver("publish", str(root), "tiny", str(b), env={wheelhouse.FAULT_ENV: f"{point}:SIGINT"})
    assert out.returncode == 130, out.stdout + out.stderr
    assert "kforge: interrupted" in out.stderr and "Traceback" not in out.stderr
    assert not list(root.rglob(f"{wheelhouse.TMP_MARK}*")), "an interrupted publish left its temp files"
    _assert_old_or_new(root, old, new)
    assert_index_consistent(root)
    assert_kept(before, root)
    _recover_and_verify(root, b_listed=point in AFTER_COMMIT)


def _many(tmp_path: Path, n: int) -> tuple[Path, dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
    """n distributions in the wheelhouse; the on-disk index lists only every other one (the "old" index)."""
    root = tmp_path / "wh"
    folder = root / "many"
    for i in range(n):  # written the way publish leaves them, without n index rewrites
        wheel = make_wheel(folder, name=f"dist_{i:03d}")
        record = replace(manifest(), sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), size=wheel.stat().st_size,
                         wheel=wheel.name, project="many")
        Path(f"{wheel}{wheelhouse.MANIFEST_SUFFIX}").write_text(record.to_json())
    wheelhouse.rebuild_index(root)
    new = index_pages(root)
    half = tuple(w for w in wheelhouse.list_wheels(root) if int(w.filename[5:8]) % 2 == 0)
    _write_pages(root, {rel: text.encode() for rel, text in wheelhouse.render_index(half).items()})
    return root, snapshot(root), index_pages(root), new


def _write_pages(root: Path, pages: dict[str, bytes]) -> None:
    shutil.rmtree(root / "simple")
    for rel, data in pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_kill9_after_every_page_of_an_index_rewrite(tmp_path: Path) -> None:
    n = 6
    root, before, old, new = _many(tmp_path, n)
    for k in range(1, n // 2 + 1):  # the pages the rewrite adds (the other half exist already)
        _write_pages(root, old)
        out = run_driver("cli", "wheelhouse", "--wheelhouse", str(root), "index",
                         env={wheelhouse.FAULT_ENV: f"index-page@{k}"})
        assert out.returncode == -signal.SIGKILL, out.stderr
        _assert_old_or_new(root, old, new)
        assert_index_consistent(root)
        assert_kept(before, root)


def _run_until_first_page(root: Path, first: Path) -> tuple[subprocess.Popen[str], float]:
    """Start `kforge wheelhouse index`; return it once the rewrite's first new page exists (and when that was)."""
    proc = popen_driver("cli", "wheelhouse", "--wheelhouse", str(root), "index")
    while not first.exists() and proc.poll() is None:
        time.sleep(0.0005)
    return proc, time.monotonic()


def test_random_kills_during_index_rewrites(tmp_path: Path) -> None:
    """kill -9 at random moments inside `kforge wheelhouse index`'s rewrite: the index is never torn."""
    root, before, old, new = _many(tmp_path, 120)
    first = root / sorted(set(new) - set(old))[0]
    proc, started = _run_until_first_page(root, first)
    proc.communicate(timeout=60)
    window = time.monotonic() - started  # from the first new page to the end of the process
    assert proc.returncode == 0 and index_pages(root) == new
    rng = random.Random(20261123)
    outcomes = {"old": 0, "mixed": 0, "new": 0}
    for _ in range(8):
        _write_pages(root, old)
        proc, _ = _run_until_first_page(root, first)
        time.sleep(rng.uniform(0, 0.6 * window))  # the window ends with the process exit, after the rewrite
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        _assert_old_or_new(root, old, new)
        assert_index_consistent(root)
        assert_kept(before, root)
        now = index_pages(root)
        outcomes["new" if now == new else "old" if now == old else "mixed"] += 1
    print(f"random kills inside a {window:.3f} s rewrite: {outcomes}")  # where the kills landed (pytest -s)


@pytest.mark.parametrize("n", [2, 4])
def test_concurrent_publishes_into_one_wheelhouse(tmp_path: Path, n: int) -> None:
    root = tmp_path / "wh"
    publish_a(root, tmp_path)
    before = snapshot(root)
    wheels = [make_wheel(tmp_path / f"c{i}", version=f"1.{i}.0") for i in range(n)]
    env = {wheelhouse.PAUSE_ENV: "0.2"}
    # Hold the wheelhouse as a running build would, so that every publisher meets a busy lock and says so.
    with locking.hold(root / wheelhouse.LOCK_NAME, target="fmha-sm90", what="the wheelhouse", error=PublishError):
        procs = [popen_driver("publish", str(root), "tiny", str(w), env=env) for w in wheels]
        heard = [p.stderr.readline() for p in procs]  # type: ignore[union-attr]
    for line in heard:
        assert line.startswith(f"kforge: waiting for the wheelhouse {root}: locked by pid ") and "(fmha-sm90)" in line
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, results
    assert assert_index_consistent(root) == sorted(["kforge_tiny-0.1.0-py3-none-any.whl", *(w.name for w in wheels)])
    assert_kept(before, root)
    assert run_driver("cli", "wheelhouse", "--wheelhouse", str(root), "verify").returncode == 0


def test_concurrent_publishes_of_one_name_with_other_bytes(tmp_path: Path) -> None:
    """Two builds race to publish one file name with different contents: one wins, the other is refused (11)."""
    root = tmp_path / "wh"
    publish_a(root, tmp_path)
    one = make_wheel(tmp_path / "one", version="3.0.0", body="A = 1\n")
    two = make_wheel(tmp_path / "two", version="3.0.0", body="A = 2\n")
    env = {wheelhouse.PAUSE_ENV: "0.3"}
    procs = [popen_driver("publish", str(root), "tiny", str(w), env=env) for w in (one, two)]
    results = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 11], results
    loser_err = next(err for p, (_, err) in zip(procs, results, strict=True) if p.returncode == 11)
    assert "already published with a different sha256" in loser_err and "--replace" in loser_err
    winner = one if procs[0].returncode == 0 else two
    assert (root / "tiny" / one.name).read_bytes() == winner.read_bytes()
    assert_index_consistent(root)

import hashlib
import os
import stat

import pytest

from kforge.fsutil import atomic_write_bytes, atomic_write_text, sha256_file, work_root


def test_sha256_file_matches_hashlib(tmp_path):
    p = tmp_path / "f.bin"
    data = os.urandom(3 * (1 << 20) + 17)  # spans several read blocks
    p.write_bytes(data)
    assert sha256_file(p) == hashlib.sha256(data).hexdigest()


def test_atomic_write_is_world_readable_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        p = atomic_write_text(tmp_path / "sub" / "a.txt", "hello\n")
    finally:
        os.umask(old)
    assert p.read_text() == "hello\n"
    assert stat.S_IMODE(p.stat().st_mode) == 0o644


def test_atomic_write_leaves_no_temp_file_when_the_write_fails(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")

    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_work_root(tmp_path):
    assert work_root(tmp_path) == tmp_path / ".kforge" / "work"

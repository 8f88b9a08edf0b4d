"""kforge.sources.carry: a git format-patch that creates files of ours in an upstream tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kforge.errors import PatchError
from kforge.sources.carry import CarriedFile, git_blob_id, render_new_files_patch
from kforge.sources.series import parse_patch

FILES = [
    CarriedFile("csrc/new/a.h", b"#pragma once\nint a();\n"),
    CarriedFile("csrc/new/one.cu", b"// one line\n"),
    CarriedFile("csrc/new/tail.txt", b"no newline at the end"),
]


def test_blob_id_is_gits() -> None:
    assert git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def test_the_patch_creates_each_file_with_its_lines(tmp_path: Path) -> None:
    text = render_new_files_patch(FILES, "carry: three files", "Why they are here.")
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [PATCH] carry: three files\n" in text and "\nWhy they are here.\n---\n" in text
    assert render_new_files_patch(FILES, "carry: three files", "Why they are here.") == text  # deterministic
    assert "@@ -0,0 +1,2 @@" in text and "@@ -0,0 +1 @@" in text and "\\ No newline at end of file" in text
    assert f"index 0000000..{git_blob_id(FILES[0].data)[:7]}" in text
    assert "MIME-Version" not in text  # ASCII only
    path = tmp_path / "0001.patch"
    path.write_text(text)
    parsed = parse_patch(path)
    assert [f.path for f in parsed.files] == [f.path for f in FILES]
    assert all(f.old_path is None for f in parsed.files)
    assert [list(f.hunks[0].new) for f in parsed.files] == [["#pragma once", "int a();"], ["// one line"],
                                                            ["no newline at the end"]]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_apply_and_am_take_it(tmp_path: Path) -> None:
    patch = tmp_path / "0001.patch"
    patch.write_text(render_new_files_patch([*FILES, CarriedFile("docs/ü.md", "naïve\n".encode())], "carry: files"))
    assert "Content-Type: text/plain; charset=UTF-8" in patch.read_text()
    repo = tmp_path / "repo"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README").write_text("upstream\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    subprocess.run([*git, "am", "-q", str(patch)], check=True)
    for f in FILES:
        assert (repo / f.path).read_bytes() == f.data
    assert (repo / "docs/ü.md").read_text() == "naïve\n"
    blob = subprocess.run([*git, "rev-parse", "HEAD:csrc/new/a.h"], check=True, capture_output=True, text=True).stdout
    assert blob.strip() == git_blob_id(FILES[0].data)


@pytest.mark.parametrize(
    "files, message",
    [
        ([], "at least one file"),
        ([FILES[0], FILES[0]], "csrc/new/a.h twice"),
        ([CarriedFile("../x.h", b"x\n")], "not a relative path"),
        ([CarriedFile("x.bin", b"\xff\x00")], "not UTF-8"),
        ([CarriedFile("x.h", b"a\r\nb\r\n")], "carriage returns"),
    ],
)
def test_bad_inputs_are_refused(files: list[CarriedFile], message: str) -> None:
    with pytest.raises(PatchError, match=message):
        render_new_files_patch(files, "s")

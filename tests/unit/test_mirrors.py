"""Mirror lookup: URL parsing, the directory layouts searched, the cascade, and the git options."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kforge.sources.mirrors import ENV, Mirrors, git_config_args, url_owner_name


@pytest.mark.parametrize(("url", "expected"), [
    ("https://github.com/NVIDIA/cutlass.git", ("NVIDIA", "cutlass")),
    ("https://github.com/NVIDIA/cutlass", ("NVIDIA", "cutlass")),
    ("https://github.com/ROCm/composable_kernel.git/", ("ROCm", "composable_kernel")),
    ("git@github.com:gabime/spdlog.git", ("gabime", "spdlog")),
    ("ssh://git@github.com:22/ai-dynamo/nixl.git", ("ai-dynamo", "nixl")),
    ("file:///srv/git/acme/tiny", ("acme", "tiny")),
    ("/work/.mirror/NVIDIA+cutlass/repo", ("NVIDIA", "cutlass")),
])
def test_url_owner_name(url: str, expected: tuple[str, str]) -> None:
    assert url_owner_name(url) == expected


def _bare(path: Path) -> Path:
    (path / "objects").mkdir(parents=True)
    (path / "refs").mkdir()
    (path / "HEAD").write_text("ref: refs/heads/main\n")
    return path


def test_each_layout_is_found_and_the_first_directory_wins(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    fetched = _bare(a / "NVIDIA+cutlass" / "repo")
    plus_git = _bare(a / "gabime+spdlog.git")
    nested = _bare(b / "ai-dynamo" / "nixl.git")
    by_name = _bare(b / "tiny.git")
    shadowed = _bare(b / "NVIDIA+cutlass.git")
    m = Mirrors((a, b))
    assert m.find("https://github.com/NVIDIA/cutlass.git") == fetched
    assert m.find("https://github.com/gabime/spdlog") == plus_git
    assert m.find("https://github.com/ai-dynamo/nixl.git") == nested
    assert m.find("https://example.invalid/acme/tiny.git") == by_name
    assert Mirrors((b,)).find("https://github.com/NVIDIA/cutlass.git") == shadowed
    assert m.find("https://github.com/NVIDIA/cccl.git") is None
    (a / "empty+dir").mkdir()  # not a git directory: ignored
    assert m.find("https://github.com/empty/dir.git") is None


def test_cascade_flags_then_env_without_duplicates(tmp_path: Path) -> None:
    env = {ENV: os.pathsep.join([str(tmp_path / "env1"), str(tmp_path / "flag"), ""])}
    m = Mirrors.from_cascade([str(tmp_path / "flag")], env)
    assert m.dirs == ((tmp_path / "flag").resolve(), (tmp_path / "env1").resolve())
    assert not Mirrors.from_cascade([], {})
    assert Mirrors.from_cascade([], {}).describe() == "none"


def test_git_config_args_redirect_and_allow_file_only_when_needed(tmp_path: Path) -> None:
    assert git_config_args([]) == []
    args = git_config_args([("https://github.com/NVIDIA/cutlass.git", tmp_path / "m")])
    assert args == ["-c", f"url.{(tmp_path / 'm').resolve().as_uri()}.insteadOf=https://github.com/NVIDIA/cutlass.git",
                    "-c", "protocol.file.allow=always"]

"""forge.toml's git pins agree with the gitlinks the monorepo records and with .gitmodules."""

from __future__ import annotations

import configparser
import subprocess
from pathlib import Path

import pytest

from kforge.config.forge import load_forge
from kforge.sources.upstream import gitlink

REPO = Path(__file__).resolve().parents[2]


def _git_sources():
    forge = load_forge(REPO)
    seen = {}
    for project in forge.projects.values():
        if project.git is not None:
            seen.setdefault(project.git.path, []).append((project.name, project.git))
    return seen


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the kforge git checkout (gitlinks live in its index)")
def test_forge_toml_pins_match_gitlinks_and_gitmodules() -> None:
    modules = configparser.ConfigParser()
    modules.read_string((REPO / ".gitmodules").read_text())
    urls = {modules[s]["path"]: modules[s]["url"] for s in modules.sections()}
    listed = subprocess.run(["git", "ls-files", "-s", "externals"], cwd=REPO, capture_output=True, text=True).stdout
    gitlinks = {line.split("\t")[1]: line.split()[1] for line in listed.splitlines() if line.startswith("160000")}
    sources = _git_sources()
    assert sources, "forge.toml declares no git sources"
    assert set(sources) == set(gitlinks), "each submodule under externals/ is used by a project, and vice versa"
    for path, users in sources.items():
        for name, spec in users:
            assert spec.commit == gitlinks[path] == gitlink(REPO, path), f"{name}: forge.toml pin != gitlink of {path}"
            assert spec.url == urls[path], f"{name}: forge.toml url != .gitmodules url of {path}"

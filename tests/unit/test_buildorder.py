"""kforge.build.order: when the ninja shim is installed, what it points at, and the summary of what it did."""

from __future__ import annotations

import json
from pathlib import Path

from kforge.build import order as buildorder


def _fake_ninja(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    ninja = folder / "ninja"
    ninja.write_text("#!/bin/sh\nexit 0\n")
    ninja.chmod(0o755)
    return ninja


def test_nothing_measured_installs_nothing(tmp_path: Path) -> None:
    _fake_ninja(tmp_path / "real")
    assert buildorder.install([], dest=tmp_path / "o", env={"PATH": str(tmp_path / "real")}) is None
    assert not (tmp_path / "o").exists()


def test_no_ninja_on_path_installs_nothing(tmp_path: Path) -> None:
    assert buildorder.install([("a.o", 1.0)], dest=tmp_path / "o", env={"PATH": str(tmp_path / "empty")}) is None


def test_shim_goes_first_and_skips_an_earlier_shim(tmp_path: Path) -> None:
    real = _fake_ninja(tmp_path / "real")
    dest = tmp_path / "o"
    _fake_ninja(dest / "bin")  # a shim left by an earlier build, already on PATH
    path = f"{dest / 'bin'}:{tmp_path / 'real'}"
    setup = buildorder.install([("a.o", 3.0), ("b.o", 1.0)], dest=dest, env={"PATH": path})
    assert setup is not None and setup.ninja == str(real) and setup.units == 2
    assert setup.env["PATH"].split(":")[0] == str(dest / "bin")
    config = json.loads((dest / "ninja-order.json").read_text())
    assert config["ninja"] == str(real) and config["seconds"] == {"a.o": 3.0, "b.o": 1.0}
    assert "kforge/build/ninjaorder.py" in setup.shim.read_text()


def test_summarize(tmp_path: Path) -> None:
    log = tmp_path / "order.jsonl"
    log.write_text(json.dumps({"file": "/b/build.ninja", "measured": 70, "moved": 60}) + "\nnot json\n"
                   + json.dumps({"file": "/c/build.ninja", "error": "bad"}) + "\n"
                   + json.dumps({"file": "/try/build.ninja", "measured": 0, "moved": 0}) + "\n")
    assert buildorder.summarize(log) == ["ninja order: 70 edges with a measured time, 60 statements moved (longest first) in /b/build.ninja",
                                         "ninja order: kept upstream's order of /c/build.ninja: bad"]
    assert buildorder.summarize(tmp_path / "missing") == []

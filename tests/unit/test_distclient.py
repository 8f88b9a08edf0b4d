"""kforge.build.distclient: the client config that lets the host-compiler shims travel to sccache-dist servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kforge.build import distclient
from kforge.errors import ToolchainError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_toml_dumps_round_trips_an_sccache_config() -> None:
    conf = {"cache": {"disk": {"dir": "/c \"q\"", "size": 10_000_000_000}},
            "dist": {"scheduler_url": "http://10.0.0.1:10600", "rewrite_includes_only": False,
                     "auth": {"type": "token", "token": "x"},
                     "toolchains": [{"type": "no_dist", "compiler_executable": "/usr/bin/clang"},
                                    {"type": "path_override", "compiler_executable": "/a/gcc", "archive": "/t.tgz",
                                     "archive_compiler_executable": "/usr/bin/gcc"}]},
            "weird key": [1, 2], "inline": [{"a": 1}, 2]}
    assert tomllib.loads(distclient.toml_dumps(conf)) == conf


def _runner(calls: list[list[str]]):
    def run(cmd, **kw):
        calls.append(cmd)
        Path(cmd[-1]).write_bytes(b"archive")
        return subprocess.CompletedProcess(cmd, 0, "", "")
    return run


def test_prepare_overrides_every_shim_with_a_packed_real_compiler(tmp_path: Path) -> None:
    conf = tmp_path / "client.conf"
    conf.write_text('[dist]\nscheduler_url = "http://127.0.0.1:1"\ntoolchains = []\n[dist.auth]\ntype = "token"\n'
                    'token = "t"\n[cache.disk]\nsize = 5\n')
    bindir, wrappers, shims = tmp_path / "bin", tmp_path / "wrappers", tmp_path / "hostcc"
    for d in (bindir, wrappers, shims):
        d.mkdir()
    for name in ("gcc", "c++"):
        for d in (bindir, wrappers):  # kforge's cc wrappers come first on PATH; they must not be packed
            (d / name).write_text("#!/bin/sh\n")
            (d / name).chmod(0o755)
    calls: list[list[str]] = []
    env = {"SCCACHE_CONF": str(conf), "PATH": f"{wrappers}:{shims}:{bindir}", "NVCC_CCBIN": str(bindir / "c++")}
    out = distclient.prepare(env, shims, tmp_path / "out", "sccache", exclude=(wrappers,), runner=_runner(calls))
    derived = tomllib.loads(Path(out["SCCACHE_CONF"]).read_text())
    assert derived["cache"] == {"disk": {"size": 5}} and derived["dist"]["auth"]["token"] == "t"  # the user's, kept
    over = {t["compiler_executable"]: t for t in derived["dist"]["toolchains"]}
    assert set(over) == {str(shims / "c++"), str(shims / "gcc")}
    assert over[str(shims / "c++")]["archive_compiler_executable"] == str(bindir / "c++")
    assert over[str(shims / "gcc")]["archive_compiler_executable"] == str(bindir / "gcc")
    assert all(Path(t["archive"]).is_file() and t["type"] == "path_override" for t in over.values())
    assert sorted(c[2] for c in calls) == [str(bindir / "c++"), str(bindir / "gcc")]  # packed once each, real ones
    assert all(c[:2] == ["sccache", "--package-toolchain"] for c in calls)


def test_prepare_leaves_a_build_without_a_scheduler_alone(tmp_path: Path) -> None:
    assert distclient.prepare({}, tmp_path, tmp_path / "o", "sccache") == {}
    conf = tmp_path / "c.conf"
    conf.write_text('[cache.disk]\nsize = 5\n')
    assert distclient.prepare({"SCCACHE_CONF": str(conf)}, tmp_path, tmp_path / "o", "sccache") == {}


def test_prepare_says_what_is_wrong_with_the_config_or_the_packing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("[dist\n")
    with pytest.raises(ToolchainError, match="cannot be read as TOML"):
        distclient.prepare({"SCCACHE_CONF": str(bad)}, tmp_path, tmp_path / "o", "sccache")
    good = tmp_path / "good.conf"
    good.write_text('[dist]\nscheduler_url = "http://127.0.0.1:1"\n')
    (tmp_path / "gcc").write_text("")
    (tmp_path / "gcc").chmod(0o755)

    def fail(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "error: no such compiler")
    with pytest.raises(ToolchainError, match="could not pack the host compiler .*no such compiler"):
        distclient.prepare({"SCCACHE_CONF": str(good), "PATH": str(tmp_path)}, tmp_path / "shims", tmp_path / "o",
                           "sccache", runner=fail)

"""kforge.build.reproducible: SOURCE_DATE_EPOCH from the source itself, nvcc's random seed fixed, the checkout's folder
mapped for host compilers and nvcc, the user's choice kept."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kforge.build.reproducible import MAPPED_ROOT, Epoch, PathMap, build_env, plan_reproducibility, source_epoch
from kforge.config.source import GitSource, LocalSource, SdistSource
from kforge.sources.upstream import PreparedSource


def git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_AUTHOR_DATE="1700000000 +0000", GIT_COMMITTER_DATE="1700000000 +0000",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def prepared(tree: Path, spec) -> PreparedSource:
    return PreparedSource(tree=tree, pin="x", kind="local", spec=spec)


def test_a_local_source_takes_the_last_commit_that_touched_it(tmp_path):
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "kernels" / "k").mkdir(parents=True)
    (tmp_path / "kernels" / "k" / "a.cu").write_text("x")
    git("add", ".", cwd=tmp_path)
    git("commit", "-qm", "k", cwd=tmp_path)
    spec = LocalSource("kernels/k")
    epoch = source_epoch(tmp_path, spec, prepared(tmp_path / "kernels" / "k", spec))
    assert epoch == Epoch(1700000000, "last commit touching kernels/k")


def test_a_git_pin_takes_its_commit_time(tmp_path):
    repo = tmp_path / "externals" / "up"
    repo.mkdir(parents=True)
    git("init", "-q", cwd=repo)
    (repo / "f").write_text("x")
    git("add", ".", cwd=repo)
    git("commit", "-qm", "up", cwd=repo)
    sha = git("rev-parse", "HEAD", cwd=repo)
    spec = GitSource("externals/up", "file:///nowhere", sha)
    assert source_epoch(tmp_path, spec, prepared(repo, spec)).seconds == 1700000000


def test_an_sdist_takes_its_newest_file(tmp_path):
    for name, t in (("a", 1600000000), ("b", 1650000000)):
        (tmp_path / name).write_text(name)
        os.utime(tmp_path / name, (t, t))
    spec = SdistSource("p", "1.0", "0" * 64)
    assert source_epoch(tmp_path, spec, prepared(tmp_path, spec)).seconds == 1650000000


def test_no_git_history_sets_no_epoch(tmp_path):
    spec = LocalSource("kernels/k")
    assert source_epoch(tmp_path, spec, prepared(tmp_path, spec)).seconds is None
    assert "SOURCE_DATE_EPOCH" not in build_env(plan_reproducibility("k", tmp_path, "linux", device=True),
                                                Epoch(None, "none"), {})


def test_the_env_fixes_the_seed_and_keeps_what_the_user_set():
    repro = plan_reproducibility("flashmla", Path("/w/ckout"), "linux", device=True)
    env = build_env(repro, Epoch(1700000000, "x"), {"NVCC_APPEND_FLAGS": "-gencode arch=compute_90a,code=sm_90a",
                                                    "CXXFLAGS": "-O2"})
    assert env == {"SOURCE_DATE_EPOCH": "1700000000",
                   "NVCC_APPEND_FLAGS": "-gencode arch=compute_90a,code=sm_90a -frandom-seed=flashmla "
                                        "-Xcompiler=-ffile-prefix-map=/w/ckout=/kforge",
                   "CFLAGS": "-ffile-prefix-map=/w/ckout=/kforge",
                   "CXXFLAGS": "-O2 -ffile-prefix-map=/w/ckout=/kforge"}
    mine = build_env(repro, Epoch(1700000000, "x"),
                     {"SOURCE_DATE_EPOCH": "1", "NVCC_APPEND_FLAGS": "-frandom-seed=me -Xcompiler=-fdebug-prefix-map=/w/ckout=/b",
                      "CFLAGS": "-fmacro-prefix-map=/w/ckout=/b", "CXXFLAGS": "-ffile-prefix-map=/w/ckout=/c"})
    assert mine == {}  # the user's own seed and maps of the checkout win
    other = build_env(repro, Epoch(None, "none"), {"CFLAGS": "-fdebug-prefix-map=/opt/conda/src=/usr/src/conda"})
    assert other["CFLAGS"] == "-fdebug-prefix-map=/opt/conda/src=/usr/src/conda -ffile-prefix-map=/w/ckout=/kforge"


def test_the_plan_maps_the_checkout_to_one_name_whatever_its_folder():
    a = plan_reproducibility("fmha", Path("/tmp/a/x"), "linux", device=True)
    b = plan_reproducibility("fmha", Path("/tmp/bb/yyy"), "linux", device=True)
    assert a.path_maps == (PathMap("/tmp/a/x", MAPPED_ROOT),) and b.path_maps == (PathMap("/tmp/bb/yyy", MAPPED_ROOT),)
    assert a.nvcc_flags == ("-frandom-seed=fmha", "-Xcompiler=-ffile-prefix-map=/tmp/a/x=/kforge")
    assert a.device_maps and "device code: kforge's nvcc wrapper maps" in "\n".join(a.describe())
    assert a.to_dict()["path_maps"] == [["/tmp/a/x", "/kforge"]]


def test_a_root_no_flag_can_carry_and_windows_get_no_maps_and_say_why():
    spaced = plan_reproducibility("fmha", Path("/tmp/my work/x"), "linux", device=True)
    assert spaced.path_maps == () and not spaced.device_maps and "' '" in spaced.unmapped
    assert build_env(spaced, Epoch(None, "x"), {}) == {"NVCC_APPEND_FLAGS": "-frandom-seed=fmha"}
    assert "paths not mapped: the root '/tmp/my work/x' holds ' '" in "\n".join(spaced.describe())
    win = plan_reproducibility("fmha", Path("/w"), "windows", device=False)
    assert win.path_maps == () and "MSVC" in win.unmapped


def test_the_plan_says_why_device_code_is_not_mapped():
    off = plan_reproducibility("fmha", Path("/w"), "linux", device=False, no_device="arch_enforce = off: no wrapper")
    assert off.path_maps and not off.device_maps
    assert off.describe()[-1] == "device code: not mapped (arch_enforce = off: no wrapper)"

"""kforge.cuda.enforce: the plan's promise, the build-script scan, the wrapper's install, the summary."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from kforge_testkit import write_forge_toml  # noqa: E402

from kforge.build.host import HostFacts, Resources
from kforge.build.profiles import JobProfile
from kforge.config.forge import load_forge
from kforge.config.targets import parse_target
from kforge.cuda.enforce import install, plan_enforcement, scan_build_scripts, summarize
from kforge.cuda.nvccwrap import Config
from kforge.errors import ConfigError
from kforge.plan import make_plan

FLAGS = ("-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90")


def test_scan_finds_hard_coded_flags_not_docs_or_cache_defaults(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text(
        '"""Builds for ``-gencode`` archs and ``--threads 4`` (docs only)."""\n'
        'flags = ["-gencode", "arch=compute_75,code=sm_75"]\n'
        "# flags += ['-gencode', 'arch=compute_80,code=sm_80']  (a comment)\n"
        'flags += ["--threads", "4"]\n'
    )
    (tmp_path / "CMakeLists.txt").write_text(
        'set(CMAKE_CUDA_ARCHITECTURES "90a" CACHE STRING "default")\nset(CMAKE_CUDA_ARCHITECTURES 75 80 90)\n'
    )
    (tmp_path / "third_party" / "cutlass").mkdir(parents=True)
    (tmp_path / "third_party" / "cutlass" / "CMakeLists.txt").write_text("set(CMAKE_CUDA_ARCHITECTURES 70)\n")
    assert scan_build_scripts(tmp_path) == (
        "CMakeLists.txt:2: set(CMAKE_CUDA_ARCHITECTURES 75 80 90)",
        'setup.py:2: flags = ["-gencode", "arch=compute_75,code=sm_75"]',
        'setup.py:4: flags += ["--threads", "4"]',
    )


def test_plan_enforcement_modes_and_contents(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text('f = ["-gencode", "arch=compute_75,code=sm_75"]\n')
    on = plan_enforcement("on", FLAGS, 2, backend="native", platform_os="linux", scripts_dir=tmp_path)
    assert on.exact and on.exact_ptx and on.sass == ("sm_90",) and on.ptx == ("compute_90",)
    assert on.contents() == "SASS sm_90, PTX compute_90"
    assert "will rewrite where they differ: setup.py:1" in on.describe() and "--threads (to 2)" in on.describe()
    off = plan_enforcement("off", FLAGS, 2, backend="native", platform_os="linux", scripts_dir=tmp_path)
    assert not off.exact and off.hardcoded == () and off.describe().startswith("off (forge.toml)")
    # a container build or Windows cannot run the POSIX wrapper: held to check (the doctor stays exact)
    for backend, os_name in (("cibuildwheel", "linux"), ("native", "windows")):
        e = plan_enforcement("on", FLAGS, 2, backend=backend, platform_os=os_name, scripts_dir=None)
        assert e.mode == "check" and e.exact and not e.exact_ptx and e.reason
        assert "PTX compute_90 if the upstream embeds PTX" in e.contents()
    missing = plan_enforcement("on", FLAGS, 2, backend="native", platform_os="linux", scripts_dir=tmp_path / "none")
    assert "not checked out" in missing.scanned


def test_install_routes_every_nvcc_through_the_wrapper(tmp_path: Path) -> None:
    real = tmp_path / "cuda"
    (real / "bin").mkdir(parents=True)
    (real / "include").mkdir()
    (real / "bin" / "ptxas").write_text("")
    nvcc = real / "bin" / "nvcc"
    nvcc.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    nvcc.chmod(0o755)
    e = plan_enforcement("on", FLAGS, 2, backend="native", platform_os="linux", scripts_dir=None)
    setup = install(e, nvcc=nvcc, cuda_home=real, dest=tmp_path / "wrap", env={"PATH": "/usr/bin:/bin"})
    home = Path(setup.env["CUDA_HOME"])
    assert (home / "bin" / "nvcc") == setup.wrapper and setup.env["PYTORCH_NVCC"] == str(setup.wrapper)
    assert (home / "include").resolve() == (real / "include").resolve() and (home / "bin" / "ptxas").is_symlink()
    assert setup.env["CUDACXX"] == str(setup.direct) and setup.env["PATH"].startswith(str(home / "bin"))
    config = Config.from_json(shlex.split(setup.wrapper.read_text().splitlines()[-1])[4])
    assert config.nvcc == str(nvcc) and config.launcher is None and config.policy.mode == "on"

    env = {"PATH": setup.env["PATH"], "NVCC_APPEND_FLAGS": "-arch=sm_80"}
    for exe in (setup.wrapper, setup.direct):  # the real wrapper script, through /bin/sh and python -I
        out = subprocess.run([str(exe), "-c", "k.cu", "-gencode", "arch=compute_75,code=sm_75", "--threads", "4"],
                             env=env, capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == ["-c", "k.cu", *FLAGS, "--threads", "2"]
    version = subprocess.run([str(setup.wrapper), "--version"], env=env, capture_output=True, text=True, check=True)
    assert json.loads(version.stdout) == ["--version"]
    summary = summarize(setup.log, "on")
    assert summary.steps == 2 and summary.groups[0].asked == ("sm_75", "sm_80", "compute_80")
    assert summary.groups[0].count == 2 and summary.threads == ((4, 2, 2),)
    assert summary.lines()[0] == ("arch enforcement: rewrote 2 nvcc step(s) that asked for sm_75 sm_80 compute_80 "
                                  "to sm_90 compute_90 (e.g. k.cu)")
    assert summary.to_dict()["threads"] == [{"asked": 4, "got": 2, "count": 2}]


def test_summary_of_no_rewrites(tmp_path: Path) -> None:
    s = summarize(tmp_path / "absent.jsonl", "check")
    assert s.steps == 0 and s.lines() == ["arch enforcement (check): every nvcc step already asked for the plan's archs"]


def test_summary_counts_ptxas_splits_apart_from_rewrites(tmp_path: Path) -> None:
    log = tmp_path / "rewrites.jsonl"
    same = {"mode": "on", "inputs": ["a.cu"], "asked": ["sm_90"], "got": ["sm_90"], "threads": [None, 1]}
    log.write_text("\n".join(json.dumps({**same, "ptxas_threads": 4, "inputs": [f"{n}.cu"]}) for n in "abc") + "\n"
                   + json.dumps({**same, "asked": ["sm_75"], "ptxas_threads": 4}) + "\n")
    s = summarize(log, "on")
    assert s.steps == 1 and s.ptxas == ((4, 4),)
    assert s.lines()[-1] == "ptxas threads: 4 device step(s) got ptxas --split-compile=4 (the plan's ptxas_threads)"
    assert s.to_dict()["ptxas_threads"] == [{"threads": 4, "count": 4}]
    log.write_text(json.dumps({**same, "ptxas_threads": 2}) + "\n")
    assert summarize(log, "on").lines()[0].endswith("every nvcc step already asked for the plan's archs")


def test_ptxas_threads_need_the_wrapper() -> None:
    flags = ["-gencode=arch=compute_90,code=sm_90"]
    on = plan_enforcement("on", flags, 1, backend="native", platform_os="linux", scripts_dir=None, ptxas_threads=4,
                          ptxas_from="forge.toml ptxas_threads")
    assert on.ptxas_threads == 4 and on.policy.ptxas_threads == 4 and "--split-compile=4" in on.ptxas_line()
    for backend, platform_os, mode in (("cibuildwheel", "linux", "on"), ("native", "windows", "on"),
                                       ("native", "linux", "check"), ("native", "linux", "off")):
        e = plan_enforcement(mode, flags, 1, backend=backend, platform_os=platform_os, scripts_dir=None,
                             ptxas_threads=4, ptxas_from="forge.toml ptxas_threads")
        assert e.ptxas_threads is None and e.ptxas_line().startswith("1 thread: forge.toml ptxas_threads asks for 4")


@pytest.mark.skipif(os.name != "posix", reason="the wrapper is a POSIX script")
def test_wrapper_startup_is_small(tmp_path: Path) -> None:
    """The wrapper runs once per compile unit: python -I plus kforge.cuda.nvccwrap (stdlib only)."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-I", "-X", "importtime", "-c", f"import sys; sys.path.insert(0, {src!r}); "
                          "import kforge.cuda.nvccwrap"], capture_output=True, text=True, check=True)
    assert "kforge.cuda.nvccwrap" in out.stderr
    assert "kforge.cuda.arch\n" not in out.stderr and "packaging" not in out.stderr and "rich" not in out.stderr


PROJECT = """\
[projects.up]
source = {{ local = "up" }}
archs = ["sm_80", "sm_90"]
platforms = ["linux-x86_64"]
{extra}
"""


def test_forge_toml_key_and_the_plan_field(tmp_path: Path) -> None:
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "CMakeLists.txt").write_text("set(CMAKE_CUDA_ARCHITECTURES 75 80 90)\n")
    write_forge_toml(tmp_path, PROJECT.format(extra='arch_enforce = "chek"'))
    with pytest.raises(ConfigError, match="did you mean 'check'"):
        load_forge(tmp_path)
    write_forge_toml(tmp_path, PROJECT.format(extra=""))
    forge = load_forge(tmp_path)
    assert forge.project("up").arch_enforce == "on"
    host = HostFacts(platform="linux-x86_64", python="3.11", resources=Resources(2, 8 << 30, 8 << 30))
    profile = JobProfile(project="up", arch_count=1, peak_rss_per_unit=1 << 30, unit_seconds=10.0,
                         unit_seconds_max=10.0, samples=1, source="test")
    plan = make_plan(forge, parse_target(forge, "up-sm90", "linux-x86_64"), host, job_profile=profile)
    assert plan.enforce is not None and plan.enforce.mode == "on"
    assert plan.enforce.sass == ("sm_90",) and plan.enforce.ptx == ("compute_90",)
    assert plan.enforce.hardcoded == ("CMakeLists.txt:1: set(CMAKE_CUDA_ARCHITECTURES 75 80 90)",)
    assert plan.to_dict()["arch_enforce"]["sass"] == ["sm_90"]


@pytest.mark.parametrize("target, mode, binaries", [
    ("flash-attn-sm90", "on", "every CUDA binary holds exactly SASS sm_90 (the doctor"),  # ptx: upstream's, none
    ("flash-attn-sm120-windows", "check", "every CUDA binary holds exactly SASS sm_120 (the doctor"),
    ("fmha-sm90", "on", "every CUDA binary holds exactly SASS sm_90a, PTX compute_90a"),
])
def test_the_repos_own_targets_say_what_their_binaries_hold(target: str, mode: str, binaries: str) -> None:
    root = Path(__file__).resolve().parents[2]
    forge = load_forge(root)
    host = HostFacts(platform="linux-x86_64", python="3.11", resources=Resources(16, 100 << 30, 128 << 30))
    profile = JobProfile(project="x", arch_count=1, peak_rss_per_unit=1 << 30, unit_seconds=10.0,
                         unit_seconds_max=10.0, samples=1, source="test")
    plan = make_plan(forge, parse_target(forge, target, "linux-x86_64"), host, job_profile=profile)
    assert plan.enforce is not None and plan.enforce.mode == mode
    text = plan.render()
    assert binaries in text and "  enforce     " + mode in text
    # the wrapper enforces exactly the flags the plan prints
    assert plan.enforce.flags == plan.nvcc_flags

"""Backends without a compiler: the registry, the runner (log, progress, peak RSS, OOM retry),
the native and cmake command lines, and the wheel-count check. Real subprocesses, fake builds."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from kforge_testkit import forge_toml
from packaging.version import Version

from kforge.backends import BACKENDS, Backend, BuildRequest, BuildResult, get_backend
from kforge.backends._runner import (
    BuildLog,
    LiveProgress,
    find_ninja_logs,
    fmt_seconds,
    run_step,
    summarize_failure,
)
from kforge.backends.cmake import CmakeBackend, pack
from kforge.backends.native import NativeBackend
from kforge.build.host import HostFacts, Resources
from kforge.build.jobs import JobChoice
from kforge.build.profiles import load_profile
from kforge.config.forge import load_forge
from kforge.config.model import BACKEND_NAMES
from kforge.config.targets import parse_target
from kforge.errors import BuildError
from kforge.plan import PlanOptions, make_plan

FORGE_TOML = forge_toml("""
[projects.tiny]
source = { local = "tiny" }
archs = ["sm_90"]
arch_knobs = [{ env = "TINY_CUDA_ARCHS", format = "numbers" }]
build_isolation = false

[projects.tt]
source = { local = "tt" }
archs = ["sm_90a"]
torch_abi = true
build_isolation = true

[projects.cm]
source = { local = "cm" }
archs = ["sm_90", "sm_120a"]
backend = "cmake"
arch_knobs = [{ env = "CMAKE_CUDA_ARCHITECTURES", format = "cmake" }]
""")


def make_test_plan(tmp_path: Path, target: str, **options):
    (tmp_path / "forge.toml").write_text(FORGE_TOML)
    forge = load_forge(tmp_path)
    host = HostFacts(platform="linux-x86_64", python="3.11", resources=Resources(2, 16 * 2**30, 24 * 2**30),
                     cuda_version=Version("13.0"), nvcc_path="/opt/cuda/bin/nvcc", cuda_home="/opt/cuda")
    t = parse_target(forge, target, host.platform)
    return make_plan(forge, t, host, PlanOptions(**options), job_profile=load_profile(tmp_path / "cache", t.project, 1))


def request_for(plan, tmp_path: Path, *, tree: Path, python: str = sys.executable, env=None, **kw) -> BuildRequest:
    return BuildRequest(plan=plan, tree=tree, out_dir=tmp_path / "out", work_dir=tmp_path / "work",
                        env={**os.environ, **plan.env, **(env or {})}, python=python,
                        forge_pythons=("3.10", "3.11"), progress=False, **kw)


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


# ---------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_get_backend_returns_the_named_backend(name):
    backend = get_backend(name)
    assert backend.name == name
    assert isinstance(backend, Backend)


def test_the_registry_holds_exactly_the_names_config_accepts():
    assert tuple(BACKENDS) == BACKEND_NAMES  # config, options and plan read the names; the registry maps them


def test_get_backend_unknown_name_says_did_you_mean():
    with pytest.raises(BuildError) as err:
        get_backend("nativ")
    assert "did you mean 'native'" in err.value.render()
    assert "cibuildwheel" in err.value.render()  # lists what exists


# ---------------------------------------------------------------------------- progress and the runner


def test_live_progress_prints_units_elapsed_and_eta_as_plain_lines():
    from rich.console import Console

    now = [100.0]
    buf = io.StringIO()
    live = LiveProgress("building x", console=Console(file=buf, force_terminal=False, width=200), clock=lambda: now[0])
    with live:
        now[0] += 10
        live.feed("[1/4] Building CUDA object a.o")  # too soon for a plain line (every 30 s)
        now[0] += 30
        live.feed("  [2/4] Building CUDA object b.o")  # pip -v indents backend output
        live.feed("not a status line")
        now[0] += 40
        live.feed("[4/4] Linking")  # the last unit always prints
    lines = buf.getvalue().splitlines()
    assert lines == [
        "building x: 2/4 units, 0:40 elapsed, ETA 0:40",
        "building x: 4/4 units, 1:20 elapsed, ETA 0:00",
    ]
    assert live.seen is not None and (live.seen.done, live.seen.total) == (4, 4)


def test_live_progress_shows_no_eta_until_units_or_a_profile_measured_it():
    from rich.console import Console

    def lines(expected):  # noqa: ANN001, ANN202
        now = [0.0]
        buf = io.StringIO()
        live = LiveProgress("b", console=Console(file=buf, force_terminal=False, width=200), clock=lambda: now[0],
                            expected=expected)
        with live:
            now[0] += 40
            live.feed("[1/12] Building CUDA object a.o")  # one quick unit says nothing about the long ones
            now[0] += 40
            live.feed("[2/12] Building CUDA object b.o")  # nor do two of twelve (a quarter is three)
            now[0] += 40
            live.feed("[12/12] Linking")
        return buf.getvalue().splitlines()

    assert lines(None) == ["b: 1/12 units, 0:40 elapsed", "b: 2/12 units, 1:20 elapsed",
                           "b: 12/12 units, 2:00 elapsed, ETA 0:00"]
    assert lines(100.0)[:2] == ["b: 1/12 units, 0:40 elapsed, ETA 1:00", "b: 2/12 units, 1:20 elapsed, ETA 0:20"]


def test_fmt_seconds():
    assert [fmt_seconds(s) for s in (None, 0, 59.6, 61, 3725)] == ["?", "0:00", "1:00", "1:01", "1:02:05"]


def _choice(jobs=4, threads=1):
    return JobChoice(max_jobs=jobs, nvcc_threads=threads, reason="test")


def test_run_step_logs_output_and_measures(tmp_path):
    with BuildLog(tmp_path / "build.log") as log:
        live = LiveProgress("x", enabled=False)
        out = run_step([sys.executable, "-c", "import os; print('[1/2] a'); print('[2/2] b', os.environ['MAX_JOBS'])"],
                       env=dict(os.environ), choice=_choice(3), log=log, label="step", work_dir=tmp_path, live=live)
    text = (tmp_path / "build.log").read_text()
    assert "==== kforge: step (attempt 1, MAX_JOBS=3 NVCC_THREADS=1)" in text
    assert "[2/2] b 3" in text  # the job choice reached the command's environment
    assert out.progress is not None and (out.progress.done, out.progress.total) == (2, 2)
    assert out.retried_with_jobs is None and out.peak_rss > 0
    assert not list(tmp_path.glob(".peak-*"))  # the wrapper's scratch files are cleaned up


def test_run_step_failure_shows_command_exit_code_tail_and_log(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('compiling a.cu'); print('a.cu(3): error: boom'); sys.exit(3)"]
    with BuildLog(tmp_path / "build.log") as log, pytest.raises(BuildError) as err:
        run_step(cmd, env=dict(os.environ), choice=_choice(), log=log, label="pip wheel of tiny-sm90",
                 work_dir=tmp_path)
    text = err.value.render()
    assert err.value.what.startswith("pip wheel of tiny-sm90 failed: ")
    assert "kforge.build.measure" not in err.value.what  # the user's command, not our wrapper
    assert "exit code 3" in text.lower() and "a.cu(3): error: boom" in text
    assert str(tmp_path / "build.log") in text
    assert "Traceback" not in text


def test_summarize_failure_finds_the_compiler_error_not_the_backend_traceback():
    output = textwrap.dedent("""\
        ==== kforge: pip wheel of x (attempt 1, MAX_JOBS=2 NVCC_THREADS=1): pip wheel .
          running build_ext
          csrc/a.cu(12): error: identifier "oops" is undefined
          1 error detected in the compilation of "csrc/a.cu".
          Traceback (most recent call last):
            File "setup.py", line 40, in build_extension
              subprocess.run(cmd, check=True)
          subprocess.CalledProcessError: Command 'nvcc' returned non-zero exit status 2.
          error: subprocess-exited-with-error
          note: This error originates from a subprocess, and is likely not a problem with pip.
        ERROR: Failed to build one or more wheels
        """)
    text = summarize_failure(output, tail=4)
    first, _, last = text.partition("last output:\n")
    assert first.splitlines()[1:] == ['csrc/a.cu(12): error: identifier "oops" is undefined',
                                      '1 error detected in the compilation of "csrc/a.cu".']
    assert 'File "setup.py"' not in text and "subprocess.run(cmd" not in text  # traceback frames dropped
    assert "CalledProcessError" in last  # the exception line itself stays
    assert len(last.splitlines()) == 4 and "==== kforge" not in text


def test_run_step_retries_once_with_half_the_jobs_after_an_oom_kill(tmp_path):
    # Killed like the OOM killer does (SIGKILL) whenever more than 2 jobs run.
    body = "import os; j = int(os.environ['MAX_JOBS']); print('jobs', j); (j > 2) and os.kill(os.getpid(), 9)"
    with BuildLog(tmp_path / "build.log") as log:
        out = run_step([sys.executable, "-c", body], env=dict(os.environ), choice=_choice(4), log=log,
                       label="build", work_dir=tmp_path)
    assert out.retried_with_jobs == 2 and out.choice.max_jobs == 2
    text = (tmp_path / "build.log").read_text()
    assert "attempt 1, MAX_JOBS=4" in text and "attempt 2, MAX_JOBS=2" in text and "ran out of memory" in text


def test_run_step_gives_up_after_the_second_oom(tmp_path):
    body = "import os; os.kill(os.getpid(), 9)"
    with BuildLog(tmp_path / "build.log") as log, pytest.raises(BuildError) as err:
        run_step([sys.executable, "-c", body], env=dict(os.environ), choice=_choice(4), log=log,
                 label="build", work_dir=tmp_path)
    assert "out-of-memory" in err.value.render() and "retried once with 2 jobs" in err.value.render().lower()


def test_find_ninja_logs_skips_logs_from_before_the_build(tmp_path):
    old = tmp_path / "tree" / "build" / "temp.old" / ".ninja_log"
    new = tmp_path / "work" / "skbuild" / ".ninja_log"
    for p in (old, new):
        p.parent.mkdir(parents=True)
        p.write_text("# ninja log v5\n")
    os.utime(old, (1_000_000, 1_000_000))
    assert find_ninja_logs([tmp_path / "tree", tmp_path / "work", tmp_path / "missing"], since=2_000_000) == (new,)


# ---------------------------------------------------------------------------- native


def test_native_command_and_env(tmp_path):
    tiny = make_test_plan(tmp_path, "tiny-sm90")  # build_isolation = false
    tt = make_test_plan(tmp_path, "tt-sm90")  # torch_abi, isolated
    backend = NativeBackend()
    cmd = backend.command(request_for(tiny, tmp_path, tree=tmp_path / "t"), tmp_path / "w")
    assert cmd[:4] == [sys.executable, "-m", "pip", "wheel"]
    assert "--no-deps" in cmd and "-v" in cmd and "--no-build-isolation" in cmd and cmd[-1] == str(tmp_path / "t")
    assert cmd[cmd.index("-w") + 1] == str(tmp_path / "w")
    assert "--no-build-isolation" not in backend.command(request_for(tt, tmp_path, tree=tmp_path / "t"), tmp_path / "w")

    env = backend.build_env(request_for(tiny, tmp_path, tree=tmp_path / "t"), tmp_path / "u.jsonl")
    assert env["SKBUILD_BUILD_DIR"] == str(tmp_path / "work" / "skbuild")
    assert env["TINY_CUDA_ARCHS"] == "90"
    assert env.get("PYTORCH_NVCC") == os.environ.get("PYTORCH_NVCC")  # not a torch project: left alone
    assert "CUDAARCHS" not in env or env["CUDAARCHS"] == os.environ.get("CUDAARCHS")  # no cmake knob in this plan
    cm_env = backend.build_env(request_for(make_test_plan(tmp_path, "cm-sm120"), tmp_path, tree=tmp_path / "t"),
                               tmp_path / "u.jsonl")
    assert cm_env["CUDAARCHS"] == cm_env["CMAKE_CUDA_ARCHITECTURES"]  # CMake reads CUDAARCHS as the default
    launcher = env["CMAKE_CUDA_COMPILER_LAUNCHER"].split(";")  # CMake-driven builds (scikit-build-core)
    # python -I boot.py: pip's isolated build env rewrites PYTHONPATH/site, which must not hide kforge
    boot = tmp_path / "kforge_peak_boot.py"
    assert launcher[:6] == [sys.executable, "-I", str(boot), "unit", str(tmp_path / "u.jsonl"), "--"]
    isolated = subprocess.run([sys.executable, "-I", str(boot), "bogus"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(tmp_path / "nothing"), "PYTHONNOUSERSITE": "1"})
    assert isolated.returncode == 2 and "usage:" in isolated.stderr  # kforge imported, main() answered
    torch_env = backend.build_env(request_for(tt, tmp_path, tree=tmp_path / "t", env={"PYTORCH_NVCC": "ccache nvcc"}),
                                  tmp_path / "u.jsonl")
    assert torch_env["PYTORCH_NVCC"].endswith(f"-I {boot} unit {tmp_path / 'u.jsonl'} -- ccache nvcc")


def test_native_refuses_a_tree_that_is_not_a_python_project(tmp_path):
    plan = make_test_plan(tmp_path, "tiny-sm90")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BuildError) as err:
        NativeBackend().build(request_for(plan, tmp_path, tree=tmp_path / "empty"))
    assert "neither pyproject.toml nor setup.py" in err.value.render() and "build_dir" in err.value.render()


@pytest.mark.parametrize(("wheels", "message"), [
    ((), "left 0 wheels"),
    (("a-1-py3-none-any.whl", "b-1-py3-none-any.whl"), "left 2 wheels"),
])
def test_native_requires_exactly_one_wheel(tmp_path, wheels, message):
    plan = make_test_plan(tmp_path, "tiny-sm90")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    # A stand-in interpreter that "builds" by writing these files into pip's -w directory.
    touch = " ".join(f'"$dir/{w}"' for w in wheels)
    fake = script(tmp_path / "fake-python", f"""
        while [ $# -gt 0 ]; do [ "$1" = "-w" ] && dir="$2"; shift; done
        echo "Building wheel"; {"touch " + touch if wheels else "true"}
    """)
    with pytest.raises(BuildError) as err:
        NativeBackend().build(request_for(plan, tmp_path, tree=tree, python=str(fake)))
    assert message in err.value.render()
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # nothing half-delivered


def test_native_moves_the_one_wheel_into_out_dir(tmp_path):
    plan = make_test_plan(tmp_path, "tiny-sm90")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text("")
    fake = script(tmp_path / "fake-python", """
        while [ $# -gt 0 ]; do [ "$1" = "-w" ] && dir="$2"; shift; done
        echo "[1/1] cc x.o"; echo wheel > "$dir/tiny-1.0-cp311-cp311-linux_x86_64.whl"
    """)
    result = NativeBackend().build(request_for(plan, tmp_path, tree=tree, python=str(fake)))
    assert isinstance(result, BuildResult) and result.kind == "wheel"
    assert result.artifact == tmp_path / "out" / "tiny-1.0-cp311-cp311-linux_x86_64.whl" and result.artifact.is_file()
    assert result.artifacts == (result.artifact,) and result.log.is_file() and result.retried_with_jobs is None


# ---------------------------------------------------------------------------- cmake


def test_cmake_configure_command(tmp_path):
    plan = make_test_plan(tmp_path, "cm-sm120")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir / "ninja", "exit 0\n")
    req = request_for(plan, tmp_path, tree=tmp_path / "src",
                      env={"PATH": str(bin_dir), "CMAKE_ARGS": "-DFOO=1 -DCMAKE_BUILD_TYPE=Debug",
                           "CMAKE_CUDA_COMPILER_LAUNCHER": "ccache"})
    cmd = CmakeBackend().configure_command(req, "cmake", tmp_path / "b", tmp_path / "p", tmp_path / "u.jsonl")
    assert cmd[:5] == ["cmake", "-S", str(tmp_path / "src"), "-B", str(tmp_path / "b")]
    assert cmd[cmd.index("-G") + 1] == "Ninja"
    assert f"-DCMAKE_INSTALL_PREFIX={tmp_path / 'p'}" in cmd
    assert f"-DCMAKE_CUDA_ARCHITECTURES={plan.env['CMAKE_CUDA_ARCHITECTURES']}" in cmd
    assert cmd[-2:] == ["-DFOO=1", "-DCMAKE_BUILD_TYPE=Debug"] and "-DCMAKE_BUILD_TYPE=Release" not in cmd
    cuda_launcher = next(a for a in cmd if a.startswith("-DCMAKE_CUDA_COMPILER_LAUNCHER="))
    assert cuda_launcher.endswith(f"/kforge_peak_boot.py;unit;{tmp_path / 'u.jsonl'};--;ccache")

    no_ninja = request_for(plan, tmp_path, tree=tmp_path / "src", env={"PATH": str(tmp_path / "nothing")})
    assert "-G" not in CmakeBackend().configure_command(no_ninja, "cmake", tmp_path / "b", tmp_path / "p", None)


def test_cmake_archs_from_the_plan_when_no_knob(tmp_path):
    plan = make_test_plan(tmp_path, "cm-sm90")
    env = {k: v for k, v in plan.env.items() if k != "CMAKE_CUDA_ARCHITECTURES"}
    req = BuildRequest(plan=plan, tree=tmp_path, out_dir=tmp_path, work_dir=tmp_path, env=env,
                       python=sys.executable, forge_pythons=("3.11",))
    assert CmakeBackend().cuda_architectures(req) == plan.env["CMAKE_CUDA_ARCHITECTURES"]


def test_cmake_refuses_a_tree_without_cmakelists(tmp_path):
    plan = make_test_plan(tmp_path, "cm-sm90")
    with pytest.raises(BuildError) as err:
        CmakeBackend().build(request_for(plan, tmp_path, tree=tmp_path))
    assert "no CMakeLists.txt" in err.value.render() and "--backend native" in err.value.render()


def test_pack_puts_the_prefix_under_one_root(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "liba.so.0").write_bytes(b"\x7fELF")
    (prefix / "lib" / "liba.so").symlink_to("liba.so.0")
    dest = pack(prefix, tmp_path / "out" / "cm-sm90.tar.gz", root="cm-sm90")
    with tarfile.open(dest) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["cm-sm90", "cm-sm90/lib", "cm-sm90/lib/liba.so", "cm-sm90/lib/liba.so.0"]
    assert members["cm-sm90/lib/liba.so"].issym() and members["cm-sm90/lib/liba.so"].linkname == "liba.so.0"
    assert all(m.uid == 0 and m.uname == "" for m in members.values())
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["cm-sm90.tar.gz"]  # no temp file left

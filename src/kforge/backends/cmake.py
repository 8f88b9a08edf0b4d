"""The cmake backend: standalone C/CUDA libraries (fmha's C API), no Python packaging.

Steps, each a command in the build log: configure (``-G Ninja`` when ninja is on the build's
PATH), build (``--parallel`` = the plan's jobs, halved once after an OOM kill), install into
``work_dir/prefix``, optionally ``ctest``, then pack the prefix as
``out_dir/<target id>.tar.gz`` (the target id starts with the project name).

``CMAKE_CUDA_ARCHITECTURES`` comes from the plan's env (the project's ``cmake`` arch knob),
else it is rendered from the plan's archs. Extra ``-D`` options come from ``CMAKE_ARGS``
(the scikit-build convention). On POSIX, a measuring compiler launcher records each unit's
time and peak RSS (chained in front of any launcher the env already names, e.g. ccache).
"""

from __future__ import annotations

import os
import shlex
import tarfile
import time
from pathlib import Path

from kforge.backends import BuildRequest, BuildResult
from kforge.backends._runner import (
    LAUNCHER_LANGS,
    BuildLog,
    LiveProgress,
    StepOutcome,
    expected_seconds,
    find_ninja_logs,
    measuring_launcher,
    read_units,
    run_step,
    which,
)
from kforge.build.jobs import JobChoice
from kforge.build.run import Command
from kforge.cuda.render import render_cmake_architectures
from kforge.errors import BuildError, ToolchainError


class CmakeBackend:
    name = "cmake"

    def cuda_architectures(self, request: BuildRequest) -> str:
        value = request.env.get("CMAKE_CUDA_ARCHITECTURES", "").strip()
        if value:
            return value
        return render_cmake_architectures(request.plan.archs)

    def configure_command(self, request: BuildRequest, cmake: str, build_dir: Path, prefix: Path,
                          units_log: Path | None) -> list[str]:
        env = request.env
        cmd = [cmake, "-S", str(request.tree), "-B", str(build_dir)]
        if which("ninja", env):
            cmd += ["-G", "Ninja"]
        extra = shlex.split(env.get("CMAKE_ARGS", ""))
        if not any(a.startswith("-DCMAKE_BUILD_TYPE") for a in extra):
            cmd.append("-DCMAKE_BUILD_TYPE=Release")
        cmd += [f"-DCMAKE_INSTALL_PREFIX={prefix}", f"-DCMAKE_CUDA_ARCHITECTURES={self.cuda_architectures(request)}"]
        if units_log is not None:
            for lang in LAUNCHER_LANGS:
                cmd.append(f"-DCMAKE_{lang}_COMPILER_LAUNCHER={measuring_launcher(units_log, env, lang)}")
        return cmd + extra

    def build(self, request: BuildRequest) -> BuildResult:
        plan = request.plan
        tree, work = Path(request.tree), Path(request.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        if not (tree / "CMakeLists.txt").is_file():
            raise BuildError(
                f"{tree} has no CMakeLists.txt",
                why=f"the cmake backend configures a CMake project, and build_dir is '{plan.build_dir}'",
                fix=f"point build_dir of [projects.{plan.project.name}] at the directory with CMakeLists.txt, "
                    "or use --backend native for a Python project",
            )
        cmake = which("cmake", request.env)
        if not cmake:
            raise ToolchainError("cmake is not on the build's PATH", why="the cmake backend runs cmake",
                                 fix="install CMake >= 3.18 (e.g. pip install cmake) or use --backend native")
        build_dir, prefix = work / "build", work / "prefix"
        units_log = work / "units.jsonl" if os.name == "posix" else None
        env = dict(request.env)
        choice = plan.jobs
        log_path = work / "build.log"
        since, start = time.time(), time.monotonic()
        peak, retried = 0, None
        with BuildLog(log_path) as log:

            def step(argv: Command, what: str, choice: JobChoice, *, cwd: Path = work,
                     live: LiveProgress | None = None) -> StepOutcome:
                return run_step(argv, env=env, choice=choice, log=log, label=f"{what} of {plan.id}",
                                work_dir=work, cwd=cwd, live=live)

            out = step(self.configure_command(request, cmake, build_dir, prefix, units_log), "cmake configure", choice)
            peak = max(peak, out.peak_rss)
            with LiveProgress(f"building {plan.id}", enabled=request.progress, expected=expected_seconds(plan)) as live:
                out = step(lambda c: [cmake, "--build", str(build_dir), "--parallel", str(c.max_jobs)],
                           "cmake build", out.choice, live=live)
            peak, retried = max(peak, out.peak_rss), out.retried_with_jobs
            out = step([cmake, "--install", str(build_dir)], "cmake install", out.choice)
            peak = max(peak, out.peak_rss)
            if request.ctest:
                ctest = which("ctest", env) or str(Path(cmake).with_name("ctest"))
                out = step([ctest, "--output-on-failure"], "ctest", out.choice, cwd=build_dir)
                peak = max(peak, out.peak_rss)
        if not prefix.is_dir() or not any(prefix.iterdir()):
            raise BuildError(f"cmake install of {plan.id} installed nothing into {prefix}",
                             why="the project has no install() rules",
                             fix="add install(TARGETS ...) and install(FILES ...) to its CMakeLists.txt")
        artifact = pack(prefix, Path(request.out_dir) / f"{plan.id}.tar.gz", root=plan.id)
        return BuildResult(
            artifact=artifact,
            kind="cmake-install",
            seconds=time.monotonic() - start,
            peak_rss=peak,
            ninja_logs=find_ninja_logs((build_dir,), since),
            log=log_path,
            retried_with_jobs=retried,
            units=read_units(units_log),
            artifacts=(artifact,),
        )


def pack(prefix: Path, dest: Path, *, root: str) -> Path:
    """Pack ``prefix`` as ``dest`` (a .tar.gz whose entries sit under ``root/``), atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(prefix, arcname=root, recursive=False, filter=clean)
            for path in sorted(prefix.rglob("*")):
                tar.add(path, arcname=f"{root}/{path.relative_to(prefix).as_posix()}", recursive=False, filter=clean)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest

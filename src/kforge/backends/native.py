"""The native backend: a PEP 517 build of the prepared tree with ``pip wheel``.

Why ``pip wheel`` and not ``python -m build --wheel``: pip is in every interpreter a user
builds with (the one that holds their torch), ``build`` is not; pip honours the pip
configuration users already have (index URLs, constraints, ``PIP_*``), and with
``--no-build-isolation`` it builds against the installed torch, which is what torch-ABI
projects need. ``--no-deps`` keeps it to this one wheel; ``-v`` lets the build backend's
output (and ninja's ``[n/m]`` lines) through to the log and the progress display.

Where build directories land, so the build report can find ``.ninja_log``:
scikit-build-core honours ``SKBUILD_BUILD_DIR`` (set to ``work_dir/skbuild``), and
setuptools / torch's ``BuildExtension`` write ``build/temp.*/.ninja_log`` inside the tree;
both roots are searched. A plan's ``CMAKE_CUDA_ARCHITECTURES`` is also given to CMake as
``CUDAARCHS`` (the environment variable CMake reads for that default).

Each compile unit's time and peak RSS is recorded (``BuildResult.units``) through a
measuring launcher: ``CMAKE_<LANG>_COMPILER_LAUNCHER`` for CMake-driven builds, and
``PYTORCH_NVCC`` in front of nvcc for torch extensions (POSIX only).
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from kforge.backends import BuildRequest, BuildResult
from kforge.backends._runner import (
    LAUNCHER_LANGS,
    BuildLog,
    LiveProgress,
    expected_seconds,
    find_ninja_logs,
    measuring_launcher,
    peak_command,
    place,
    read_units,
    run_step,
)
from kforge.errors import BuildError


class NativeBackend:
    name = "native"

    def command(self, request: BuildRequest, wheel_dir: Path) -> list[str]:
        cmd = [request.python, "-m", "pip", "wheel", "--no-deps", "--no-input", "--disable-pip-version-check",
               "-v", "-w", str(wheel_dir)]
        if not request.plan.build_isolation:
            cmd.append("--no-build-isolation")
        cmd.append(str(request.tree))
        return cmd

    def nvcc(self, request: BuildRequest) -> str | None:
        """The nvcc a torch extension build would run: CUDA_HOME's, else the plan's."""
        home = request.env.get("CUDA_HOME") or request.env.get("CUDA_PATH")
        exe = "nvcc.exe" if request.plan.platform_os == "windows" else "nvcc"
        if home and (Path(home) / "bin" / exe).is_file():
            return str(Path(home) / "bin" / exe)
        return request.plan.toolchain.nvcc_path

    def build_env(self, request: BuildRequest, units_log: Path) -> dict[str, str]:
        env = dict(request.env)
        env.setdefault("SKBUILD_BUILD_DIR", str(Path(request.work_dir) / "skbuild"))
        # CMake-driven builds take the plan's archs through CMake's own variable for the default.
        if env.get("CMAKE_CUDA_ARCHITECTURES") and not env.get("CUDAARCHS"):
            env["CUDAARCHS"] = env["CMAKE_CUDA_ARCHITECTURES"]
        if os.name != "posix":
            return env
        # Per-unit measurement: CMake (scikit-build-core, or a setup.py that runs cmake) reads
        # CMAKE_<LANG>_COMPILER_LAUNCHER from the environment as the launchers' default.
        for lang in LAUNCHER_LANGS:
            env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = measuring_launcher(units_log, env, lang)
        # ... and torch's BuildExtension runs $PYTORCH_NVCC (split like shell words) for nvcc.
        if request.plan.project.torch_abi:
            inner = env.get("PYTORCH_NVCC") or (shlex.quote(n) if (n := self.nvcc(request)) else None)
            if inner:
                env["PYTORCH_NVCC"] = (f"{shlex.join(peak_command(units_log.parent))} unit "
                                       f"{shlex.quote(str(units_log))} -- {inner}")
        return env

    def build(self, request: BuildRequest) -> BuildResult:
        plan = request.plan
        work = Path(request.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        if not (Path(request.tree) / "pyproject.toml").is_file() and not (Path(request.tree) / "setup.py").is_file():
            raise BuildError(
                f"{request.tree} is not a Python project",
                why="it has neither pyproject.toml nor setup.py",
                fix=f"check build_dir of [projects.{plan.project.name}] in forge.toml (now '{plan.build_dir}'), "
                    "or use --backend cmake for a standalone C library",
            )
        wheel_dir = work / "wheel"
        wheel_dir.mkdir(exist_ok=True)
        for stale in wheel_dir.glob("*.whl"):
            stale.unlink()
        units_log = work / "units.jsonl"
        env = self.build_env(request, units_log)
        log_path = work / "build.log"
        since = time.time()
        with BuildLog(log_path) as log, LiveProgress(f"building {plan.id}", enabled=request.progress, expected=expected_seconds(plan)) as live:
            outcome = run_step(self.command(request, wheel_dir), env=env, choice=plan.jobs,
                               log=log, label=f"pip wheel of {plan.id}", work_dir=work, cwd=Path(request.tree),
                               live=live)
        wheels = sorted(wheel_dir.glob("*.whl"))
        if len(wheels) != 1:
            found = ", ".join(w.name for w in wheels) or "no wheel"
            raise BuildError(
                f"pip wheel of {plan.id} finished but left {len(wheels)} wheels in {wheel_dir}: {found}",
                why="a build must produce exactly one wheel (--no-deps builds only the project itself)",
                fix=f"read the build log {log_path}",
            )
        artifact = place(wheels[0], Path(request.out_dir))
        return BuildResult(
            artifact=artifact,
            kind="wheel",
            seconds=outcome.seconds,
            peak_rss=outcome.peak_rss,
            ninja_logs=find_ninja_logs((Path(request.tree), work), since),
            log=log_path,
            retried_with_jobs=outcome.retried_with_jobs,
            units=read_units(units_log),
            artifacts=(artifact,),
        )

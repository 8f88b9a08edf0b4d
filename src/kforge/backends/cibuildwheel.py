"""The cibuildwheel backend: the plan rendered as ``CIBW_*`` configuration, then cibuildwheel.

:func:`cibuildwheel_env` is pure (plan in, variables out) so the configuration can be checked
by cibuildwheel itself (``--print-build-identifiers``) without building anything:

* ``CIBW_BUILD``: one CPython per forge.toml Python for torch-ABI wheels (their extension
  links one CPython's torch); a torch-free wheel is built once, with the lowest Python.
  Identifiers are exact (``cp311-manylinux_x86_64``): no musllinux (no CUDA there).
* ``CIBW_ARCHS``, ``CIBW_MANYLINUX_*_IMAGE=manylinux_2_28`` (AlmaLinux 8: NVIDIA's rhel8 repo).
* ``CIBW_ENVIRONMENT``: the plan's env (arch knobs, MAX_JOBS, NVCC_THREADS, ...) as
  ``KEY="value"`` words; host paths (CUDA_HOME, CUDACXX, PATH) are replaced by the
  container's CUDA on Linux.
* ``CIBW_BEFORE_ALL_LINUX``: install the CUDA toolkit of the plan's CUDA with dnf.
* ``CIBW_BEFORE_BUILD``: the plan's torch (torch-ABI projects) and the build tools, since
  such builds run without build isolation (``CIBW_BUILD_FRONTEND``). In a kforge image the torch
  layer (kforge.build.image) already has that torch, from PyPI: the same pin, no other index.
* ``CIBW_REPAIR_WHEEL_COMMAND_{LINUX,WINDOWS}``: ``kforge repair`` with the project's policy
  spelled out, so it needs no forge.toml inside the container.

Running needs a working container engine for Linux wheels (``docker info`` / ``podman
info``) and a Windows host for Windows wheels; without one the build fails fast and says
to use ``--backend native``.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kforge import __version__
from kforge.backends import BuildRequest, BuildResult
from kforge.backends._runner import BuildLog, LiveProgress, expected_seconds, place, run_step, which
from kforge.build.image import OFFICIAL_IMAGE, ensure_image, image_pythons, is_kforge_image, podman_env
from kforge.errors import BuildError, ToolchainError
from kforge.fsutil import cache_dir
from kforge.wheels.platformtag import wheel_tag

#: NVIDIA's CUDA repository for RHEL 8 (manylinux_2_28 is AlmaLinux 8), per machine.
CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/{repo_arch}/cuda-rhel8.repo"
#: Wheels of torch built for one CUDA: cu130, cu128, ...
TORCH_INDEX = "https://download.pytorch.org/whl/cu{major}{minor}"
#: Variables that name paths on the host where the plan was made; never copied into CIBW_ENVIRONMENT.
HOST_ONLY = ("CUDA_HOME", "CUDA_PATH", "CUDACXX", "PATH", "PYTORCH_NVCC", "CPLUS_INCLUDE_PATH")
#: The knobs kforge's OOM retry changes between attempts.
JOB_KNOBS = ("MAX_JOBS", "NVCC_THREADS", "CMAKE_BUILD_PARALLEL_LEVEL")
#: What a build without isolation needs besides torch.
BUILD_TOOLS = ("setuptools>=64", "wheel", "ninja", "packaging")
MANYLINUX = OFFICIAL_IMAGE


def python_tag(version: str) -> str:
    """``"3.11"`` -> ``"cp311"``."""
    try:
        v = Version(version)
    except InvalidVersion:
        v = None
    if v is None or len(v.release) < 2 or v.major != 3:
        raise BuildError(f"'{version}' is not a CPython version cibuildwheel can build",
                         fix="list versions like \"3.11\" in [toolchains] python of forge.toml")
    return f"cp{v.major}{v.minor}"


def machine_of(plan_platform: str, machine: str | None) -> str:
    """The CPU a platform builds for: given, or the tail of a forge.toml platform name (``linux-x86_64``)."""
    text = (machine or plan_platform.partition("-")[2] or plan_platform).lower()
    if text in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if text in ("aarch64", "arm64", "sbsa"):
        return "aarch64"
    raise BuildError(f"cibuildwheel backend: unknown machine '{text}' for platform {plan_platform}",
                     fix="give the platform machine = \"x86_64\", \"aarch64\" or \"AMD64\" in forge.toml")


def cibw_arch(platform_os: str, machine: str) -> str:
    if platform_os == "windows":
        return {"x86_64": "AMD64", "aarch64": "ARM64"}[machine]
    return machine


def selected_pythons(torch_abi: bool, forge_pythons: Sequence[str]) -> tuple[str, ...]:
    if not forge_pythons:
        raise BuildError("no Python versions to build for", fix="list them in [toolchains] python of forge.toml")
    ordered = sorted(dict.fromkeys(forge_pythons), key=lambda v: Version(v) if _is_version(v) else Version("0"))
    return tuple(ordered) if torch_abi else (ordered[0],)


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def build_identifiers(torch_abi: bool, forge_pythons: Sequence[str], platform_os: str, machine: str) -> tuple[str, ...]:
    """The exact cibuildwheel identifiers kforge builds, e.g. ``cp311-manylinux_x86_64``."""
    if platform_os == "linux":
        plat = f"manylinux_{machine}"
    elif platform_os == "windows":
        plat = {"x86_64": "win_amd64", "aarch64": "win_arm64"}[machine]
    else:
        raise BuildError(f"cibuildwheel backend: platform os '{platform_os}' is not supported",
                         fix="kforge builds linux and windows wheels")
    return tuple(f"{python_tag(v)}-{plat}" for v in selected_pythons(torch_abi, forge_pythons))


def quote(value: str) -> str:
    """A double-quoted shell word (how CIBW_ENVIRONMENT is parsed): \\, ", $ and ` escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'"{escaped}"'


def environment_string(env: Mapping[str, str], raw: Mapping[str, str] | None = None) -> str:
    """``KEY="value"`` words; ``raw`` values are written unescaped (``$PATH`` expands in the build)."""
    words = [f"{k}={quote(v)}" for k, v in env.items()]
    words += [f'{k}="{v}"' for k, v in (raw or {}).items()]
    return " ".join(words)


def cuda_packages(cuda: Version, torch_abi: bool) -> tuple[str, ...]:
    v = f"{cuda.major}-{cuda.minor}"
    pkgs = [f"cuda-nvcc-{v}", f"cuda-cudart-devel-{v}", f"cuda-cccl-{v}", f"cuda-nvrtc-devel-{v}"]
    if torch_abi:  # torch's CUDA headers include these libraries' headers
        pkgs += [f"libcublas-devel-{v}", f"libcusparse-devel-{v}", f"libcusolver-devel-{v}",
                 f"libcurand-devel-{v}", f"cuda-nvtx-{v}", f"cuda-profiler-api-{v}"]
    return tuple(pkgs)


def cuda_install_command(cuda: Version, machine: str, torch_abi: bool) -> str:
    """Shell for CIBW_BEFORE_ALL_LINUX: NVIDIA's rhel8 repo, then the toolkit pieces a build needs."""
    repo = CUDA_REPO.format(repo_arch="sbsa" if machine == "aarch64" else "x86_64")
    return " && ".join([
        "dnf install -y dnf-plugins-core",
        f"dnf config-manager --add-repo {repo}",
        "dnf install -y --setopt=install_weak_deps=False " + " ".join(cuda_packages(cuda, torch_abi)),
        f"/usr/local/cuda-{cuda.major}.{cuda.minor}/bin/nvcc --version",
    ])


def repair_command(target_id: str, *, torch_abi: bool, excludes: Sequence[str], install: str | None,
                   kforge: str = "kforge", plat: str | None = None, strip_debug: bool = False) -> str:
    args = ["repair", "--target", target_id, "--wheel", "{wheel}", "--dest-dir", "{dest_dir}"]
    if plat:  # the plan's platform tag: the repair inside the container must reach it
        args += ["--plat", plat]
    if strip_debug:  # the plan's debug line: stripped inside the container, before auditwheel
        args.append("--strip-debug")
    for pattern in excludes:
        args += ["--exclude", pattern]
    if torch_abi:
        args.append("--torch-abi")
    # {wheel} and {dest_dir} are cibuildwheel's placeholders: quoted by it, not by us.
    cmd = kforge + " " + " ".join(a if a.startswith("{") else shlex.quote(a) for a in args)
    return f"python -m pip install -q {shlex.quote(install)} && {cmd}" if install else cmd


def cibuildwheel_env(
    plan,
    forge_pythons: Sequence[str],
    platform_os: str,
    *,
    machine: str | None = None,
    kforge_requirement: str | None = None,
    kforge_command: str = "kforge",
    pass_jobs: bool = False,
    image_ref: str | None = None,
    image_pythons: Sequence[str] = (),
) -> dict[str, str]:
    """The ``CIBW_*`` variables that build ``plan`` (see the module docstring).

    With ``pass_jobs`` the job knobs (MAX_JOBS, NVCC_THREADS, CMAKE_BUILD_PARALLEL_LEVEL) are
    taken from the environment cibuildwheel runs in (passed into the Linux container) instead
    of being fixed in CIBW_ENVIRONMENT, so kforge's OOM retry with half the jobs reaches the build.

    ``image_ref`` is the local reference of a kforge-made image (``plan.image`` = ``kforge:<suite>``):
    its CUDA is baked in (no before-all step), it offers ``image_pythons`` only, the container gets
    the host's network (build isolation needs PyPI), and the wheel comes out unrepaired, for kforge's
    repair step to check against the plan's platform tag on the host.
    """
    project = plan.project
    mach = machine_of(plan.target.platform, machine)
    cuda = plan.toolchain.cuda
    pythons = _pythons_for_image(project.torch_abi, forge_pythons, image_pythons, image_ref)
    ids = build_identifiers(project.torch_abi, pythons, platform_os, mach)
    # Host paths never travel: the Linux container gets its own CUDA, and on Windows cibuildwheel
    # passes the host's environment (CUDA_PATH, PATH) through to the build as it is.
    knobs = tuple(dict.fromkeys((*JOB_KNOBS, *plan.jobs.thread_vars)))  # + the project's own (FLASHINFER_NVCC_THREADS)
    env = {k: v for k, v in plan.env.items() if k not in HOST_ONLY and not (pass_jobs and k in knobs)}
    out = {
        "CIBW_BUILD": " ".join(ids),
        "CIBW_ARCHS": cibw_arch(platform_os, mach),
        "CIBW_BUILD_VERBOSITY": "1",
        "CIBW_TEST_SKIP": "*",  # GPU tests run later, on a GPU host (kforge test), not in the build container
    }
    if not plan.build_isolation:
        out["CIBW_BUILD_FRONTEND"] = "pip; args: --no-build-isolation"
    before_build = []
    if not plan.build_isolation:
        before_build.append("python -m pip install " + " ".join(shlex.quote(t) for t in BUILD_TOOLS))
    if project.torch_abi and plan.toolchain.torch is not None:
        if image_ref:  # a kforge image's torch layer has it (from PyPI): this only checks the pin
            before_build.append(f"python -m pip install torch=={plan.toolchain.torch}")
        else:
            index = TORCH_INDEX.format(major=cuda.major, minor=cuda.minor)
            before_build.append(f"python -m pip install torch=={plan.toolchain.torch} --index-url {index}")
    if before_build:
        out["CIBW_BEFORE_BUILD"] = " && ".join(before_build)
    excludes = tuple(getattr(project, "repair_exclude", ()) or ())
    if platform_os == "linux":
        home = f"/usr/local/cuda-{cuda.major}.{cuda.minor}"
        inside = {**env, "CUDA_HOME": home, "CUDACXX": f"{home}/bin/nvcc"}
        if "CPLUS_INCLUDE_PATH" in plan.env:  # CUDA >= 13's CCCL for g++, at the container's toolkit
            inside["CPLUS_INCLUDE_PATH"] = f"{home}/include/cccl"
        out["CIBW_ENVIRONMENT"] = environment_string(inside, raw={"PATH": f"{home}/bin:$PATH"})
        if pass_jobs:
            out["CIBW_ENVIRONMENT_PASS_LINUX"] = " ".join(knobs)
        if image_ref:  # kforge's own image: CUDA inside, repair on the host against the platform tag
            out[f"CIBW_MANYLINUX_{mach.upper()}_IMAGE"] = image_ref
            out["CIBW_CONTAINER_ENGINE"] = "podman; create_args: --network=host"
            out["CIBW_REPAIR_WHEEL_COMMAND_LINUX"] = ""
            return out
        image = getattr(plan, "image", None) or MANYLINUX
        out[f"CIBW_MANYLINUX_{mach.upper()}_IMAGE"] = image
        if image.startswith("manylinux"):  # the official AlmaLinux images: CUDA from NVIDIA's rhel8 repo
            out["CIBW_BEFORE_ALL_LINUX"] = cuda_install_command(cuda, mach, project.torch_abi)
        out["CIBW_REPAIR_WHEEL_COMMAND_LINUX"] = repair_command(
            plan.target.id, torch_abi=project.torch_abi, excludes=excludes,
            plat=wheel_tag(plan.platform_tag, mach) if getattr(plan, "platform_tag", None) else None,
            strip_debug=bool(getattr(getattr(plan, "binary", None), "strip_debug", False)),
            install=kforge_requirement or f"kforge[repair]=={__version__}")
    else:
        # Windows wheels build on the Windows host itself: its CUDA toolkit and its kforge.
        out["CIBW_ENVIRONMENT"] = environment_string(env)
        out["CIBW_REPAIR_WHEEL_COMMAND_WINDOWS"] = repair_command(
            plan.target.id, torch_abi=project.torch_abi, excludes=excludes, install=None, kforge=kforge_command)
    return out


def _pythons_for_image(torch_abi: bool, forge_pythons: Sequence[str], image_pythons: Sequence[str],
                       image_ref: str | None) -> tuple[str, ...]:
    """forge.toml's Pythons, or, in a kforge image, the ones it has (all of it for a torch-free wheel)."""
    if not image_ref:
        return tuple(forge_pythons)
    if not image_pythons:
        raise BuildError(f"the image {image_ref} declares no Python (label kforge.python)",
                         fix="rebuild it with `kforge image build`")
    if not torch_abi:
        return tuple(image_pythons)  # one py3 wheel: whichever Python the image has builds it
    both = tuple(v for v in forge_pythons if v in image_pythons)
    if not both:
        raise BuildError(f"the image {image_ref} has Python {', '.join(image_pythons)}, and forge.toml asks for "
                         f"{', '.join(forge_pythons)}", why="a torch-ABI wheel is built once per Python",
                         fix="use an image with one of those Pythons (e.g. the official manylinux_2_28 image)")
    return both


Runner = Callable[..., subprocess.CompletedProcess]


def container_engine(env: Mapping[str, str], *, run: Runner = subprocess.run) -> tuple[str | None, str]:
    """The first container engine whose ``info`` works: (name, "") or (None, why none does).

    ``CIBW_CONTAINER_ENGINE`` in the env limits the choice to that engine.
    """
    configured = env.get("CIBW_CONTAINER_ENGINE", "").split(";")[0].strip()
    problems = []
    for engine in ((configured,) if configured else ("docker", "podman")):
        exe = which(engine, env)
        if not exe:
            problems.append(f"{engine} is not installed")
            continue
        try:
            proc = run([exe, "info"], capture_output=True, text=True, timeout=60, env=dict(env))
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"`{engine} info` did not answer ({exc})")
            continue
        if proc.returncode == 0:
            return engine, ""
        last = (proc.stderr or proc.stdout or "").strip().splitlines()
        problems.append(f"`{engine} info` failed with exit code {proc.returncode}" + (f": {last[-1]}" if last else ""))
    return None, "; ".join(problems)


class CibuildwheelBackend:
    name = "cibuildwheel"

    def __init__(self, *, host_os: str | None = None, run: Runner = subprocess.run) -> None:
        self._host_os = host_os
        self._run = run

    def host_os(self) -> str:
        raw = self._host_os or sys.platform
        return "windows" if raw.startswith("win") else "linux" if raw.startswith("linux") else raw

    def preflight(self, request: BuildRequest) -> dict[str, str]:
        """Check that cibuildwheel can run here (fail fast otherwise); return extra env it needs."""
        os_name = request.plan.platform_os
        fix = f"use --backend native to build {request.plan.id} on this machine"
        if importlib.util.find_spec("cibuildwheel") is None:
            raise ToolchainError("cibuildwheel is not installed in kforge's environment",
                                 fix=f"pip install cibuildwheel, or {fix}")
        if os_name == "windows" and self.host_os() != "windows":
            raise BuildError(f"cibuildwheel builds Windows wheels only on Windows, and this host is {self.host_os()}",
                             fix=f"run it on a Windows machine, or {fix}")
        if os_name == "linux" and is_kforge_image(request.plan.image or ""):
            env = podman_env(Path(request.work_dir).parent / "podman", request.env)
            engine, why = container_engine({**env, "CIBW_CONTAINER_ENGINE": "podman"}, run=self._run)
            if engine is None:
                raise BuildError(f"kforge's build image {request.plan.image} runs on podman, and podman does not work here",
                                 why=why, fix="apt-get install podman runc debootstrap, or build with --backend native")
            return {"CONTAINERS_CONF": env["CONTAINERS_CONF"]}
        if os_name == "linux":
            engine, why = container_engine(request.env, run=self._run)
            if engine is None:
                raise BuildError("cibuildwheel needs a working container engine for Linux wheels, and none works here",
                                 why=why, fix=f"start docker or podman, or {fix}")
            return {"CIBW_CONTAINER_ENGINE": request.env.get("CIBW_CONTAINER_ENGINE") or engine}
        return {}

    def command(self, request: BuildRequest, out_dir: Path) -> list[str]:
        return [sys.executable, "-m", "cibuildwheel", "--platform", request.plan.platform_os,
                "--output-dir", str(out_dir), str(request.tree)]

    def build(self, request: BuildRequest) -> BuildResult:
        plan = request.plan
        extra = self.preflight(request)
        work = Path(request.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        stage = work / "wheelhouse"
        stage.mkdir(exist_ok=True)
        image_ref, pythons = None, ()
        if plan.platform_os == "linux" and is_kforge_image(plan.image or ""):
            env = {**request.env, **extra}
            torch = str(plan.toolchain.torch) if plan.project.torch_abi and plan.toolchain.torch is not None else None
            image_ref = ensure_image(plan.image, str(plan.toolchain.cuda), cache_dir(env), env, run=self._run,
                                     torch=torch, python=plan.toolchain.python if torch else None,
                                     log=lambda line: print(f"  {line}", flush=True))
            pythons = image_pythons(image_ref, env, run=self._run)
        generated = cibuildwheel_env(
            plan, request.forge_pythons, plan.platform_os, image_ref=image_ref, image_pythons=pythons,
            kforge_requirement=request.env.get("KFORGE_CIBW_REQUIREMENT"),
            kforge_command=f'"{sys.executable}" -m kforge.cli' if plan.platform_os == "windows" else "kforge",
            pass_jobs=True,
        )
        env = {**request.env, **generated, **extra}
        log_path = work / "build.log"
        with BuildLog(log_path) as log, LiveProgress(f"building {plan.id}", enabled=request.progress, expected=expected_seconds(plan)) as live:
            outcome = run_step(self.command(request, stage), env=env, choice=plan.jobs, log=log,
                               label=f"cibuildwheel of {plan.id}", work_dir=work, cwd=Path(request.tree), live=live)
        wheels = sorted(stage.glob("*.whl"))
        expected = len(env["CIBW_BUILD"].split())
        if len(wheels) != expected:
            raise BuildError(
                f"cibuildwheel of {plan.id} left {len(wheels)} wheels, expected {expected} ({env['CIBW_BUILD']})",
                why="found: " + (", ".join(w.name for w in wheels) or "nothing"),
                fix=f"read the build log {log_path}",
            )
        placed = tuple(place(w, Path(request.out_dir)) for w in wheels)
        return BuildResult(
            artifact=placed[0],
            kind="wheel",
            seconds=outcome.seconds,
            peak_rss=outcome.peak_rss,  # the cibuildwheel process tree on the host; the container's is not visible
            ninja_logs=(),  # the build dirs live inside the container
            log=log_path,
            retried_with_jobs=outcome.retried_with_jobs,
            artifacts=placed,
            repaired=image_ref is None,  # kforge images: the host repairs, against the plan's platform tag
        )

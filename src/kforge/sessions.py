"""Register nox sessions from forge.toml's matrix.

``noxfile.py`` calls :func:`register` and nothing else. For every target of the matrix there is a
``build-<target>`` and a ``test-<target>`` session, for every project a ``build-<project>`` (the host
GPU's arch, or the project's default without a GPU), a ``patch-<project>`` and, where forge.toml declares a
release matrix, a ``release-<project>``, plus ``tests`` and ``lint``. Where uv is present the sessions'
venvs are uv's (seeded with pip, which builds run); ``tests`` keeps venv + pip, whose configuration brings the
machine's CPU torch. Session bodies are a few lines that call the ``kforge`` command.

This module is imported by nox before kforge is installed anywhere, so it (and what it imports at the
top) sticks to the standard library, ``packaging`` and ``nox`` itself.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

PYPI_CPU_TORCH = "torch==2.13.0"  # the CPU build CI machines take from local disk; never unpinned


def uv_present() -> bool:
    """uv on PATH or installed as a package (where nox looks for it too)."""
    return shutil.which("uv") is not None or importlib.util.find_spec("uv") is not None


def _has_venv(session: Any) -> bool:
    return getattr(session, "venv_backend", "none") != "none" and session.virtualenv.is_sandboxed


def install_kforge(session: Any, root: Path, *extras: str) -> None:
    """Install kforge into the session's venv; with ``--no-venv`` use what the interpreter already has."""
    if not _has_venv(session):
        session.log("no venv (--no-venv): using the kforge and packages this interpreter already has")
        session.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), session.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))]))
        return
    spec = f"{root}[{','.join(extras)}]" if extras else str(root)
    session.install("-e", spec)


def _has_torch(session: Any) -> bool:
    out = session.run("python", "-c", "import importlib.util as u; print(u.find_spec('torch') is not None)",
                      silent=True, external=True)
    return str(out).strip().endswith("True")


def _add(nox: Any, name: str, func: Callable[[Any], None], doc: str, tags: list[str], **kw: Any) -> None:
    func.__doc__ = doc
    func.__name__ = name.replace("-", "_")
    nox.session(name=name, tags=tags, **kw)(func)


def register(nox: Any, root: Path) -> None:
    """Create every session. ``nox`` is the imported nox module, ``root`` the monorepo root.

    A forge.toml that kforge can't read (a typo, a stray byte) must not turn every nox command into a
    traceback: the error is printed as one paragraph (file, key path, what to do), the sessions that
    don't come from forge.toml (``tests``, ``lint``) are still registered, and the message says which
    sessions can't be listed until forge.toml is fixed.
    """
    from kforge.errors import KforgeError

    venv_params = ["--system-site-packages"]  # reuse the machine's torch (the GPU host's, or none)
    if uv_present():
        # uv venvs have no pip unless seeded, and the native backend runs `python -m pip wheel`
        venv_params = [*venv_params, "--seed"]
        nox.options.default_venv_backend = "uv"
    try:
        _register_matrix(nox, root, venv_params)
    except KforgeError as exc:
        if os.environ.get("KFORGE_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off"):
            traceback.print_exception(exc)
        print(f"kforge: {exc.kind} error: {exc.render()}\n"
              "kforge: the build-, test- and patch- sessions come from forge.toml and can't be listed until it is "
              "fixed; only tests and lint are registered.", file=sys.stderr)
    _register_fixed(nox, root, venv_params)


def _register_matrix(nox: Any, root: Path, venv_params: list[str]) -> None:
    """The sessions forge.toml's matrix defines: build-/test-<target>, build-<project>, patch-<project>."""
    from kforge.build.host import platform_name
    from kforge.config.forge import load_forge
    from kforge.config.targets import expand_matrix

    forge = load_forge(root)
    host = platform_name()
    kforge_cmd = ("python", "-m", "kforge.cli")
    sessions: list[tuple[str, Callable[[Any], None], str, list[str], dict[str, Any]]] = []

    def add(name: str, func: Callable[[Any], None], doc: str, tags: list[str], **kw: Any) -> None:
        sessions.append((name, func, doc, tags, kw))  # registered only when the whole matrix resolved

    for target in expand_matrix(forge, host):
        project = forge.projects[target.project]
        tags = [target.project, target.arch_token, target.platform, "build"]
        runs_here = target.platform == host
        where = "" if runs_here else f" (needs a {target.platform} host)"

        def build(session: Any, _t: str = target.id) -> None:
            install_kforge(session, root)
            session.run(*kforge_cmd, "build", _t, *session.posargs, external=True)

        add(f"build-{target.id}", build,
            f"{project.name} {target.arch_names} {target.platform}: plan, source, patches, build, repair, doctor, publish{where}",
            tags, venv_params=venv_params)

        def test(session: Any, _t: str = target.id) -> None:
            install_kforge(session, root)
            session.run(*kforge_cmd, "test", _t, *session.posargs, external=True)

        add(f"test-{target.id}", test,
            f"{project.name} {target.arch_names}: install the wheel from the wheelhouse index and run its GPU tests",
            [target.project, target.arch_token, target.platform, "test"], venv_params=venv_params)

    for project in forge.projects.values():
        if host in project.platforms:
            def build_host(session: Any, _p: str = project.name) -> None:
                install_kforge(session, root)
                session.run(*kforge_cmd, "build", _p, *session.posargs, external=True)

            add(f"build-{project.name}", build_host,
                f"{project.name} for this machine's GPU arch ({project.default_arch.sm} without a GPU)",
                [project.name, "build"], venv_params=venv_params)

        if project.release is not None and host in project.platforms:
            def release(session: Any, _p: str = project.name) -> None:
                install_kforge(session, root)
                session.run(*kforge_cmd, "release", _p, *session.posargs, external=True)

            add(f"release-{project.name}", release,
                f"{project.name}: build its release matrix ({', '.join(e.name for e in project.release.archs)} x "
                f"{len(project.release.variants)} variant{'s' if len(project.release.variants) > 1 else ''}, less excludes) "
                "into one index; skips what is published",
                [project.name, "release"], venv_params=venv_params)

        if project.patches is not None:
            def patch(session: Any, _p: str = project.name) -> None:
                install_kforge(session, root)
                session.run(*kforge_cmd, "patches", "status", _p, *session.posargs, external=True)

            add(f"patch-{project.name}", patch,
                f"{project.name}: does our patch series apply to the pinned upstream? (per-patch status)",
                [project.name, "patch"], venv_params=venv_params)

    for name, func, doc, tags, kw in sessions:
        _add(nox, name, func, doc, tags, **kw)


def _register_fixed(nox: Any, root: Path, venv_params: list[str]) -> None:
    """``tests`` and ``lint``: they exist whatever forge.toml says."""
    kforge_cmd = ("python", "-m", "kforge.cli")

    def tests(session: Any) -> None:
        install_kforge(session, root, "test")
        if not _has_torch(session):
            session.install(PYPI_CPU_TORCH)
        # The README's main job, through the whole chain, into a wheelhouse the tests then inspect;
        # its wheel is installed with real pip from the generated index, as a user would.
        wheelhouse = root / ".kforge" / "test-wheelhouse"
        session.run(*kforge_cmd, "build", "fmha-sm90", "--wheelhouse", str(wheelhouse), "--replace", external=True)
        session.run("python", "-m", "pip", "install", "--force-reinstall", "--no-deps",
                    "--index-url", (wheelhouse / "simple").as_uri(), "kforge-fmha", external=True)
        session.run("python", "-m", "pytest", "tests", "kernels/fmha/tests", *session.posargs,
                    env={"KFORGE_TEST_WHEELHOUSE": str(wheelhouse)}, external=True)

    # venv + pip, not uv: the CPU torch comes through the machine's pip configuration (find-links), which uv
    # does not read, and the session runs pip itself
    _add(nox, "tests", tests, "the test suite: unit, integration (real nvcc), GPU tests skip without a GPU", ["tests"],
        venv_params=[p for p in venv_params if p != "--seed"], venv_backend="venv")

    def lint(session: Any) -> None:
        if _has_venv(session):
            session.install("ruff")
        session.run("ruff", "check", "src", "tests", "noxfile.py", "tasks.py", "benchmarks", "scripts", external=True)

    _add(nox, "lint", lint, "ruff over kforge, its tests and entry points", ["lint"])

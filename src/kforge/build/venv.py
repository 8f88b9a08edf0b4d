"""Provision a variant's build environment with uv: a cached venv of the variant's Python holding its torch.

``uv venv --python 3.N`` makes the environment, ``python -m ensurepip`` gives it pip (the native backend runs
``pip wheel``; ensurepip is offline), and ``uv pip install torch==X <build_requires>`` fills it, from the
configured index (``{cuda}`` in it becomes the variant's ``cu130``) or, offline, from a ``--find-links``
folder. Environments live in the kforge cache under ``envs/<variant id>-<key>`` (the key hashes what went
in) and are reused. An environment is complete only once its marker file ``kforge-env.json`` is written,
last; one without it (an interrupted provisioning) is removed and made again. Failures are
:class:`~kforge.errors.ToolchainError` saying what to install.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from kforge.config.variant import Provisioning, Variant, env_dir
from kforge.errors import ToolchainError
from kforge.fsutil import atomic_write_text

Runner = Callable[..., subprocess.CompletedProcess]
MARKER = "kforge-env.json"


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, env=dict(env) if env is not None else None,
                          timeout=timeout, check=False)


@dataclass(frozen=True)
class BuildEnv:
    path: Path  # the environment's root
    python: Path  # its interpreter: the build runs with it
    variant: Variant
    requirements: tuple[str, ...]
    reused: bool  # found complete in the cache


def find_uv(environ: Mapping[str, str], *, which: Callable[..., str | None] = shutil.which) -> str:
    """uv on PATH, else next to this interpreter (``pip install uv`` puts it there); an error says how to get it."""
    found = which("uv", path=environ.get("PATH", ""))
    if found:
        return found
    beside = Path(sys.executable).parent / ("uv.exe" if os.name == "nt" else "uv")
    if beside.is_file():
        return str(beside)
    raise ToolchainError("uv is not installed, and this build needs a variant environment made with it",
                         fix="pip install uv (kforge's dev and test extras include it), or build the host's variant "
                             "(drop --torch/--python)")


def env_key(variant: Variant, requirements: Sequence[str], index_url: str | None, find_links: str | None) -> str:
    """What went into an environment, hashed: another torch, index or wheel folder is another environment."""
    data = {"variant": variant.id, "python": variant.python, "requirements": list(requirements),
            "index_url": index_url, "find_links": str(Path(find_links).resolve()) if find_links else None}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def python_request(version: str) -> str:
    """What ``uv venv --python`` gets: this interpreter when it is that version (no search), else ``3.N``."""
    return sys.executable if f"{sys.version_info.major}.{sys.version_info.minor}" == version else version


def _interpreter(path: Path) -> Path:
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def provision_env(prov: Provisioning, cache_dir: Path, *, index_url: str | None = None, find_links: str | None = None,
                  environ: Mapping[str, str] | None = None, runner: Runner = _run, uv: str | None = None,
                  say: Callable[[str], None] = lambda _: None) -> BuildEnv:
    """The variant's environment: reused when complete in the cache, else made (under a lock)."""
    environ = os.environ if environ is None else environ
    variant, reqs = prov.variant, prov.requirements
    if index_url:
        index_url = index_url.replace("{cuda}", variant.cuda_tag)  # one template for every CUDA of a release
    key = env_key(variant, reqs, index_url, find_links)
    dest = env_dir(cache_dir, variant, key)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if (dest / MARKER).is_file() and _interpreter(dest).exists():
            return BuildEnv(dest, _interpreter(dest), variant, reqs, reused=True)
        if dest.exists():  # an interrupted provisioning: never use it
            shutil.rmtree(dest)
        uv = uv or find_uv(environ)
        try:
            _make(uv, dest, variant, reqs, index_url, find_links, environ, runner, say)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        atomic_write_text(dest / MARKER, json.dumps({"variant": variant.id, "requirements": list(reqs),
                                                     "index_url": index_url, "find_links": find_links}, indent=2) + "\n")
    return BuildEnv(dest, _interpreter(dest), variant, reqs, reused=False)


def _make(uv: str, dest: Path, variant: Variant, reqs: tuple[str, ...], index_url: str | None, find_links: str | None,
          environ: Mapping[str, str], runner: Runner, say: Callable[[str], None]) -> None:
    env = {k: v for k, v in environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    offline = ["--offline"] if find_links else []
    say(f"provisioning {variant.id}: uv venv --python {variant.python} {dest}")
    out = runner([uv, "venv", "--quiet", *offline, "--python", python_request(variant.python), str(dest)], env=env)
    if out.returncode != 0:
        raise ToolchainError(
            f"uv could not make a Python {variant.python} environment for {variant.id}",
            why=_tail(out),
            fix=f"install Python {variant.python} (uv python install {variant.python}, or your system's python"
                f"{variant.python}), or pick a Python that is here with --python")
    python = _interpreter(dest)
    out = runner([str(python), "-m", "ensurepip", "--default-pip"], env=env)
    if out.returncode != 0:
        raise ToolchainError(f"the Python {variant.python} of {variant.id} has no ensurepip, and the build runs pip",
                             why=_tail(out), fix=f"install a full Python {variant.python} (Debian: python{variant.python}-venv)")
    if not reqs:
        return
    # --no-index with a folder: uv must not prefer a registry wheel its cache already knows (which fails offline)
    where = ["--no-index", "--find-links", str(find_links)] if find_links else (["--index-url", index_url] if index_url else [])
    source = f"the folder {find_links} (offline)" if find_links else (index_url or "uv's default index (PyPI)")
    say(f"provisioning {variant.id}: uv pip install {' '.join(reqs)} from {source}")
    out = runner([uv, "pip", "install", "--quiet", *offline, "--python", str(python), *where, *reqs], env=env)
    if out.returncode != 0:
        raise ToolchainError(
            f"uv could not install {' '.join(reqs)} for {variant.id} from {source}",
            why=_tail(out),
            fix=("put those wheels (for Python " + variant.python + ") into " + str(find_links)) if find_links else
                "check the version exists for this Python and platform, or pass --index-url (e.g. "
                "https://download.pytorch.org/whl/" + variant.cuda_tag + ") or --find-links DIR")


def _tail(out: subprocess.CompletedProcess) -> str:
    return ((out.stderr or "") + (out.stdout or "")).strip()[-800:] or f"exit code {out.returncode}"

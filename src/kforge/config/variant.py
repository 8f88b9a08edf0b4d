"""Build variants: the (CUDA, torch, Python) a wheel is built for, the C++ ABI that follows, and the one id rule.

A build is target x variant. The variant id is readable and stable: ``cu130-torch2.11-cp312``; a torch-free
project (``torch_abi = false``) drops the torch part (``cu130-cp312``). The same id names the variant's
build environment in the kforge cache, the per-variant wheelhouse folders, the release manifest and CI job
names. A wheel's local version label is kforge.config.wheelname's (``cu130torch2.11`` for torch-ABI wheels, then
the arch part unless the build is the project's ``release`` arch set); :func:`wheel_label` spells the variant
part the same way, and the Python needs no part (it is in the wheel's tag).

:func:`provisioning` says, for each part, whether the host has it or how kforge will provision it. It is
pure: the host's facts are passed in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kforge.errors import ConfigError

#: PyTorch's PyPI wheels use the C++11 ABI from 2.7 on (older ones were built with the pre-C++11 ABI).
CXX11_ABI_FROM = Version("2.7")
#: The lowest CUDA whose nvcc is on PyPI (nvidia-cuda-nvcc); older CUDA comes from the system's installs.
PYPI_NVCC_FROM = Version("13.0")

_PYTHON = re.compile(r"^3\.(\d+)$")
_ID = re.compile(r"^cu(\d+)(\d)(?:-torch(\d+)\.(\d+))?-cp3(\d+)$")


@dataclass(frozen=True, order=True)
class Variant:
    """One toolchain variant. ``torch`` is None for torch-free projects."""

    cuda: Version  # major.minor
    python: str  # "3.12"
    torch: Version | None = None  # as asked (2.9.1, or 2.11 for "the newest 2.11.x")

    @property
    def cuda_tag(self) -> str:
        """``cu130``: the per-CUDA index folder (``wheelhouse/cu130/simple``)."""
        return f"cu{self.cuda.major}{self.cuda.minor}"

    @property
    def python_tag(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def torch_short(self) -> str | None:
        return f"{self.torch.major}.{self.torch.minor}" if self.torch is not None else None

    @property
    def id(self) -> str:
        """``cu130-torch2.11-cp312`` (torch-free: ``cu130-cp312``)."""
        parts = [self.cuda_tag]
        if self.torch is not None:
            parts.append(f"torch{self.torch_short}")
        parts.append(self.python_tag)
        return "-".join(parts)

    @property
    def cxx11_abi(self) -> bool | None:
        """The C++ ABI the build follows: torch's (True from torch 2.7 on); None without torch."""
        if self.torch is None:
            return None
        return self.torch >= CXX11_ABI_FROM

    @property
    def torch_requirement(self) -> str | None:
        """``torch==2.9.1``, or ``torch==2.11.*`` when only major.minor was asked for."""
        if self.torch is None:
            return None
        return f"torch=={self.torch}" if len(self.torch.release) > 2 else f"torch=={self.torch_short}.*"

    def __str__(self) -> str:
        return self.id


def wheel_label(variant: Variant) -> str | None:
    """The wheel's local version label part for the variant: ``cu130torch2.11`` (FA2's convention).

    Torch-free wheels get none. The Python needs no part: it is in the wheel's tag. kforge.config.wheelname makes a
    build's whole label: this part (it spells it the same), then the arch part unless the build is the
    project's ``release`` arch set.
    """
    if variant.torch is None:
        return None
    return f"{variant.cuda_tag}torch{variant.torch_short}"


def parse_python(text: str, where: str) -> str:
    """``3.12`` (also ``cp312``, ``312``); anything else is a ConfigError naming ``where``."""
    raw = text.strip().lower().removeprefix("cp")
    if raw.isdigit() and raw.startswith("3") and len(raw) >= 2:
        raw = f"3.{raw[1:]}"
    if not _PYTHON.match(raw):
        raise ConfigError(f"{where}={text!r} is not a Python version", fix="write it as 3.N, e.g. 3.12")
    return raw


def parse_version(text: str, where: str, what: str) -> Version:
    try:
        v = Version(text.strip())
    except InvalidVersion:
        raise ConfigError(f"{where}={text!r} is not a {what} version", fix="write it as MAJOR.MINOR, e.g. 2.11") from None
    if len(v.release) < 2 or v.local or v.pre or v.dev:
        raise ConfigError(f"{where}={text!r} is not a {what} release", fix="write it as MAJOR.MINOR[.PATCH], e.g. 2.9.1")
    return v


def parse_variant_id(text: str) -> Variant:
    """The inverse of :attr:`Variant.id` (``cu130-torch2.11-cp312`` -> Variant)."""
    m = _ID.match(text.strip())
    if not m:
        raise ConfigError(f"'{text}' is not a variant id", fix="write it as cu130-torch2.11-cp312 (or cu130-cp312)")
    cuda = Version(f"{m.group(1)}.{m.group(2)}")
    torch = Version(f"{m.group(3)}.{m.group(4)}") if m.group(3) else None
    return Variant(cuda=cuda, python=f"3.{m.group(5)}", torch=torch)


# ---------------------------------------------------------------------------------------------- provisioning


@dataclass(frozen=True)
class Part:
    """One part of a variant: what is asked for, and whether it is present or how it will be provisioned."""

    name: str  # cuda | python | torch | cxx11_abi
    want: str | None  # None: not needed
    present: bool
    how: str  # one line: "present: ...", "provision: ...", "not needed", "follows torch"


@dataclass(frozen=True)
class Provisioning:
    """How the variant's build environment comes about. ``env_needed``: kforge makes a uv environment."""

    variant: Variant
    parts: tuple[Part, ...]
    env_needed: bool  # a uv environment (Python and/or torch) is made in the kforge cache
    requirements: tuple[str, ...] = ()  # what goes into that environment (torch==..., the project's build_requires)

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def to_dict(self) -> dict[str, object]:
        return {"variant": self.variant.id, "env_needed": self.env_needed, "requirements": list(self.requirements),
                **{p.name: {"want": p.want, "present": p.present, "how": p.how} for p in self.parts}}


def provisioning(variant: Variant, *, torch_abi: bool, build_isolation: bool, host_python: str,
                 host_torch: Version | None, cuda_how: str, cuda_present: bool,
                 build_requires: tuple[str, ...] = (), container: str | None = None) -> Provisioning:
    """Decide, per part, present or provisioned. ``cuda_how`` comes from the plan's toolchain decision.

    ``container`` (a cibuildwheel build of Linux wheels: the image) means the build runs in that container,
    with the container's Python and torch: nothing is provisioned on this host.
    """
    if container is not None:
        where = (f"in the build container ({container}: the host's CPython carried in, torch from PyPI)"
                 if container.startswith("kforge") else f"in the build container ({container})")
        parts = [Part("cuda", str(variant.cuda), True, f"{where.replace('the host', 'nvcc from PyPI; the host')}"),
                 Part("python", variant.python, True, where)]
        if variant.torch is None:
            parts += [Part("torch", None, True, "not needed (torch-free wheel)"),
                      Part("cxx11_abi", None, True, "not needed (no torch ABI)")]
        else:
            parts += [Part("torch", str(variant.torch), True, where),
                      Part("cxx11_abi", str(variant.cxx11_abi), True,
                           f"follows torch: {'C++11' if variant.cxx11_abi else 'pre-C++11'} ABI")]
        return Provisioning(variant=variant, parts=tuple(parts), env_needed=False, requirements=())
    parts = [Part("cuda", str(variant.cuda), cuda_present, cuda_how)]
    python_present = variant.python == host_python
    parts.append(Part("python", variant.python, python_present,
                      "present: this interpreter" if python_present
                      else f"provision: `uv venv --python {variant.python}` in the kforge cache (uv finds or downloads it)"))
    torch_in_env = torch_abi and not build_isolation  # the build imports the environment's torch
    if variant.torch is None:
        parts.append(Part("torch", None, True, "not needed (torch-free wheel)"))
        parts.append(Part("cxx11_abi", None, True, "not needed (no torch ABI)"))
    else:
        has = host_torch is not None and python_present and _same_torch(variant.torch, host_torch)
        how = (f"present: torch {host_torch} in this interpreter" if has
               else f"provision: `uv pip install {variant.torch_requirement}` into the variant's environment")
        parts.append(Part("torch", str(variant.torch), has, how))
        parts.append(Part("cxx11_abi", str(variant.cxx11_abi), True,
                          f"follows torch: {'C++11' if variant.cxx11_abi else 'pre-C++11'} ABI "
                          f"(PyPI torch uses the C++11 ABI from {CXX11_ABI_FROM})"))
    needs_torch = torch_in_env and not parts[2].present
    env_needed = (not python_present) or needs_torch
    reqs: tuple[str, ...] = ()
    if env_needed:
        reqs = tuple(([variant.torch_requirement] if torch_in_env and variant.torch_requirement else [])
                     + list(build_requires))
    return Provisioning(variant=variant, parts=tuple(parts), env_needed=env_needed, requirements=reqs)


def _same_torch(want: Version, have: Version) -> bool:
    have_public = Version(have.public)
    if len(want.release) > 2:
        return have_public.release[:3] == want.release[:3]
    return have_public.release[:2] == want.release[:2]


def env_dir(cache_dir: Path, variant: Variant, key: str) -> Path:
    """Where the variant's environment lives: ``<cache>/envs/<variant id>-<key[:12]>``."""
    return Path(cache_dir) / "envs" / f"{variant.id}-{key[:12]}"

"""The wheel naming rule: a local version label that keeps builds of different CUDA, torch and archs apart.

Two builds that differ in what they contain never produce the same wheel file name, so one never
replaces the other in the wheelhouse or in pip's cache. The label (PEP 440 local version, after
``+``) is made of dot-separated parts:

* ``cu130torch2.11`` for a project built against torch's C++ ABI (``torch_abi = true``), the
  flash-attention convention: CUDA major+minor and torch major.minor the wheel needs at run time;
* one ``sm<number>[a|f]`` part per arch the build compiles (``sm80.sm120``), *unless* the build
  compiles exactly the project's default release set (``arch_sets.release`` in forge.toml), which
  gets no arch part: the release wheel has the plain name users expect.

Examples: ``kforge_fmha-0.1.0+sm90a-...whl`` (fmha-sm90), ``kforge_fmha-0.1.0-...whl`` (fmha-release),
``flash_attn-2.8.3.post2+cu130torch2.11.sm80.sm120-...whl`` (flash-attn-sm80+sm120-windows),
``flash_attn-2.8.3.post2+cu130torch2.11-...whl`` (flash-attn-release). A version that already has a
local part keeps it in front (FlashMLA's ``1.0.0+<sha>`` becomes ``1.0.0+<sha>.sm100f.sm120a``).
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import Version

from kforge.config.model import Project
from kforge.cuda.arch import Arch


def arch_label(archs: Sequence[Arch]) -> str:
    """``sm80.sm120a``: one local-version part per arch, in arch order."""
    return ".".join(f"sm{a.suffixed}" for a in sorted(a.with_ptx(False) for a in archs))


def is_release_set(project: Project, archs: Sequence[Arch]) -> bool:
    """Whether ``archs`` is exactly the project's default release set (``arch_sets.release``)."""
    release = project.release_set
    return release is not None and sorted(a.with_ptx(False) for a in archs) == sorted(release)


def local_version_label(project: Project, archs: Sequence[Arch], cuda: Version, torch: Version | None) -> str | None:
    """The local version label a build of ``archs`` gets (None: the plain upstream version)."""
    parts: list[str] = []
    if project.torch_abi:
        parts.append(f"cu{cuda.major}{cuda.minor}" + (f"torch{torch.major}.{torch.minor}" if torch is not None else ""))
    if not is_release_set(project, archs):
        parts.append(arch_label(archs))
    return ".".join(parts) or None

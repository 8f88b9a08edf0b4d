"""What a wheel's binaries carry besides SASS: PTX (which archs) and host debug info (kept or stripped).

Per project in forge.toml: ``ptx = "upstream" | "highest" | "none" | "all"`` (default ``upstream``: what
upstream's own build ships, recorded as ``upstream_ptx`` from its build scripts) and ``strip_debug`` (default
true). Per build: ``--ptx`` / ``KFORGE_PTX`` and ``--keep-debug`` / ``KFORGE_STRIP_DEBUG`` (kforge.config.options).
:func:`binary_policy` resolves them into one frozen :class:`BinaryPolicy`, which the plan prints and carries:
the plan's ``-gencode`` flags (and the arch knobs that can say PTX) are rendered with :attr:`BinaryPolicy.render_ptx`,
kforge's nvcc wrapper enforces those flags, the repair step strips (kforge.wheels.debuginfo), and the doctor's
exact mode holds the binaries to both.

Why strip by default: a wheel is for other people's machines, and host DWARF (mostly of torch's and the standard
library's headers: causal-conv1d's ``.so`` had ``.debug_str`` 6.0 MB + ``.debug_info`` 3.4 MB) serves nobody who
installs it, while it counts against PyPI's file limit and every download. ``strip --strip-debug`` keeps the
symbol table (backtraces still name functions) and never touches device code (the fatbin is a data section).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kforge.config.model import Project
from kforge.cuda.arch import Arch
from kforge.cuda.render import PtxPolicy

#: kforge.cuda.render's ``ptx=`` for each resolved policy.
RENDER_PTX: dict[str, PtxPolicy] = {"none": False, "highest": "last", "all": True}
#: What each resolved policy means, for the plan.
MEANS = {"none": "SASS only", "highest": "PTX of the highest arch", "all": "PTX of every arch"}
#: When a project records no upstream_ptx: what every kforge build did before the policy existed.
FALLBACK = "highest"


@dataclass(frozen=True)
class BinaryPolicy:
    """The resolved PTX policy and debug-info policy of one build."""

    ptx: str  # none | highest | all (never "upstream": resolved)
    ptx_from: str  # "upstream_ptx" (upstream's, recorded), "ptx" (forge.toml), "option" (--ptx), "default" (none recorded)
    upstream_ptx: str | None  # the project's upstream_ptx (what upstream's own build ships), if recorded
    strip_debug: bool  # the repair step strips .debug_* from the wheel's own ELF binaries (and the doctor checks it)
    strip_from: str  # "forge.toml strip_debug", "--keep-debug / KFORGE_STRIP_DEBUG", or why it does not apply

    @property
    def render_ptx(self) -> PtxPolicy:
        """The ``ptx=`` of kforge.cuda.render's gencode, torch and cmake renderers."""
        return RENDER_PTX[self.ptx]

    def ptx_line(self, archs: Sequence[Arch]) -> str:
        """``none (upstream's: SASS only)``: the plan's ``ptx`` line."""
        upstream = f"; upstream's: {MEANS[self.upstream_ptx]}" if self.upstream_ptx else ""
        why = {"upstream_ptx": upstream.removeprefix("; "),
               "default": f"upstream's is not recorded (no upstream_ptx in forge.toml): kforge's default, {MEANS[self.ptx]}",
               "ptx": f"forge.toml ptx = \"{self.ptx}\"{upstream}",
               "option": f"--ptx / KFORGE_PTX{upstream}"}[self.ptx_from]
        carrying = list(archs) if self.ptx == "all" else (
            [max(archs, key=lambda a: (a.major, a.minor, a.variant))] if self.ptx == "highest" and archs else [])
        dead = [a for a in carrying if a.variant == "a"]
        if not dead:
            return f"{self.ptx} ({why})"
        # arch-specific PTX JIT-compiles only for its own compute capability, where its SASS already runs
        return (f"{self.ptx} ({why}); {', '.join(a.compute for a in dead)} PTX runs only where "
                f"{', '.join(a.sm for a in dead)} SASS already does: it adds size, not reach")

    def debug_line(self) -> str:
        """``stripped (...)`` or ``kept (...)``: the plan's ``debug`` line."""
        if self.strip_debug:
            return (f"stripped ({self.strip_from}): strip --strip-debug before repair; the doctor checks that no "
                    ".debug_* section is left")
        return f"kept ({self.strip_from})"

    def lines(self, archs: Sequence[Arch]) -> list[str]:
        return [f"  ptx         {self.ptx_line(archs)}", f"  debug       {self.debug_line()}"]

    def to_dict(self) -> dict[str, Any]:
        return {"ptx": self.ptx, "ptx_from": self.ptx_from, "upstream_ptx": self.upstream_ptx,
                "strip_debug": self.strip_debug, "strip_from": self.strip_from}


def binary_policy(project: Project, *, ptx: str | None = None, strip_debug: bool | None = None,
                  platform_os: str = "linux", backend: str = "native") -> BinaryPolicy:
    """The policy of one build of ``project``: ``ptx`` / ``strip_debug`` are the build options (None: forge.toml's).

    Stripping applies where kforge repairs a Linux wheel: not to Windows wheels (MSVC writes no DWARF sections into
    a .pyd) nor to the cmake backend's library archive (packed as installed, never repaired)."""
    asked = ptx or project.ptx
    if asked != "upstream":
        resolved, source = asked, ("option" if ptx else "ptx")
    elif project.upstream_ptx:
        resolved, source = project.upstream_ptx, "upstream_ptx"
    else:
        resolved, source = FALLBACK, "default"
    strip = project.strip_debug if strip_debug is None else strip_debug
    strip_from = "forge.toml strip_debug" if strip_debug is None else "--keep-debug / KFORGE_STRIP_DEBUG"
    if strip and platform_os != "linux":
        strip, strip_from = False, f"nothing to strip: a {platform_os} binary holds no DWARF .debug_* sections"
    elif strip and backend == "cmake":
        strip, strip_from = False, "the cmake backend packs the library as installed; it is never repaired"
    return BinaryPolicy(ptx=resolved, ptx_from=source, upstream_ptx=project.upstream_ptx, strip_debug=strip,
                        strip_from=strip_from)

"""Does a build profile switch off kernels the target's archs need? A profile's env is applied before the arch knobs,
and a ``disable-flags`` knob writes only the families a build has no arch of: a profile that sets one of those
variables itself (FlashMLA's ``sm120-port`` profile sets ``FLASH_MLA_DISABLE_SM100=1``) removes a family the target
asked for, and the wheel lacks that arch's kernels (the doctor then refuses it, after the whole build).
:func:`profile_conflict` says so before anything builds; :mod:`kforge.plan` refuses such a plan and the matrix
(:mod:`kforge.verified.matrix`) marks the cell."""

from __future__ import annotations

from collections.abc import Sequence

from kforge.config.model import Project
from kforge.cuda.arch import Arch


def profile_conflict(project: Project, profile: str | None, archs: Sequence[Arch]) -> str | None:
    """Why ``profile`` cannot build ``archs`` of ``project`` (one sentence), or None."""
    if profile is None or profile not in project.profiles:
        return None
    env = project.profiles[profile].env
    clashes = []
    for knob in project.arch_knobs:
        if knob.format != "disable-flags":
            continue
        for family, members in knob.families.items():
            variable = f"{knob.prefix or ''}{family}"
            value = str(env.get(variable, "")).strip()
            hit = sorted(a.sm for a in archs if a.number in members)
            if hit and value not in ("", "0"):
                clashes.append(f"{variable}={value} switches off the {family} kernels, which {' '.join(hit)} needs")
    if not clashes:
        return None
    return f"profile {profile} of {project.name}: " + "; ".join(clashes)

"""Target ids (``<project>-<arch>[-<platform>]``) and the build matrix.

One string keys a build everywhere: the nox session (``build-flashmla-sm120``), the log header,
the wheelhouse manifest and the CI matrix. The host platform needs no suffix; any other platform
is spelled by its alias (``-windows``) or full name (``-windows-amd64``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.arch import Arch, parse_arch
from kforge.config import Forge, Project
from kforge.errors import ArchError, KforgeError, TargetError, did_you_mean


@dataclass(frozen=True, order=True)
class Target:
    project: str
    arch: Arch  # the arch to build: the project's declared spelling, or the variant the id asked for
    platform: str  # a platform name from forge.toml, e.g. linux-x86_64
    suffix: str = ""  # "" on the host platform, else the platform's alias (or name)
    explicit_variant: bool = False  # the id spelled a variant (sm120f) rather than the base (sm120)

    @property
    def arch_token(self) -> str:
        base = f"sm{self.arch.major * 10 + self.arch.minor}"
        return base + self.arch.variant if self.explicit_variant else base

    @property
    def id(self) -> str:
        parts = [self.project, self.arch_token]
        if self.suffix:
            parts.append(self.suffix)
        return "-".join(parts)

    def __str__(self) -> str:
        return self.id


def _suffix(forge: Forge, platform: str, host_platform: str) -> str:
    if platform == host_platform:
        return ""
    plat = forge.platforms[platform]
    return plat.alias or plat.name


def make_target(forge: Forge, project: Project, arch: Arch, platform: str, host_platform: str, *,
                explicit_variant: bool = False) -> Target:
    return Target(
        project=project.name,
        arch=arch,
        platform=platform,
        suffix=_suffix(forge, platform, host_platform),
        explicit_variant=explicit_variant,
    )


def in_matrix(forge: Forge, project: str, arch: Arch, platform: str) -> bool:
    """The matrix is every project x arch x platform, less ``exclude`` rules, plus ``include`` rules."""
    if any(rule.matches(project, arch, platform) for rule in forge.include):
        return True
    return not any(rule.matches(project, arch, platform) for rule in forge.exclude)


def expand_matrix(forge: Forge, host_platform: str) -> tuple[Target, ...]:
    """Every target the matrix allows, in forge.toml order (project, then arch, then platform)."""
    out: list[Target] = []
    for project in forge.projects.values():
        for platform in project.platforms:
            for arch in project.archs:
                if in_matrix(forge, project.name, arch, platform):
                    out.append(make_target(forge, project, arch, platform, host_platform))
    out.sort(key=lambda t: (list(forge.projects).index(t.project), t.suffix != "", t.suffix, t.arch.base))
    return tuple(out)


def resolve_arch(project: Project, requested: Arch) -> tuple[Arch, bool]:
    """Map a requested arch onto the project's declared one; returns (arch, explicit_variant)."""
    for declared in project.archs:
        if declared.base == requested.base:
            if requested.variant and requested.variant != declared.variant:  # another variant: its own build and id
                if project.variant_rule == "declared" and declared.variant:
                    raise ArchError(
                        f"{project.name} builds {requested.base.sm} as {declared.sm}, not {requested.sm}",
                        why="its forge.toml entry fixes the variant (upstream's sources need it)",
                        fix=f"ask for {project.name}-sm{declared.number} (or change projects.{project.name}.archs)",
                    )
                return requested, True
            return declared, False  # the declared variant, however it was spelled: one id per build
    supported = ", ".join(a.sm for a in project.archs)
    raise ArchError(
        f"{project.name} does not support {requested.base.sm}",
        why=f"projects.{project.name}.archs lists {supported}",
        fix=f"pick one of {supported}, or add {requested.base.sm} to projects.{project.name}.archs "
        "(with a patch series if upstream lacks it)",
    )


def parse_target(forge: Forge, text: str, host_platform: str, *, gpu_arch: Arch | None = None) -> Target:
    """Parse ``<project>[-<arch>][-<platform>]``. Without an arch: the host GPU's, else the project's default."""
    text = text.strip()
    tokens = [t for t in text.split("-")]
    if not text or not all(tokens):
        raise TargetError(f"'{text}' is not a target id", fix="write <project>-<arch>[-<platform>], e.g. fmha-sm90")

    # The longest prefix of tokens that names a project.
    project: Project | None = None
    rest: list[str] = []
    for i in range(len(tokens), 0, -1):
        name = "-".join(tokens[:i])
        if name in forge.projects:
            project, rest = forge.projects[name], tokens[i:]
            break
    if project is None:
        guess = "-".join(t for t in tokens if not _looks_like_arch(t)) or text
        raise TargetError(
            f"unknown project '{guess}' in target '{text}'{did_you_mean(guess, forge.projects)}",
            why=f"forge.toml declares: {', '.join(forge.projects)}",
            fix="run `kforge targets` (or `nox -l`) to list every target",
        )

    explicit = False
    if rest:
        try:
            requested = parse_arch(rest[0])
        except KforgeError as exc:
            raise ArchError(
                f"'{rest[0]}' in target '{text}' is not a CUDA arch",
                why=exc.what,
                fix=exc.fix or "write the arch as sm90, sm_90a, 9.0 or 90a",
            ) from None
        arch, explicit = resolve_arch(project, requested)
        plat_text = "-".join(rest[1:])
    else:
        arch = project.default_arch
        if gpu_arch is not None:
            try:
                arch, _ = resolve_arch(project, gpu_arch)
            except ArchError:
                raise ArchError(
                    f"this machine's GPU is {gpu_arch.base.sm}, which {project.name} does not build",
                    why=f"projects.{project.name}.archs lists {', '.join(a.sm for a in project.archs)}",
                    fix=f"name an arch explicitly, e.g. {project.name}-sm{project.default_arch.base.number}",
                ) from None
        plat_text = ""

    if plat_text:
        try:
            platform = forge.platform(plat_text).name
        except KforgeError as exc:
            raise TargetError(f"{exc.what} in target '{text}'", why=exc.why, fix=exc.fix) from None
    else:
        platform = host_platform
    if platform not in forge.platforms:
        raise TargetError(
            f"the host platform '{platform}' is not declared in forge.toml",
            fix="name a platform in the target id, e.g. -linux, or declare this platform",
        )
    if platform not in project.platforms:
        raise TargetError(
            f"{project.name} is not built for {platform}",
            why=f"projects.{project.name}.platforms lists {', '.join(project.platforms)}",
            fix="pick one of those platforms, or add it to the project's platforms",
        )
    if not in_matrix(forge, project.name, arch, platform):
        raise TargetError(
            f"{project.name} {arch.sm} on {platform} is excluded by forge.toml's [matrix] exclude rules",
            fix="remove the rule or add a matching [matrix] include entry if you really need this build",
        )
    return make_target(forge, project, arch, platform, host_platform, explicit_variant=explicit)


def _looks_like_arch(token: str) -> bool:
    low = token.lower()
    return low.startswith(("sm", "compute")) or low[:1].isdigit()

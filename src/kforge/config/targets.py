"""Target ids (``<project>-<archs>[-<platform>]``) and the build matrix.

One string keys a build everywhere: the nox session (``build-flashmla-sm120``), the log header,
the wheelhouse manifest and the CI matrix. The host platform needs no suffix; any other platform
is spelled by its alias (``-windows``) or full name (``-windows-amd64``). The arch part is one
arch (``sm90``, ``sm120f``), several joined with ``+`` (``flash-attn-sm80+sm120-windows``: one
build, one fat wheel), or the name of one of the project's ``arch_sets`` (``flash-attn-release``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.config.model import Forge, Project
from kforge.cuda.arch import Arch, parse_arch
from kforge.errors import ArchError, KforgeError, TargetError, did_you_mean


@dataclass(frozen=True, order=True)
class Target:
    project: str
    archs: tuple[Arch, ...]  # what the build compiles, in arch order: the declared spellings, or the variants the id asked for
    platform: str  # a platform name from forge.toml, e.g. linux-x86_64
    suffix: str = ""  # "" on the host platform, else the platform's alias (or name)
    arch_token: str = ""  # the arch part of the id: "sm90", "sm120f", "sm80+sm120" or an arch set name ("release")

    def __post_init__(self) -> None:
        if not self.archs:
            raise TargetError(f"target {self.project} names no arch", fix="name at least one arch, e.g. -sm90")
        if not self.arch_token:
            object.__setattr__(self, "arch_token", "+".join(_token(a, False) for a in self.archs))

    @property
    def arch(self) -> Arch:
        """The arch of a single-arch target. A multi-arch target has no one arch: use :attr:`archs`."""
        if len(self.archs) != 1:
            raise TargetError(f"{self.id} builds {len(self.archs)} archs, not one",
                              fix="report this as a kforge bug: this code must read Target.archs")
        return self.archs[0]

    @property
    def id(self) -> str:
        parts = [self.project, self.arch_token]
        if self.suffix:
            parts.append(self.suffix)
        return "-".join(parts)

    @property
    def arch_names(self) -> str:
        """``sm_80 sm_120``: the archs, for descriptions and logs."""
        return " ".join(a.sm for a in self.archs)

    def __str__(self) -> str:
        return self.id


def _token(arch: Arch, explicit_variant: bool) -> str:
    """``sm90`` (the declared variant is implied) or ``sm120f`` (a variant the id spelled)."""
    return f"sm{arch.number}" + (arch.variant if explicit_variant else "")


def _suffix(forge: Forge, platform: str, host_platform: str) -> str:
    if platform == host_platform:
        return ""
    plat = forge.platforms[platform]
    return plat.alias or plat.name


def make_target(forge: Forge, project: Project, archs: Arch | tuple[Arch, ...], platform: str, host_platform: str, *,
                explicit_variant: bool | tuple[bool, ...] = False, arch_set: str | None = None) -> Target:
    """A target for one arch, or for several (sorted; the id joins them with ``+``, or names ``arch_set``)."""
    items = (archs,) if isinstance(archs, Arch) else tuple(archs)
    explicit = explicit_variant if isinstance(explicit_variant, tuple) else (explicit_variant,) * len(items)
    pairs = sorted(zip(items, explicit, strict=True), key=lambda p: p[0])
    return Target(
        project=project.name,
        archs=tuple(a for a, _ in pairs),
        platform=platform,
        suffix=_suffix(forge, platform, host_platform),
        arch_token=arch_set or "+".join(_token(a, e) for a, e in pairs),
    )


def in_matrix(forge: Forge, project: str, arch: Arch | tuple[Arch, ...], platform: str) -> bool:
    """The matrix is every project x arch x platform, less ``exclude`` rules, plus ``include`` rules.

    A multi-arch build is in the matrix when each of its archs is.
    """
    if not isinstance(arch, Arch):
        return all(in_matrix(forge, project, a, platform) for a in arch)
    if any(rule.matches(project, arch, platform) for rule in forge.include):
        return True
    return not any(rule.matches(project, arch, platform) for rule in forge.exclude)


def expand_matrix(forge: Forge, host_platform: str) -> tuple[Target, ...]:
    """Every target the matrix allows, in forge.toml order (project, then platform, then arch),
    with each project's arch sets (``flash-attn-release``) after its single-arch targets."""
    out: list[Target] = []
    for project in forge.projects.values():
        for platform in project.platforms:
            for arch in project.archs:
                if in_matrix(forge, project.name, arch, platform):
                    out.append(make_target(forge, project, arch, platform, host_platform))
            for name, archs in project.arch_sets.items():
                if in_matrix(forge, project.name, archs, platform):
                    out.append(make_target(forge, project, archs, platform, host_platform, arch_set=name))
    out.sort(key=lambda t: (list(forge.projects).index(t.project), t.suffix != "", t.suffix, len(t.archs) > 1, t.archs))
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

    arch_set: str | None = None
    if rest:
        archs, explicit, arch_set = _parse_arch_token(project, rest[0], text)
        plat_text = "-".join(rest[1:])
    else:
        archs, explicit = (project.default_arch,), (False,)
        if gpu_arch is not None:
            try:
                archs = (resolve_arch(project, gpu_arch)[0],)
            except ArchError:
                raise ArchError(
                    f"this machine's GPU is {gpu_arch.base.sm}, which {project.name} does not build",
                    why=f"projects.{project.name}.archs lists {', '.join(a.sm for a in project.archs)}",
                    fix=f"name an arch explicitly, e.g. {project.name}-sm{project.default_arch.number}",
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
    for arch in archs:
        if not in_matrix(forge, project.name, arch, platform):
            raise TargetError(
                f"{project.name} {arch.sm} on {platform} is excluded by forge.toml's [matrix] exclude rules",
                fix="remove the rule or add a matching [matrix] include entry if you really need this build",
            )
    return make_target(forge, project, archs, platform, host_platform, explicit_variant=explicit, arch_set=arch_set)


def _parse_arch_token(project: Project, token: str, text: str) -> tuple[tuple[Arch, ...], tuple[bool, ...], str | None]:
    """``sm90``, ``sm80+sm120`` or an arch set name -> (archs, which spelled their variant, set name)."""
    if token in project.arch_sets:
        named = project.arch_sets[token]
        return named, (False,) * len(named), token
    found: list[Arch] = []
    explicit: list[bool] = []
    for part in token.split("+"):
        try:
            requested = parse_arch(part)
        except KforgeError as exc:
            sets = f"; its arch sets are {', '.join(project.arch_sets)}" if project.arch_sets else ""
            hint = did_you_mean(part, project.arch_sets) if project.arch_sets and "+" not in token else ""
            raise ArchError(
                f"'{part}' in target '{text}' is not a CUDA arch{hint}",
                why=exc.what + sets,
                fix=exc.fix or "write the arch as sm90, sm_90a, 9.0 or 90a; join several with '+' (sm80+sm120)",
            ) from None
        arch, exp = resolve_arch(project, requested)
        if any(a.base == arch.base for a in found):
            raise TargetError(f"target '{text}' names {arch.base.sm} twice", fix="name each arch once, e.g. sm80+sm120")
        found.append(arch)
        explicit.append(exp)
    return tuple(found), tuple(explicit), None


def _looks_like_arch(token: str) -> bool:
    low = token.lower()
    return low.startswith(("sm", "compute")) or low[:1].isdigit()

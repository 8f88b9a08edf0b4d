"""Long units cut in parts: when the build's floor is its longest units, compile each as several.

On a host with more cores than a project has long units (flash-attn's 73 units on 64 cores), the build cannot
end before its longest unit does, however many jobs run: ``flash_fwd_split_hdim64_fp16_sm80`` alone was the whole
build there (548 s of a 559 s ninja run, docs/benchmarks/build-speed.md). A project whose patch series can compile
such a unit as several (flash-attn's patch 0005: the split-KV kernels of each (Split, Append_KV) pair, and the hdim
256 backward kernels of each shared-memory branch, in units of their own, the same templates with the same
arguments) declares it in forge.toml::

    unit_split = { env = "FLASH_ATTN_KFORGE_SPLIT_UNITS", groups = [
        { units = "flash_fwd_split_hdim*_sm80.o", exclude = "*_causal_*", parts = { _kfmain = 0.06, ... } }, ...] }

Each group's ``parts`` gives each part's output suffix and its share of the whole unit's time (measured; the shares
sum to more than 1: every part pays the headers again). The plan predicts the build both ways from the same unit times
(:func:`cut` and :func:`whole` translate between them) and sets ``env`` to 1 where the cut build is predicted at
least :data:`MIN_GAIN` faster, else to 0; ``--split-units on|off`` (``KFORGE_SPLIT_UNITS``) decides instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from kforge.build.jobs import JobChoice
from kforge.build.measure import UnitMeasure
from kforge.build.profiles import JobProfile
from kforge.config.model import UnitGroup, UnitSplit
from kforge.errors import BuildError

#: The cut build must be predicted at least this much shorter to be chosen (it costs more CPU time in all).
MIN_GAIN = 0.05


def cut(units: Iterable[tuple[str, float]], rule: UnitSplit) -> tuple[tuple[str, float], ...]:
    """Each whole unit a group matches, as its parts (each its share of the whole's time); measured parts (a cut build
    on this host) kept as measured, a part without all its siblings dropped; others unchanged."""
    units = tuple(units)
    complete = {base for base, (group, parts) in _groups(units, rule).items() if len(parts) == len(group.parts)}
    out: list[tuple[str, float]] = []
    for key, seconds in units:
        if (found := rule.part_of(key)) is not None:
            if found[0] in complete:
                out.append((key, seconds))
        elif (group := rule.group_of(key)) is not None:
            out.extend((part, seconds * share) for part, (_, share) in zip(group.part_keys(key), group.parts, strict=True))
        else:
            out.append((key, seconds))
    return tuple(out)


def _groups(units: tuple[tuple[str, float], ...], rule: UnitSplit) -> dict[str, tuple[UnitGroup, dict[str, float]]]:
    """The measured parts of each cut unit, with its group, by the whole unit's key."""
    groups: dict[str, tuple[UnitGroup, dict[str, float]]] = {}
    for key, seconds in units:
        if (found := rule.part_of(key)) is not None:
            groups.setdefault(found[0], (found[1], {}))[1][key] = seconds
    return groups


def whole(units: Iterable[tuple[str, float]], rule: UnitSplit) -> tuple[tuple[str, float], ...]:
    """The parts of a cut unit folded back into it (their sum over the shares' sum); a part without all its
    siblings is dropped (an unfinished build measured it), the rest unchanged, in first-seen order."""
    units = tuple(units)
    groups = _groups(units, rule)
    out: dict[str, float] = {}
    for key, seconds in units:
        found = rule.part_of(key)
        if found is None:
            out.setdefault(key, seconds)
            continue
        group, parts = groups[found[0]]
        if len(parts) == len(group.parts) and found[0] not in out:
            out[found[0]] = sum(parts.values()) / group.total_share
    return tuple(out.items())


def extra_units(count: int | None, profile: JobProfile, rule: UnitSplit) -> int | None:
    """The cut build's unit count, from the whole build's ``count`` and the units the profile knows to match."""
    if count is None:
        return None
    names = [k for k, _ in whole(_names(profile), rule)]
    return count + sum(len(g.parts) - 1 for k in names if (g := rule.group_of(k)) is not None)


def _names(profile: JobProfile) -> tuple[tuple[str, float], ...]:
    if profile.unit_builds:
        return profile.unit_builds[-1][2]
    return tuple((glob, s) for glob, s, _ in profile.seed_units)


def reshape(profile: JobProfile, rule: UnitSplit, *, split: bool) -> JobProfile:
    """``profile`` with every unit time (seed and measured builds) as the cut build's (``split``) or the whole one's."""
    how: Callable[[Iterable[tuple[str, float]], UnitSplit], tuple[tuple[str, float], ...]] = cut if split else whole
    seeds = tuple(sorted(((k, s, 1) for k, s in how(((g, s) for g, s, n in profile.seed_units for _ in range(n)), rule)),
                         key=lambda u: -u[1]))  # longest first, as the seeds are (the plan's order line names the first)
    builds = tuple((load, t, how(units, rule)) for load, t, units in profile.unit_builds)
    count = len(builds[-1][2]) if builds else profile.unit_count
    return replace(profile, seed_units=seeds if profile.seed_units else (), unit_builds=builds, unit_count=count)


@dataclass(frozen=True)
class SplitDecision:
    """What the plan decided, and why (the plan prints :attr:`line`)."""

    split: bool
    line: str
    env: Mapping[str, str]


def decide(rule: UnitSplit | None, mode: str, profile: JobProfile, units: int | None,
           choose: Callable[[JobProfile, int | None], JobChoice]) -> tuple[JobChoice, SplitDecision | None]:
    """The job choice for the whole build and, with a rule, for the cut one; the faster (or the one ``mode`` asks
    for) wins. ``choose(profile, units)`` is the plan's job choice for a profile and a unit count."""
    if rule is None:
        return choose(profile, units), None
    whole_profile = reshape(profile, rule, split=False)
    whole_choice = choose(whole_profile, units)
    if mode == "off":
        return whole_choice, SplitDecision(False, f"off (--split-units off): {rule.env}=0", {rule.env: "0"})
    cut_units = extra_units(units, whole_profile, rule)
    cut_choice = choose(reshape(profile, rule, split=True), cut_units)
    a, b = whole_choice.predicted_seconds, cut_choice.predicted_seconds
    versus = (f"predicted {b:.0f} s cut ({cut_units} units) against {a:.0f} s whole ({units} units)"
              if a is not None and b is not None else "no makespan prediction to compare")
    if mode == "on":
        return cut_choice, SplitDecision(True, f"on (--split-units on): {rule.env}=1; {versus}", {rule.env: "1"})
    if a is not None and b is not None and b <= a * (1 - MIN_GAIN):
        return cut_choice, SplitDecision(True, f"{rule.env}=1: the longest units cut in parts, {versus}", {rule.env: "1"})
    return whole_choice, SplitDecision(False, f"{rule.env}=0: units kept whole, {versus} (the cut must gain "
                                              f"{MIN_GAIN:.0%})", {rule.env: "0"})


def confirm(rule: UnitSplit | None, split_env: Iterable[tuple[str, str]], units: Iterable[UnitMeasure]) -> str:
    """After the build: the plan's split against the units the build compiled (a line for the log, "" with no rule or
    nothing measured; compiler-cache hits are not measured units). Raises when they disagree: a unit the plan cut that
    compiled whole, or a part where the plan kept the units whole, means the build is not the plan's."""
    asked = dict(split_env).get(rule.env) if rule is not None else None
    keys = [u.output.replace("\\", "/").rsplit("/", 1)[-1] for u in units]
    if rule is None or asked is None or not keys:
        return ""
    parts = sum(rule.part_of(k) is not None for k in keys)
    wholes = sum(rule.group_of(k) is not None for k in keys)
    if (asked == "1" and wholes) or (asked != "1" and parts):
        raise BuildError(f"the plan said {rule.env}={asked}, but the build compiled {parts} parts of cut units and "
                         f"{wholes} units the cut applies to whole",
                         why="the project's patch did not do what the plan asked, so the build is not the plan's",
                         fix=f"check that the patch series that reads {rule.env} applied (kforge patches status), or "
                             "build with --split-units off")
    if asked != "1":
        return f"split: units compiled whole, as the plan said ({rule.env}={asked})"
    if not parts:
        return f"split: {rule.env}=1, but no unit it cuts was compiled in this build (compiler-cache hits?)"
    return f"split: {parts} parts of cut units and {len(keys) - parts} other units compiled, as the plan said ({rule.env}=1)"

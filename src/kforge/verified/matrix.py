"""The matrix of what has really been built: every declared target (and build profile) with its best status.

:func:`build_rows` joins :func:`kforge.config.targets.expand_matrix` with the records (:mod:`.records`): one row
per target and build profile, in ``kforge targets`` order. A row's status comes from its runs through kforge only:
``gpu-tested`` (GPU tests passed on a GPU), else ``built-doctor``, else ``unbuildable`` where kforge knows the
target cannot build here (:func:`unbuildable_reason`), else ``planned``. Runs outside kforge (CMake from the tree,
upstream's setup.py) are shown beside it, never counted as the target's. A planned row with an ``[[unfit]]`` record
says why it does not fit one GPU run; an ``[[unfit]]`` for a row that has been built is an error (stale).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kforge.config.knowledge import require_current_knowledge
from kforge.config.model import Forge, Project
from kforge.config.profilearchs import profile_conflict
from kforge.config.targets import Target, expand_matrix
from kforge.cuda.arch import unsupported_reason
from kforge.errors import ConfigError, TargetError
from kforge.plan import effective_archs
from kforge.verified.records import RECORDS_FILE, Run, Unfit

__all__ = ["ROW_STATUSES", "Row", "build_rows", "counts", "unbuildable_reason"]

#: A row's status, best first.
ROW_STATUSES = ("gpu-tested", "built-doctor", "planned", "unbuildable")


@dataclass(frozen=True)
class Row:
    target: Target
    profile: str | None  # None: the project has no build profiles
    status: str  # one of ROW_STATUSES
    reason: str | None  # why it cannot build here (status "unbuildable")
    runs: tuple[Run, ...]  # through kforge, for this target and profile, oldest first
    outside: tuple[Run, ...]  # outside kforge, for this target and profile (or naming none), oldest first
    unfit: Unfit | None = None  # planned rows only: why it does not fit one GPU run

    @property
    def devices(self) -> tuple[str, ...]:
        """The GPUs its passing GPU tests ran on, first seen first."""
        return _devices(r for r in self.runs if r.status == "gpu-tested")

    @property
    def label(self) -> str:
        if self.status == "gpu-tested":
            return f"GPU-tested on {', '.join(self.devices)}"
        if self.status == "built-doctor":
            return "built + doctor"
        if self.status == "unbuildable":
            return f"unbuildable here: {self.reason}"
        if self.unfit:
            u = self.unfit
            return f"planned only: does not fit one GPU run on {u.host}: {u.why} ({u.section})"
        return "planned only"

    @property
    def best(self) -> Run | None:
        """The newest run of the row's status (its evidence), or None."""
        matching = [r for r in self.runs if r.status == self.status]
        return matching[-1] if matching else None


def build_rows(forge: Forge, runs: Sequence[Run], here: str, unfit: Sequence[Unfit] = ()) -> tuple[Row, ...]:
    """Every target of the matrix as seen from platform ``here``, once per build profile, with its runs.

    A run or an ``[[unfit]]`` that matches no row (an arch variant the matrix does not list, say) is a
    :class:`TargetError`, and so is an ``[[unfit]]`` for a row that is not planned only.
    """
    ordered = sorted(runs, key=_when)
    rows: list[Row] = []
    for target in expand_matrix(forge, here):
        project = forge.projects[target.project]
        key = (target.project, tuple(a.sm for a in target.archs), target.platform)
        reason = unbuildable_reason(forge, project, target, here)
        for profile in tuple(project.profiles) or (None,):
            clash = profile_conflict(project, profile, target.archs)
            why = "; ".join(r for r in (reason, clash) if r) or None
            mine = tuple(r for r in ordered if r.key == key and r.through_kforge and r.profile == profile)
            outside = tuple(
                r for r in ordered if r.key == key and not r.through_kforge and r.profile in (None, profile)
            )
            status = _status(mine, why)
            said = next((u for u in unfit if u.key == key and u.profile == profile), None)
            if said and status != "planned":
                raise _stale(said, status)
            rows.append(Row(target, profile, status, why, mine, outside, said))
    _check_every_run_has_a_row(runs, rows)
    for u in unfit:
        if not any(row.unfit is u for row in rows):
            twin = next((o for o in unfit if o is not u and (o.key, o.profile) == (u.key, u.profile)), None)
            raise TargetError(
                f"{RECORDS_FILE}: unfit[{u.index}] names {u.target.project} {u.target.arch_names} on "
                f"{u.target.platform}{_profile_words(u)}, "
                + (f"the row unfit[{twin.index}] already explains" if twin else "which is no row of the matrix"),
                why="each [[unfit]] explains one planned row, as `kforge matrix` lists them",
                fix="name a declared target and profile, as `kforge targets` prints them, or remove the entry",
            )
    return tuple(rows)


def _stale(u: Unfit, status: str) -> TargetError:
    return TargetError(
        f"{RECORDS_FILE}: unfit[{u.index}] says {u.target.project} {u.target.arch_names}{_profile_words(u)} does "
        f"not fit one GPU run, but its runs make it {status}",
        why="an [[unfit]] explains a row that is still planned only; a build that finished proves it stale",
        fix=f"remove unfit[{u.index}] from {RECORDS_FILE}, then run `kforge matrix --markdown`",
    )


def _profile_words(u: Unfit) -> str:
    return f" (profile {u.profile})" if u.profile else ""


def _when(run: Run) -> tuple[str, str]:
    return run.date, run.time or ""


def _status(runs: Iterable[Run], reason: str | None) -> str:
    statuses = {r.status for r in runs}
    for status in ("gpu-tested", "built-doctor"):
        if status in statuses:
            return status
    return "unbuildable" if reason else "planned"


def _devices(runs: Iterable[Run]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(d for r in runs for d in r.device))


def _check_every_run_has_a_row(runs: Sequence[Run], rows: Sequence[Row]) -> None:
    placed = {id(r) for row in rows for r in (*row.runs, *row.outside)}
    for run in runs:
        if id(run) not in placed:
            raise TargetError(
                f"{RECORDS_FILE}: run[{run.index}] ({run.date}, {run.section}) names {run.target.project} "
                f"{run.target.arch_names} on {run.target.platform}, which is no row of the matrix",
                why="the matrix lists each project's declared archs and arch sets, as `kforge targets` does "
                "(an explicit arch variant such as sm120f is a build of its own, not one of them)",
                fix="record the run under the declared target it belongs to, or declare that build in forge.toml",
            )


def unbuildable_reason(forge: Forge, project: Project, target: Target, here: str) -> str | None:
    """Why ``target`` cannot build on a ``here`` host, from what kforge already knows, or None.

    Another platform's host (as ``kforge targets`` says), an arch forge.toml marks ``unbuildable``, a pin outside
    the versions kforge's knobs were checked for, and archs no CUDA of ``[toolchains] cuda`` compiles.
    """
    reasons = [f"needs a {target.platform} host"] if target.platform != here else []
    reasons += [
        f"{project.unbuildable_reason(a)} (forge.toml: {a.sm} unbuildable)"
        for a in target.archs
        if project.unbuildable_reason(a)
    ]
    try:
        require_current_knowledge(project)
    except ConfigError as exc:
        reasons.append(exc.what)
    toolchain = _toolchain_reason(forge, project, target)
    return "; ".join([*reasons, *([toolchain] if toolchain else [])]) or None


def _toolchain_reason(forge: Forge, project: Project, target: Target) -> str | None:
    """None when some CUDA of forge.toml's toolchains compiles every arch (and meets the project's min_cuda)."""
    first: str | None = None
    for cuda in forge.toolchains.cuda:
        errors = [
            e
            for a in effective_archs(project, target.archs, cuda)
            if (e := unsupported_reason(a, cuda, source="toolkit")) is not None
        ]
        problem = errors[0].what if errors else None
        if problem is None and project.min_cuda and cuda < project.min_cuda:
            problem = f"{project.name} needs CUDA {project.min_cuda} or newer"
        if problem is None:
            return None
        first = first or problem
    listed = ", ".join(str(c) for c in forge.toolchains.cuda)
    return f"no CUDA of forge.toml's toolchains ({listed}) builds it: {first}" if first else None


def counts(rows: Iterable[Row]) -> dict[str, int]:
    """Rows per status, every status named (in :data:`ROW_STATUSES` order)."""
    out = dict.fromkeys(ROW_STATUSES, 0)
    for row in rows:
        out[row.status] += 1
    return out

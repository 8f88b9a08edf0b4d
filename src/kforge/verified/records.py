"""The records of real runs, ``docs/verified/records.toml``: one ``[[run]]`` per run docs/verified.md reports, and one
``[[unfit]]`` per planned target that does not fit one GPU run (why, and where the measurements are).

:func:`load_runs` reads the file (keys and types through :mod:`kforge.config.schema`) and resolves each run's
target against forge.toml, as a linux-x86_64 host spells it (:data:`REFERENCE_PLATFORM`: ``fmha-sm90``,
``flash-attn-sm120-windows``), so the file means the same on every host. A target forge.toml does not declare,
an unknown profile, status or date is a :class:`~kforge.errors.KforgeError` naming the run.
"""

from __future__ import annotations

import datetime
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from kforge.config.model import Forge
from kforge.config.schema import Reader
from kforge.config.targets import Target, parse_target
from kforge.errors import ConfigError, KforgeError, TargetError, decode_utf8, did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "RECORDS_FILE",
    "REFERENCE_PLATFORM",
    "STATUSES",
    "VIA",
    "Run",
    "Unfit",
    "load_runs",
    "load_unfit",
    "parse_runs",
    "parse_unfit",
    "reference_platform",
]

#: Where the records live, under the monorepo root.
RECORDS_FILE = "docs/verified/records.toml"
#: The platform whose ids the records (and docs/verified.md) use: its targets need no suffix.
REFERENCE_PLATFORM = "linux-x86_64"
#: A run's status: GPU tests ran on its device and none failed; built and the doctor passed (no GPU test
#: passed in this run); something failed (the build, the doctor or at least one GPU test); stopped before it
#: finished (the lease or the device time ran out, or it was stopped by hand): it says nothing of the target.
STATUSES = ("gpu-tested", "built-doctor", "failed", "stopped")
#: How a run built: through kforge (nox sessions, ``kforge build``/``release``: the target's wheel, doctor included),
#: CMake straight from the tree, upstream's setup.py, or otherwise (the note says how).
VIA = ("kforge", "cmake", "setup.py", "other")
_TIME = re.compile(r"^[0-2][0-9]:[0-5][0-9](-[0-2][0-9]:[0-5][0-9])?$")
_FIX = f"edit {RECORDS_FILE} (its header lists every key), then run `kforge matrix --markdown`"


@dataclass(frozen=True)
class RunTable:
    """One ``[[run]]`` as written: the file's schema (see the file's header)."""

    target: str
    via: str
    status: str
    host: tuple[str, ...]
    date: str
    section: str
    profile: str | None = None
    device: tuple[str, ...] = ()
    time: str | None = None
    wheel_bytes: int | None = None
    tests: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Run:
    """One real run, its target resolved against forge.toml."""

    index: int  # its place in the file, from 0 (the key path run[index])
    target: Target
    profile: str | None  # the build profile (a kforge run without one: the project's default); None: none applies
    via: str
    status: str
    host: tuple[str, ...]
    device: tuple[str, ...]  # the GPUs its tests ran on
    date: str  # YYYY-MM-DD, UTC
    time: str | None  # HH:MM or HH:MM-HH:MM, UTC
    section: str  # where docs/verified.md reports it
    wheel_bytes: int | None = None
    tests: str | None = None
    note: str | None = None

    @property
    def key(self) -> tuple[str, tuple[str, ...], str]:
        """(project, archs, platform): the matrix row it belongs to, whatever host reads it."""
        return self.target.project, tuple(a.sm for a in self.target.archs), self.target.platform

    @property
    def when(self) -> str:
        return f"{self.date} {self.time}" if self.time else self.date

    @property
    def through_kforge(self) -> bool:
        return self.via == "kforge"


@dataclass(frozen=True)
class UnfitTable:
    """One ``[[unfit]]`` as written."""

    target: str
    host: str
    why: str
    section: str
    profile: str | None = None


@dataclass(frozen=True)
class Unfit:
    """A planned target that does not build inside one GPU run on ``host`` (the biggest kind lent), and why."""

    index: int  # its place in the file, from 0 (the key path unfit[index])
    target: Target
    profile: str | None
    host: str
    why: str
    section: str  # where the measurements and extrapolations are

    @property
    def key(self) -> tuple[str, tuple[str, ...], str]:
        return self.target.project, tuple(a.sm for a in self.target.archs), self.target.platform


class _Reader(Reader):
    def error(self, key: str, problem: str, *, fix: str | None = None) -> ConfigError:
        return ConfigError(f"{self.file.name}: {key} {problem}", fix=fix or _FIX)


def reference_platform(forge: Forge) -> str:
    """:data:`REFERENCE_PLATFORM`, or forge.toml's first platform where it declares no linux-x86_64."""
    return REFERENCE_PLATFORM if REFERENCE_PLATFORM in forge.platforms else next(iter(forge.platforms))


def load_runs(forge: Forge, path: Path | None = None) -> tuple[Run, ...]:
    """Every run of the records file (default: :data:`RECORDS_FILE` under forge.toml's root), resolved."""
    path = path or forge.root / RECORDS_FILE
    return parse_runs(forge, _read(path), path)


def load_unfit(forge: Forge, path: Path | None = None) -> tuple[Unfit, ...]:
    """Every ``[[unfit]]`` of the records file, resolved."""
    path = path or forge.root / RECORDS_FILE
    return parse_unfit(forge, _read(path), path)


def _read(path: Path) -> dict:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the records of verified builds, {path}: {exc.strerror}",
            why="`kforge matrix` joins them with the targets forge.toml declares",
            fix=f"run it in a kforge checkout (it holds {RECORDS_FILE}), or pass --records PATH",
        ) from None
    try:
        return tomllib.loads(decode_utf8(raw, path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path.name} is not valid TOML: {exc}", fix=f"fix the syntax at that line of {path}"
        ) from None


def parse_runs(forge: Forge, data: dict, path: Path) -> tuple[Run, ...]:
    """The runs of a parsed records file (``data``: the TOML document; ``path``: for messages)."""
    reader = _Reader(path)
    unknown = sorted(set(data) - {"run", "unfit"})
    if unknown:
        raise reader.error(
            unknown[0],
            f"is not a known table{did_you_mean(unknown[0], ['run', 'unfit'])}",
            fix=f"write each run as a [[run]] table; {_FIX}",
        )
    return tuple(_run(forge, reader, i, reader.table(RunTable, t, f"run[{i}]"))
                 for i, t in enumerate(_tables(reader, data, "run")))


def parse_unfit(forge: Forge, data: dict, path: Path) -> tuple[Unfit, ...]:
    """The ``[[unfit]]`` entries of a parsed records file."""
    reader = _Reader(path)
    out = []
    for i, raw in enumerate(_tables(reader, data, "unfit")):
        key = f"unfit[{i}]"
        t = reader.table(UnfitTable, raw, key)
        _one_line(reader, key, [(n, getattr(t, n)) for n in ("target", "host", "why", "section", "profile")])
        target = _target(forge, reader, key, t.target, t.section)
        out.append(Unfit(i, target, _profile(forge, reader, key, "kforge", t.profile, target), t.host, t.why,
                         t.section))
    return tuple(out)


def _tables(reader: _Reader, data: dict, name: str) -> list:
    tables = data.get(name, [])
    if not isinstance(tables, list):
        raise reader.error(name, f"must be an array of tables ([[{name}]])")
    return tables


def _run(forge: Forge, reader: _Reader, index: int, t: RunTable) -> Run:
    key = f"run[{index}]"
    _choice(reader, f"{key}.via", t.via, VIA)
    _choice(reader, f"{key}.status", t.status, STATUSES)
    try:
        datetime.date.fromisoformat(t.date)
        if len(t.date) != 10:
            raise ValueError
    except ValueError:
        raise reader.error(f"{key}.date", f"must be a date written YYYY-MM-DD, not {t.date!r}") from None
    if t.time is not None and not _TIME.match(t.time):
        raise reader.error(
            f"{key}.time",
            f"must be HH:MM or HH:MM-HH:MM (UTC), not {t.time!r}",
            fix=f"write approximate or several times in the run's note; {_FIX}",
        )
    if not t.host:
        raise reader.error(f"{key}.host", "must name the machine the run used")
    if t.status == "gpu-tested" and not t.device:
        raise reader.error(f"{key}.device", "is missing: a gpu-tested run names the GPU its tests ran on")
    if t.wheel_bytes is not None and t.wheel_bytes <= 0:
        raise reader.error(f"{key}.wheel_bytes", f"must be the wheel's size in bytes, not {t.wheel_bytes}")
    texts = [(n, getattr(t, n)) for n in ("target", "section", "tests", "note", "profile")]
    texts += [(f"{n}[{i}]", v) for n in ("host", "device") for i, v in enumerate(getattr(t, n))]
    _one_line(reader, key, texts)
    target = _target(forge, reader, key, t.target, f"{t.date}, {t.section}")
    return Run(
        index=index,
        target=target,
        profile=_profile(forge, reader, key, t.via, t.profile, target),
        via=t.via,
        status=t.status,
        host=t.host,
        device=t.device,
        date=t.date,
        time=t.time,
        section=t.section,
        wheel_bytes=t.wheel_bytes,
        tests=t.tests,
        note=t.note,
    )


def _one_line(reader: _Reader, key: str, texts: list[tuple[str, str | None]]) -> None:
    for name, value in texts:
        if value is not None and ("\n" in value or "|" in value or not value.strip()):
            raise reader.error(f"{key}.{name}", "must be one line of text without '|' (it becomes a table cell)")


def _choice(reader: _Reader, key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise reader.error(key, f"is {value!r}, not one of {', '.join(choices)}{did_you_mean(value, choices)}")


def _target(forge: Forge, reader: _Reader, key: str, target_id: str, where: str) -> Target:
    try:
        return parse_target(forge, target_id, reference_platform(forge))
    except KforgeError as exc:
        raise TargetError(
            f"{reader.file.name}: {key} ({where}) names the target '{target_id}', which forge.toml does "
            f"not declare: {exc.what}",
            why=exc.why,
            fix=f"write the id as `kforge targets` prints it on a {reference_platform(forge)} host, or declare the "
            f"target in forge.toml; then run `kforge matrix --markdown`",
        ) from None


def _profile(forge: Forge, reader: _Reader, key: str, via: str, profile: str | None, target: Target) -> str | None:
    project = forge.projects[target.project]
    if profile is None:
        return project.default_profile if via == "kforge" else None
    if not project.profiles:
        raise reader.error(
            f"{key}.profile", f"is {profile!r}, and {project.name} has no build profiles", fix=f"drop the key; {_FIX}"
        )
    _choice(reader, f"{key}.profile", profile, tuple(project.profiles))
    return profile

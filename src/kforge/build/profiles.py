"""Job profiles: what one compile unit of a project cost (peak RSS, per-unit times), kept per project, build
profile and arch count in ``<cache>/jobs/<project>.json`` (``<project>.<profile>.json`` for a build with a
``--profile``: FA3's ``minimal`` and ``full`` compile different units), with the host's contention curve in
``<cache>/jobs/host.json``. :mod:`kforge.build.jobs` chooses ``MAX_JOBS`` and the nvcc threads from them."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kforge.build import makespan
from kforge.build.makespan import DEFAULT_FULL_LOAD_FACTOR, Contention
from kforge.build.measure import UnitMeasure
from kforge.build.ninjaorder import unit_key
from kforge.fsutil import atomic_write_text

GiB = 1024**3
GB = 1000**3

#: Defaults of the model; a profile may carry its own.
DEFAULT_BETA = 0.25
DEFAULT_SERIAL_SHARE = 0.3
#: Used when nothing was ever measured for a project (stated as a guess in the reason).
DEFAULT_PEAK_RSS = int(3 * GiB)
DEFAULT_UNIT_SECONDS = 60.0
#: How many recent builds a profile remembers.
HISTORY = 8
#: How many recent builds' per-unit times a profile keeps (order, makespan, contention).
UNIT_BUILDS = 4


@dataclass(frozen=True)
class JobProfile:
    """Measured cost of one compile unit of ``project`` built for ``arch_count`` archs."""

    project: str
    arch_count: int
    peak_rss_per_unit: int  # bytes: the largest unit seen (what memory must hold per job)
    unit_seconds: float  # median seconds of one unit at one nvcc thread
    unit_seconds_max: float
    samples: int  # compile units measured in total
    source: str  # "measured (N builds)", "seed: ...", "default guess"
    beta: float = DEFAULT_BETA
    serial_share: float = DEFAULT_SERIAL_SHARE
    history: tuple[tuple[int, float, float], ...] = field(default=(), repr=False)  # (peak, median s, max s) per build
    #: Recent builds' unit times: (load, nvcc threads, ((unit key, seconds), ...)); load = jobs x processes per unit.
    unit_builds: tuple[tuple[float, int, tuple[tuple[str, float], ...]], ...] = field(default=(), repr=False)
    unit_count: int | None = None  # compile units of one build (measured, or the seed's)
    contention: Contention | None = None  # this host's, from <cache>/jobs/host.json; None: the default curve
    #: Before any unit was measured here: (file-name glob, seconds, count) per kind of unit, longest first (seeds only).
    seed_units: tuple[tuple[str, float, int], ...] = ()
    #: Seeds only: each arch's device-side cost relative to the seed's own arch ((major*10+minor, weight), ...);
    #: an arch not listed costs 1.0. :func:`for_arch_count` with the target's archs prices the mix with them.
    arch_weights: tuple[tuple[int, float], ...] = ()
    #: The archs' summed weights when :func:`for_arch_count` priced a mix (None: every arch costs 1.0).
    weighted_archs: float | None = None

    @property
    def arch_load(self) -> float:
        """Device compilations' cost of one unit, in the seed arch's units: the arch count, or the weighted sum."""
        return self.weighted_archs if self.weighted_archs is not None else float(max(1, self.arch_count))


#: flash-attn 2.8.3.post2's 73 units for sm_90 as measured in one kforge build on the `nvidia-h200` host
#: (16 cores, 16 jobs x 1 nvcc thread, 2026-11-23, docs/verified.md): seconds at 16 concurrent jobs, summing
#: to 16,702 s. The seed divides them by the default contention factor at 16 jobs (kforge.build.makespan). That
#: factor, 1.73, was itself fitted as 16,702 / 9,678 (upstream's 8-job build, UPSTREAM_FACTS), so the seed's
#: 9,654 s total agrees with 9,678 s by construction, not as a cross-check. Predictions between 8 and 16 jobs
#: interpolate a curve with no measured point there: estimates until a host measures its own.
_FA2_UNITS_AT_16_JOBS: tuple[tuple[str, float], ...] = (
    ("flash_fwd_split_hdim64_fp16_sm80.o", 432.9), ("flash_fwd_split_hdim64_bf16_sm80.o", 405.5),
    ("flash_fwd_split_hdim128_fp16_sm80.o", 379.0), ("flash_fwd_split_hdim256_bf16_sm80.o", 373.6),
    ("flash_fwd_split_hdim256_fp16_sm80.o", 373.5), ("flash_fwd_split_hdim128_bf16_sm80.o", 359.3),
    ("flash_fwd_split_hdim96_fp16_sm80.o", 355.9), ("flash_bwd_hdim256_bf16_sm80.o", 349.2),
    ("flash_bwd_hdim256_fp16_sm80.o", 342.8), ("flash_fwd_split_hdim96_bf16_sm80.o", 337.1),
    ("flash_fwd_split_hdim192_fp16_sm80.o", 317.4), ("flash_bwd_hdim128_bf16_sm80.o", 313.5),
    ("flash_fwd_split_hdim32_fp16_sm80.o", 313.3), ("flash_bwd_hdim128_fp16_sm80.o", 305.5),
    ("flash_fwd_split_hdim32_bf16_sm80.o", 301.1), ("flash_bwd_hdim64_bf16_sm80.o", 298.9),
    ("flash_bwd_hdim64_fp16_sm80.o", 298.7), ("flash_fwd_split_hdim192_bf16_sm80.o", 296.7),
    ("flash_fwd_hdim256_fp16_sm80.o", 273.7), ("flash_bwd_hdim96_fp16_sm80.o", 268.3),
    ("flash_fwd_hdim256_bf16_sm80.o", 266.3), ("flash_bwd_hdim96_bf16_sm80.o", 256.4),
    ("flash_fwd_split_hdim64_fp16_causal_sm80.o", 255.8), ("flash_bwd_hdim192_bf16_sm80.o", 253.9),
    ("flash_fwd_split_hdim64_bf16_causal_sm80.o", 250.0), ("flash_bwd_hdim192_fp16_sm80.o", 248.3),
    ("flash_fwd_hdim128_bf16_sm80.o", 241.5), ("flash_bwd_hdim32_fp16_sm80.o", 241.1),
    ("flash_fwd_hdim128_fp16_sm80.o", 240.9), ("flash_bwd_hdim32_bf16_sm80.o", 228.5),
    ("flash_fwd_split_hdim128_fp16_causal_sm80.o", 226.3), ("flash_fwd_split_hdim256_fp16_causal_sm80.o", 225.9),
    ("flash_bwd_hdim256_fp16_causal_sm80.o", 223.6), ("flash_fwd_split_hdim128_bf16_causal_sm80.o", 218.9),
    ("flash_bwd_hdim128_bf16_causal_sm80.o", 217.1), ("flash_fwd_split_hdim256_bf16_causal_sm80.o", 214.1),
    ("flash_bwd_hdim128_fp16_causal_sm80.o", 213.4), ("flash_fwd_split_hdim96_fp16_causal_sm80.o", 212.2),
    ("flash_bwd_hdim256_bf16_causal_sm80.o", 211.9), ("flash_fwd_split_hdim96_bf16_causal_sm80.o", 205.2),
    ("flash_fwd_hdim128_fp16_causal_sm80.o", 203.5), ("flash_bwd_hdim64_bf16_causal_sm80.o", 198.0),
    ("flash_fwd_split_hdim32_fp16_causal_sm80.o", 196.1), ("flash_fwd_split_hdim192_fp16_causal_sm80.o", 195.2),
    ("flash_fwd_hdim128_bf16_causal_sm80.o", 193.6), ("flash_bwd_hdim64_fp16_causal_sm80.o", 191.7),
    ("flash_fwd_split_hdim32_bf16_causal_sm80.o", 190.4), ("flash_bwd_hdim96_bf16_causal_sm80.o", 183.7),
    ("flash_fwd_split_hdim192_bf16_causal_sm80.o", 183.6), ("flash_fwd_hdim256_bf16_causal_sm80.o", 183.3),
    ("flash_fwd_hdim192_bf16_sm80.o", 181.6), ("flash_fwd_hdim64_fp16_sm80.o", 181.5),
    ("flash_fwd_hdim256_fp16_causal_sm80.o", 180.9), ("flash_fwd_hdim64_bf16_sm80.o", 179.1),
    ("flash_bwd_hdim96_fp16_causal_sm80.o", 179.0), ("flash_fwd_hdim192_fp16_sm80.o", 177.4),
    ("flash_bwd_hdim192_fp16_causal_sm80.o", 168.7), ("flash_fwd_hdim96_fp16_causal_sm80.o", 165.8),
    ("flash_fwd_hdim32_bf16_sm80.o", 164.0), ("flash_bwd_hdim192_bf16_causal_sm80.o", 162.5),
    ("flash_fwd_hdim96_fp16_sm80.o", 159.2), ("flash_fwd_hdim96_bf16_causal_sm80.o", 158.9),
    ("flash_fwd_hdim96_bf16_sm80.o", 158.0), ("flash_fwd_hdim32_fp16_sm80.o", 153.2),
    ("flash_bwd_hdim32_bf16_causal_sm80.o", 150.9), ("flash_bwd_hdim32_fp16_causal_sm80.o", 147.9),
    ("flash_fwd_hdim192_bf16_causal_sm80.o", 131.6), ("flash_fwd_hdim64_bf16_causal_sm80.o", 128.8),
    ("flash_fwd_hdim64_fp16_causal_sm80.o", 127.4), ("flash_fwd_hdim192_fp16_causal_sm80.o", 126.4),
    ("flash_fwd_hdim32_bf16_causal_sm80.o", 110.3), ("flash_fwd_hdim32_fp16_causal_sm80.o", 104.2),
    ("flash_api.o", 38.8),
)
_FA2_SEED_UNITS = tuple((name, seconds / DEFAULT_FULL_LOAD_FACTOR, 1) for name, seconds in _FA2_UNITS_AT_16_JOBS)

#: flash-attn's single-arch builds on the 64-core H200 host, the 73 units' sums (docs/matrix-build-times.md): sm_90
#: 21,534.5 s (42 jobs alone, 2026-11-27 16:33), sm_80 20,876 s and sm_100 15,033 s (at once, 64 busy compiles,
#: 22:25), sm_120 15,887 s (19:37, 24 jobs with FA3's 40 beside it for 9.5 of its 12.8 min). Under the default curve
#: (flat from 42 busy compiles) the loads compare; a unit's sum ratio r to sm_90's is s + (1 - s) w with the
#: arch-independent share s = 0.3, so each arch's device weight is w = (r - 0.3) / 0.7.
_FA2_ARCH_WEIGHTS: tuple[tuple[int, float], ...] = tuple(
    (arch, round((total / 21534.5 - DEFAULT_SERIAL_SHARE) / (1 - DEFAULT_SERIAL_SHARE), 3))
    for arch, total in ((80, 20876.0), (90, 21534.5), (100, 15033.0), (120, 15887.0))
)

#: Seeds from measurements in UPSTREAM_FACTS.md (flash-attn 2.8.3.post2, nvcc 13.0, sm_90,
#: 16-core H200): fwd units 4.3 GB / 123 s, bwd units 6.3 GB / 170 s, 73 units = 9678 s,
#: the longest 252 s; three archs with --threads 4 still peaked at 4.3 GB.
SEEDS: dict[str, JobProfile] = {
    "flash-attn": JobProfile(
        project="flash-attn",
        arch_count=1,
        peak_rss_per_unit=int(6.3 * GB),
        unit_seconds=9678 / 73,
        unit_seconds_max=252.0,
        samples=0,
        source="seed: UPSTREAM_FACTS (flash-attn 2.8.3.post2, sm_90, bwd unit 6.3 GB; unit times from the H200 build)",
        beta=0.1,
        unit_count=73,
        seed_units=_FA2_SEED_UNITS,
        arch_weights=_FA2_ARCH_WEIGHTS,
    ),
    # FA3's forward units: the whole of the standalone library (plus combine, prepare_scheduler and the API, all
    # smaller) and most of the torch extension (which adds backward units). Measured one at a time with
    # /usr/bin/time -v on kforge's 2-core build machine (AMD EPYC, no GPU, nvcc 13.0.88, sm_90a only,
    # -DFLASHATTENTION_DISABLE_BACKWARD, 2026-11-27):
    #   flash_fwd_hdim128_bf16_sm90.cu        6,572,204 KiB (6.27 GiB) peak RSS, 252.2 s wall
    #   flash_fwd_hdim128_bf16_split_sm90.cu  6,452,672 KiB (6.15 GiB) peak RSS, 243.1 s wall
    # The same 6.27 GiB was the largest unit of every flash-attn3 minimal build on the nvidia-h100-x1 and
    # nvidia-h200 hosts (docs/verified.md); without a seed the torch extension got kforge's 3 GiB default (about
    # 9 jobs of 6.27 GiB on a 32 GB machine). The full profile's hdim 96/192/256 and FP8 units were not measured:
    # a first build measures them (kept apart from minimal's per build profile).
    **{
        project: JobProfile(
            project=project,
            arch_count=1,
            peak_rss_per_unit=6_572_204 * 1024,
            unit_seconds=(252.16 + 243.08) / 2,
            unit_seconds_max=252.16,
            samples=0,
            source="seed: FA3 fwd units hdim128 bf16 (+split) sm_90a, 6.27 GiB peak RSS, 248 s (nvcc 13.0, 2-core "
                   "host, 2026-11-27)",
        )
        for project in ("flash-attn3", "flash-attn3-standalone")
    },
}


def _profile_path(cache_dir: Path, project: str, build_profile: str | None = None) -> Path:
    """Project names have no '.', so ``<project>.<profile>`` never reads as another project's file."""
    return Path(cache_dir) / "jobs" / (f"{project}.{build_profile}.json" if build_profile else f"{project}.json")


def _read_profiles(path: Path) -> dict[str, dict]:
    """The usable entries of a profile file, by arch count. A damaged entry (hand-edited, cut
    short) counts as not measured: the next build measures again and overwrites it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    raw = data.get("arch_counts", {}) if isinstance(data, dict) else {}
    good: dict[str, dict] = {}
    for key, entry in (raw.items() if isinstance(raw, dict) else ()):
        try:
            _from_entry("check", int(key), entry)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        good[str(int(key))] = entry
    return good


def _unit_builds(raw: object) -> tuple[tuple[float, int, tuple[tuple[str, float], ...]], ...]:
    out = []
    for load, threads, units in raw or ():  # type: ignore[union-attr]
        out.append((float(load), int(threads), tuple(sorted((str(k), float(v)) for k, v in dict(units).items()))))
    return tuple(out)


def _from_entry(project: str, arch_count: int, entry: Mapping) -> JobProfile:
    history = tuple(tuple(h) for h in entry.get("history", ()))  # type: ignore[misc]
    builds = _unit_builds(entry.get("unit_builds", ()))
    return JobProfile(
        project=project,
        arch_count=arch_count,
        peak_rss_per_unit=int(entry["peak_rss_per_unit"]),
        unit_seconds=float(entry["unit_seconds"]),
        unit_seconds_max=float(entry.get("unit_seconds_max", entry["unit_seconds"])),
        samples=int(entry.get("samples", 0)),
        source=f"measured ({len(history) or 1} builds)",
        beta=float(entry.get("beta", DEFAULT_BETA)),
        serial_share=float(entry.get("serial_share", DEFAULT_SERIAL_SHARE)),
        history=history,  # type: ignore[arg-type]
        unit_builds=builds,
        unit_count=len(builds[-1][2]) if builds else None,
    )


def load_profile(cache_dir: Path, project: str, arch_count: int, build_profile: str | None = None) -> JobProfile:
    """The profile for this project, build profile and arch count (measured, else nearest measured, seed, or
    default), with this host's measured contention curve where there is one. One build profile's measurements never
    stand in for another's: a ``minimal`` build's smaller units would size a ``full`` build's jobs too big."""
    return replace(_load_profile(cache_dir, project, arch_count, build_profile), contention=load_contention(cache_dir))


def _load_profile(cache_dir: Path, project: str, arch_count: int, build_profile: str | None) -> JobProfile:
    entries = _read_profiles(_profile_path(cache_dir, project, build_profile))
    if str(arch_count) in entries:
        return _from_entry(project, arch_count, entries[str(arch_count)])
    if entries:
        nearest = min((int(k) for k in entries), key=lambda k: (abs(k - arch_count), k))
        base = _from_entry(project, nearest, entries[str(nearest)])
        return for_arch_count(base, arch_count, f"measured for {nearest} archs, rescaled to {arch_count}")
    if project in SEEDS:
        return for_arch_count(SEEDS[project], arch_count, SEEDS[project].source)
    return JobProfile(
        project=project,
        arch_count=arch_count,
        peak_rss_per_unit=DEFAULT_PEAK_RSS,
        unit_seconds=DEFAULT_UNIT_SECONDS,
        unit_seconds_max=DEFAULT_UNIT_SECONDS,
        samples=0,
        source="default guess (nothing measured yet for this project)",
    )


def for_arch_count(base: JobProfile, arch_count: int, source: str | None = None, *,
                   archs: Sequence[int] = ()) -> JobProfile:
    """``base`` rescaled to ``arch_count`` archs: single-thread unit time grows with archs (device part per
    arch), peak memory does not. Unit times are rescaled by the same factor (their order is kept).

    ``archs`` (``major * 10 + minor`` each) prices a seed's arch mix with its :attr:`JobProfile.arch_weights`;
    without them, or for measured profiles (their times already hold their own mix), every arch costs 1.0."""
    weighted = None
    if base.arch_weights and not base.unit_builds and archs and base.arch_count == 1 and len(archs) == arch_count:
        weights = [dict(base.arch_weights).get(a, 1.0) for a in archs]
        weighted = round(sum(weights), 4)
        if source is None:
            source = (f"{base.source}, priced for {' + '.join(f'sm_{a} {w:g}' for a, w in zip(archs, weights, strict=True))}"
                      + (f" = {weighted:g}" if len(archs) > 1 else "") + " of its arch's device time")
    if base.arch_count == arch_count and weighted is None:
        return replace(base, source=source) if source else base
    source = source or f"{base.source}, rescaled to {arch_count} archs"
    s = base.serial_share
    load = weighted if weighted is not None else arch_count
    factor = (s + (1 - s) * load) / (s + (1 - s) * base.arch_load)
    return replace(
        base,
        arch_count=arch_count,
        weighted_archs=weighted,
        unit_seconds=base.unit_seconds * factor,
        unit_seconds_max=base.unit_seconds_max * factor,
        source=source,
        history=(),
        unit_builds=tuple((load, t, tuple((k, v * factor) for k, v in units)) for load, t, units in base.unit_builds),
        seed_units=tuple((glob, v * factor, n) for glob, v, n in base.seed_units),
    )


def record(cache_dir: Path, project: str, arch_count: int, units: Sequence[UnitMeasure], *,
           build_profile: str | None = None, jobs: int | None = None, cpus: int | None = None) -> JobProfile:
    """Fold one build's measured units into the project's profile (atomically) and return it.

    With ``jobs`` (the MAX_JOBS the units ran under) the unit times are kept by name with their load, for
    the longest-first order and the makespan model; with ``cpus`` too, this host's contention curve is
    learnt again from the builds at different loads (``<cache>/jobs/host.json``).
    """
    good = [u for u in units if u.returncode == 0 and u.peak_rss > 0]
    if not good:
        return load_profile(cache_dir, project, arch_count, build_profile)
    path = _profile_path(cache_dir, project, build_profile)
    entries = _read_profiles(path)
    old = entries.get(str(arch_count), {})
    history = [tuple(h) for h in old.get("history", [])]
    # A unit run with t threads holds up to (1 + beta (t-1)) of the single-thread peak.
    beta = float(old.get("beta", SEEDS[project].beta if project in SEEDS else DEFAULT_BETA))
    peaks = [u.peak_rss / (1 + beta * (min(u.nvcc_threads, arch_count) - 1)) for u in good]
    secs = [u.seconds for u in good]
    history.append((int(max(peaks)), float(statistics.median(secs)), float(max(secs))))
    history = history[-HISTORY:]
    entry = {
        "peak_rss_per_unit": max(h[0] for h in history),
        "unit_seconds": float(statistics.median(h[1] for h in history)),
        "unit_seconds_max": max(h[2] for h in history),
        "samples": int(old.get("samples", 0)) + len(good),
        "beta": beta,
        "serial_share": float(old.get("serial_share", DEFAULT_SERIAL_SHARE)),
        "history": history,
        "unit_builds": [list(b) for b in old.get("unit_builds", [])],
    }
    if jobs is not None and jobs >= 1:
        threads = int(statistics.median(min(max(1, u.nvcc_threads), max(1, arch_count)) for u in good))
        times: dict[str, float] = {}
        for u in good:
            times[unit_key(u.output)] = max(times.get(unit_key(u.output), 0.0), float(u.seconds))
        entry["unit_builds"] = (entry["unit_builds"] + [[float(jobs * threads), threads, times]])[-UNIT_BUILDS:]
    entries[str(arch_count)] = entry
    atomic_write_text(path, json.dumps({"project": project, "arch_counts": entries}, indent=2, sort_keys=True))
    profile = _from_entry(project, arch_count, entry)
    if cpus is not None and profile.unit_builds:
        # Only a build with at least two units per job slot held its load for most of its run; a small project
        # (fmha: 7 units under MAX_JOBS=16) never ran 16 at once and would teach the host a false "no slowdown".
        sustained = [(load, t, units) for load, t, units in profile.unit_builds if len(units) >= 2 * load / max(1, t)]
        learnt = makespan.learn([(load, dict((k, v / thread_factor(profile, t)) for k, v in units))
                                 for load, t, units in sustained], cpus)
        if learnt is not None:
            save_contention(cache_dir, learnt)
    return replace(profile, contention=load_contention(cache_dir))


def _host_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / "jobs" / "host.json"


def load_contention(cache_dir: Path) -> Contention | None:
    """This host's measured contention curve, or None (then :func:`makespan.default_curve` applies)."""
    try:
        data = json.loads(_host_path(cache_dir).read_text())
        points = tuple((float(x), float(y)) for x, y in data["points"])
        if len(points) < 2 or any(y <= 0 for _, y in points):
            return None
        return Contention(points, str(data.get("source", "measured on this host")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_contention(cache_dir: Path, curve: Contention) -> None:
    atomic_write_text(_host_path(cache_dir), json.dumps({"points": [list(p) for p in curve.points],
                                                        "source": curve.source}, indent=2))


def thread_factor(profile: JobProfile, threads: int) -> float:
    """A unit's time at ``threads`` nvcc threads over its time at one (threads help only with > 1 arch)."""
    a = profile.arch_load
    p = max(1, min(threads, profile.arch_count))
    s = profile.serial_share
    return (s + (1 - s) * a / p) / (s + (1 - s) * a)

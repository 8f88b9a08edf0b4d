"""The offline kit: gather what an offline build host needs into one folder, and install it there.

``kforge sources kit build OUT`` writes::

    OUT/kit.json                                        the manifest: every file, its sha256 and size
    OUT/wheels/*.whl                                    kforge and its dependencies, for the host's Python/platform,
                                                        and what isolated builds of the kit's projects install
    OUT/cache/sdists/<name>-<version>-<sha16>/<file>    pinned sdists, in the layout kforge's cache uses
    OUT/cache/git/<owner>+<name>-<commit>.tar.xz(.json) pinned git trees with nested submodules (gitarchive)

``OUT/cache`` *is* a kforge cache, so ``KFORGE_CACHE=OUT/cache`` uses the kit in place;
``kforge sources kit install OUT`` pip-installs the wheels offline and copies the cache part
into the host's cache, after which kforge finds everything with no flags.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kforge import __version__
from kforge.config.model import Project
from kforge.config.source import GitSource, SdistSource, Source
from kforge.errors import SourceError
from kforge.fsutil import PUBLIC_FILE_MODE, atomic_write_text, sha256_file
from kforge.sources import gitarchive
from kforge.sources import sdist as _sdist
from kforge.sources.gittree import has_commit
from kforge.sources.mirrors import Mirrors
from kforge.sources.upstream import is_checkout

MANIFEST = "kit.json"
FORMAT = 1

#: ``runner(argv)``: runs pip; raises :class:`SourceError` on failure. Tests inject their own.
Runner = Callable[[Sequence[str]], None]


@dataclass(frozen=True)
class WheelTarget:
    """The Python and platform the host's wheels are for (``pip download`` tags)."""

    python: str = "3.12"  # "3.12"
    platform: str = "manylinux_2_28_x86_64"  # the newest tag the host accepts; older manylinux ones follow

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    def platforms(self) -> list[str]:
        """``manylinux_2_28_x86_64`` -> itself and every older glibc (and legacy alias) on that arch."""
        plat = self.platform
        if plat.startswith("manylinux_2_"):
            minor_text, _, arch = plat[len("manylinux_2_"):].partition("_")
            if minor_text.isdigit():
                out = [f"manylinux_2_{m}_{arch}" for m in range(int(minor_text), 4, -1)]
                legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
                out += [f"{name}_{arch}" for m, name in legacy.items() if m <= int(minor_text)]
                return out
        return [plat]

    def pip_args(self) -> list[str]:
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp", "--abi", self.abi]
        for p in self.platforms():
            args += ["--platform", p]
        return args


@dataclass(frozen=True)
class KitEntry:
    """One file of the kit (path relative to the kit folder)."""

    kind: str  # "wheel" | "sdist" | "git"
    path: str
    sha256: str
    size: int
    what: str = ""  # "flash-attn==2.8.3.post2", "https://...@<commit>", ...


@dataclass(frozen=True)
class KitManifest:
    projects: tuple[str, ...]
    target: WheelTarget
    entries: tuple[KitEntry, ...]
    kforge_version: str = __version__
    created: str = ""
    notes: tuple[str, ...] = field(default=())
    extras: tuple[str, ...] = ("dev",)  # kforge's extras whose wheels are in the kit (dev: nox, invoke)

    @property
    def requirement(self) -> str:
        return "kforge" + (f"[{','.join(self.extras)}]" if self.extras else "")

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "kforge": self.kforge_version, "created": self.created, "projects": list(self.projects),
            "python": self.target.python, "platform": self.target.platform, "notes": list(self.notes),
            "extras": list(self.extras),
            "files": [{"kind": e.kind, "path": e.path, "sha256": e.sha256, "size": e.size, "what": e.what}
                      for e in self.entries],
        }, indent=2) + "\n"

    @classmethod
    def read(cls, kit: Path) -> KitManifest:
        path = Path(kit) / MANIFEST
        try:
            data = json.loads(path.read_text())
            entries = tuple(KitEntry(f["kind"], f["path"], f["sha256"], int(f["size"]), f.get("what", ""))
                            for f in data["files"])
            return cls(tuple(data["projects"]), WheelTarget(data["python"], data["platform"]), entries,
                       data.get("kforge", ""), data.get("created", ""), tuple(data.get("notes", ())),
                       tuple(data.get("extras", ())))
        except FileNotFoundError as exc:
            raise SourceError(f"{kit} is not a kforge kit: it has no {MANIFEST}",
                              fix="give the folder `kforge sources kit build` wrote") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"{path} is not a valid kit manifest", why=str(exc),
                              fix="build the kit again with `kforge sources kit build`") from exc


def isolated_build_requires(projects: Sequence[Project]) -> dict[str, tuple[str, ...]]:
    """Per project built in isolation (``build_isolation``), the requirements pip's isolated build installs
    (forge.toml's ``build_requires``: scikit-build-core, and the cmake and ninja it asks for where the host's are
    missing or too old). An offline host's pip finds them among the kit's wheels (``PIP_FIND_LINKS``); a build
    without isolation uses the interpreter's own packages instead."""
    return {p.name: p.build_requires for p in projects if p.build_isolation and p.build_requires}


def pip_runner(argv: Sequence[str]) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        raise SourceError(f"`{' '.join(argv[:6])} …` failed with exit code {proc.returncode}", why=tail or None,
                          fix="check that the package index is reachable, and the --python / --platform of the kit")


# --------------------------------------------------------------------------- build


def build(out: Path, *, root: Path, sources: Sequence[tuple[str, Source]], projects: Sequence[str],
          cache_dir: Path, mirrors: Mirrors, target: WheelTarget | None = None, wheels: bool = True,
          extra_requirements: Sequence[str] = (), extras: Sequence[str] = ("dev",), trim: bool = True,
          skip_nested: Sequence[str] = (),
          compression: str = "xz", substitutes: Mapping[str, Path] | None = None,
          runner: Runner = pip_runner, opener: _sdist.Opener | None = None,
          log: Callable[[str], None] = lambda _: None) -> KitManifest:
    """Write the kit for ``sources`` (``(label, spec)`` pairs, deduplicated by the caller) into ``out``.

    Built in a sibling folder and moved into place at the end: ``out`` is either the whole
    kit or untouched. ``out`` must not exist yet (or be empty).
    """
    target = target or WheelTarget()
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise SourceError(f"{out} already exists and is not empty",
                          fix="remove it or give another folder: the kit is written whole or not at all")
    out.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=f".{out.name}.part-", dir=out.parent))
    try:
        entries: list[KitEntry] = []
        notes: list[str] = []
        nested_seen: set[str] = set()
        for label, spec in sources:
            if isinstance(spec, SdistSource):
                got = _sdist.fetch(spec.name, spec.version, spec.sha256, cache_dir=cache_dir,
                                   index_url=spec.index_url, opener=opener)
                rel = _sdist.cache_path(Path("cache"), spec.name, spec.version, spec.sha256) / got.path.name
                (part / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(got.path, part / rel)
                entries.append(KitEntry("sdist", rel.as_posix(), got.sha256, got.path.stat().st_size,
                                        f"{spec.name}=={spec.version}"))
                log(f"{label}: sdist {got.path.name} ({_mib(got.path.stat().st_size)})")
            elif isinstance(spec, GitSource):
                checkout = root / spec.path
                repo = checkout if is_checkout(checkout) and has_commit(checkout, spec.commit) else None
                repo = repo or _mirror_with(mirrors, spec)
                if repo is None:
                    raise SourceError(
                        f"{label}: no git objects for {spec.url} @ {spec.commit[:12]}",
                        why=f"{spec.path} is not a checkout holding it, and no mirror in {mirrors.describe()} has it",
                        fix=f"run `kforge sources sync {label}`, or give a mirror (--mirror DIR / $KFORGE_GIT_MIRROR)",
                    )
                rec = gitarchive.write(part / "cache" / gitarchive.SUBDIR, url=spec.url, commit=spec.commit,
                                       top=Path(spec.path).name, repo=repo, mirrors=mirrors,
                                       checkout=checkout if repo == checkout else None,
                                       skip_nested=skip_nested, trim=trim, compression=compression,
                                       substitutes=substitutes)
                rel = Path("cache") / gitarchive.SUBDIR / rec.path.name
                entries.append(KitEntry("git", rel.as_posix(), rec.sha256, rec.size, f"{spec.url}@{spec.commit}"))
                meta = rec.path.with_name(rec.path.name + ".json")
                entries.append(KitEntry("git-meta", (rel.parent / meta.name).as_posix(), sha256_file(meta),
                                        meta.stat().st_size, f"{spec.url}@{spec.commit}"))
                nested_seen.update(n.path for n in rec.nested)
                for n in rec.skipped:
                    notes.append(f"{label}: nested submodule {n.path} @ {n.commit[:12]} left out ({n.skipped})")
                for n in rec.substituted:
                    notes.append(f"{label}: nested submodule {n.path} @ {n.commit[:12]} replaced by the files of "
                                 f"{n.substitute} (--nested-from; not the pinned commit)")
                inside = ", ".join(n.path for n in rec.nested if not n.skipped) or "no nested submodules"
                log(f"{label}: git {spec.commit[:12]} with {inside} ({_mib(rec.size)})")
        unused = [p for p in [*skip_nested, *(substitutes or {})] if p not in nested_seen]
        if unused:
            raise SourceError(f"--skip-nested / --nested-from name no nested submodule of the kit's sources: "
                              f"{', '.join(unused)}",
                              why=f"their nested submodules are: {', '.join(sorted(nested_seen)) or 'none'}",
                              fix="use the submodule's path inside its upstream, e.g. 3rdparty/spdlog")
        if wheels:
            entries += _wheels(part / "wheels", root, target, tuple(extras), extra_requirements, runner, log)
        manifest = KitManifest(tuple(projects), target, tuple(entries),
                               created=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                               notes=tuple(notes), extras=tuple(extras) if wheels else ())
        atomic_write_text(part / MANIFEST, manifest.to_json())
        if out.exists():
            out.rmdir()
        os.replace(part, out)
        os.chmod(out, 0o755)
        return manifest
    finally:
        if part.exists():
            shutil.rmtree(part, ignore_errors=True)


def _mirror_with(mirrors: Mirrors, spec: GitSource) -> Path | None:
    mirror = mirrors.find(spec.url)
    return mirror if mirror is not None and has_commit(mirror, spec.commit) else None


def _wheels(dest: Path, root: Path, target: WheelTarget, extras: tuple[str, ...], extra: Sequence[str],
            runner: Runner, log: Callable[[str], None]) -> list[KitEntry]:
    """kforge's own wheel (built from ``root``) and every dependency (with ``extras``), for ``target``."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kforge-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (root / name).is_file():
                shutil.copy2(root / name, src / name)
        shutil.copytree(root / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        runner([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest),
                str(src)])
    own = sorted(dest.glob("kforge-*.whl"))
    if not own:
        raise SourceError("building kforge's wheel produced no kforge-*.whl", fix="run `pip wheel .` to see why")
    runner([sys.executable, "-m", "pip", "download", "-q", "--dest", str(dest), *target.pip_args(),
            str(own[-1]) + (f"[{','.join(extras)}]" if extras else ""), *extra])
    entries = [KitEntry("wheel", f"wheels/{w.name}", sha256_file(w), w.stat().st_size, w.name)
               for w in sorted(dest.glob("*.whl"))]
    log(f"wheels: {len(entries)} for cp{target.python.replace('.', '')} {target.platform} "
        f"({_mib(sum(e.size for e in entries))})")
    return entries


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


# --------------------------------------------------------------------------- install


def verify(kit: Path) -> KitManifest:
    """Read the manifest and check every file's sha256; a mismatch or a missing file is an error."""
    manifest = KitManifest.read(kit)
    bad = []
    for e in manifest.entries:
        path = Path(kit) / e.path
        if not path.is_file():
            bad.append(f"{e.path}: missing")
        elif sha256_file(path) != e.sha256:
            bad.append(f"{e.path}: sha256 differs from the manifest")
    if bad:
        raise SourceError(f"the kit {kit} is damaged: {len(bad)} file(s) do not match {MANIFEST}",
                          why="\n".join(bad[:10]), fix="copy the kit again, or build a new one")
    return manifest


def install(kit: Path, *, cache_dir: Path, pip: bool = True, runner: Runner = pip_runner,
            python: str = sys.executable) -> KitManifest:
    """Verify the kit, pip-install its wheels offline (``--no-index``), and copy its cache part into ``cache_dir``.

    Files are copied one by one, each atomically (a temp name, then a rename); a file
    already in the cache with the same bytes is left as it is.
    """
    kit = Path(kit).resolve()
    manifest = verify(kit)
    wheels = [e for e in manifest.entries if e.kind == "wheel"]
    if pip and wheels:
        runner([python, "-m", "pip", "install", "--no-index", "--find-links", str(kit / "wheels"),
                manifest.requirement])
    for e in manifest.entries:
        if not e.path.startswith("cache/"):
            continue
        target = Path(cache_dir) / e.path[len("cache/"):]
        if target.is_file() and sha256_file(target) == e.sha256:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kit-", dir=target.parent)
        os.close(fd)
        try:
            shutil.copyfile(kit / e.path, tmp)
            os.chmod(tmp, PUBLIC_FILE_MODE)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return manifest

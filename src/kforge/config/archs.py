"""forge.toml's arch entries: one arch, a project's `archs` (and `default_arch`), its `arch_sets`.

Split out of :mod:`kforge.config.forge` (the file reader), which calls these with its :class:`Reader` so every
error names the key it came from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from kforge.config.model import Platform
from kforge.config.schema import Reader
from kforge.cuda.arch import Arch, parse_arch
from kforge.errors import ArchError


def read_arch(r: Reader, key: str, text: str) -> Arch:
    if isinstance(text, str) and not text.isascii():  # "sm_٩0" would parse as sm_90: ASCII only (kforge.config.inputs)
        raise r.error(key, f"is not a known CUDA arch: {text!r} has a non-ASCII character",
                      fix="write it in plain ASCII, e.g. sm_90a")
    try:
        return parse_arch(text)
    except ArchError as exc:
        raise r.error(key, f"is not a known CUDA arch: {exc.what}", fix=exc.fix) from None


def read_archs(r: Reader, key: str, texts: Sequence[str], default_arch: str | None) -> tuple[tuple[Arch, ...], Arch]:
    """A project's ``archs`` (each once) and its ``default_arch`` (one of them; the last when unset)."""
    archs: list[Arch] = []
    for i, text in enumerate(texts):
        arch = read_arch(r, f"{key}.archs[{i}]", text)
        if any(a.base == arch.base for a in archs):
            raise r.error(f"{key}.archs[{i}]", f"lists {arch.base.sm} twice")
        archs.append(arch)
    if not archs:
        raise r.error(f"{key}.archs", "is empty", fix="list the archs this project can build, e.g. [\"sm_90a\"]")
    default = read_arch(r, f"{key}.default_arch", default_arch) if default_arch else archs[-1]
    if not any(a.base == default.base for a in archs):
        raise r.error(f"{key}.default_arch", f"is {default.sm}, which is not in archs")
    return tuple(archs), next(a for a in archs if a.base == default.base)


def read_arch_sets(r: Reader, key: str, sets: Mapping[str, tuple[str, ...]], archs: tuple[Arch, ...],
               platforms: Mapping[str, Platform]) -> Mapping[str, tuple[Arch, ...]]:
    """``arch_sets = { release = ["sm_80", "sm_90"] }``: each name a target token, each arch a declared one.

    A name that joins its archs with ``+`` (``"sm100+sm120" = ["sm_100f", "sm_120a"]``) lists that several-arch
    build under the id it has anyway (``flashmla-sm100+sm120``): in ``nox -l``, ``kforge targets`` and CI."""
    out: dict[str, tuple[Arch, ...]] = {}
    for name, texts in sets.items():
        where = f"{key}.{name}"
        joined = "+" in name
        if joined:
            if not all(is_arch_spelling(part) for part in name.split("+")):
                raise r.error(where, "is not a valid arch set name: a name with '+' joins archs (sm100+sm120)",
                              fix="spell each part as an arch (sm100), or use a plain name (lower-case letters, digits, '_')")
        elif not name or not name[0].isalpha() or not all(c.isalnum() or c == "_" for c in name) or name != name.lower():
            raise r.error(where, "is not a valid arch set name",
                          fix="use lower-case letters, digits and '_', starting with a letter (it becomes part of target ids)")
        if not joined and is_arch_spelling(name) or name in {n for p in platforms.values() for n in p.suffix_names}:
            raise r.error(where, f"'{name}' reads as an arch or a platform in a target id", fix="pick another name, e.g. release")
        chosen: list[Arch] = []
        for i, text in enumerate(texts):
            arch = read_arch(r, f"{where}[{i}]", text)
            declared = next((a for a in archs if a.base == arch.base), None)
            if declared is None:
                raise r.error(f"{where}[{i}]", f"is {arch.sm}, which is not in {key.rsplit('.', 1)[0]}.archs",
                              fix=f"use archs the project declares: {', '.join(a.sm for a in archs)}")
            if arch.variant and arch.variant != declared.variant:
                raise r.error(f"{where}[{i}]", f"is {arch.sm}, but the project declares {declared.sm}",
                              fix=f"write {declared.sm} (or the plain {declared.base.sm})")
            if any(a.base == declared.base for a in chosen):
                raise r.error(f"{where}[{i}]", f"lists {declared.base.sm} twice")
            chosen.append(declared)
        if not chosen:
            raise r.error(where, "is empty", fix="name at least one arch")
        if joined:
            canonical = "+".join(f"sm{a.number}" for a in sorted(chosen))
            if len(chosen) < 2 or name != canonical:
                raise r.error(where, f"joins archs with '+' but lists {', '.join(a.sm for a in sorted(chosen))}: a '+' "
                              "name must be the id those archs give a target, so that both spellings are one build",
                              fix=f"name it \"{canonical}\"" + (" (with two archs or more)" if len(chosen) < 2 else ""))
        out[name] = tuple(sorted(chosen))
    return MappingProxyType(out)


def is_arch_spelling(text: str) -> bool:
    try:
        parse_arch(text)
    except ArchError:
        return False
    return True

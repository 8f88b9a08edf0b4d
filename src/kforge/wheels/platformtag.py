"""The platform-tag policy: which versioned system symbols a Linux wheel's binaries need, against a manylinux tag.

A project declares the oldest tag its wheels must reach (``platform_tag = "manylinux_2_28"``). auditwheel
refuses such a repair with "too-recent versioned symbols" and no list; this module names them: it reads
each binary's version needs (``.gnu.version_r``, with pyelftools) and compares them with the symbol
versions auditwheel's own policy file allows for that tag and machine, so the error says which library,
which version, and in which binary.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

from kforge.errors import ConfigError

_TAG = re.compile(r"^manylinux_(\d+)_(\d+)$")
_VERSIONED = re.compile(r"^(?P<family>[A-Z_]+?)_(?P<version>\d[\w.]*)$")


def parse_tag(text: str) -> str:
    """``manylinux_2_28`` (with or without ``_x86_64``) -> ``manylinux_2_28``; anything else is a ConfigError."""
    raw = text.strip()
    for machine in ("_x86_64", "_aarch64"):
        if raw.endswith(machine):
            raw = raw[: -len(machine)]
    if not _TAG.match(raw) or raw not in _policies():
        known = ", ".join(sorted(_policies(), key=_glibc))
        raise ConfigError(f"'{text}' is not a manylinux platform tag auditwheel knows",
                          why=f"known tags: {known}", fix="give a PEP 600 tag such as manylinux_2_28")
    return raw


def _glibc(tag: str) -> tuple[int, int]:
    m = _TAG.match(tag)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@lru_cache(maxsize=1)
def _policies() -> dict[str, dict[str, dict[str, list[str]]]]:
    """auditwheel's manylinux policy file: tag -> machine -> family -> allowed versions."""
    text = resources.files("auditwheel.policy").joinpath("manylinux-policy.json").read_text()
    return {p["name"]: p["symbol_versions"] for p in json.loads(text) if _TAG.match(p["name"])}


def _version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.]", version))


@dataclass(frozen=True)
class TooNew:
    binary: str  # the path inside the wheel
    library: str  # libc.so.6
    version: str  # GLIBC_2.34
    allowed: str  # the newest version of that family the tag allows: GLIBC_2.28

    def __str__(self) -> str:
        return f"{self.binary} needs {self.version} from {self.library} (the tag allows up to {self.allowed})"


def version_needs(binary: Path) -> list[tuple[str, str]]:
    """(library, version) pairs a binary's dynamic symbols require, e.g. ("libc.so.6", "GLIBC_2.34")."""
    needs: list[tuple[str, str]] = []
    try:
        with open(binary, "rb") as fh:
            elf = ELFFile(fh)
            for section in elf.iter_sections():
                if isinstance(section, GNUVerNeedSection):
                    for verneed, auxes in section.iter_versions():
                        for aux in auxes:
                            needs.append((verneed.name, aux.name))
    except ELFError:
        return []
    return needs


def too_new(binary: Path, name: str, tag: str, machine: str = "x86_64") -> list[TooNew]:
    """The versioned symbols of ``binary`` that ``tag`` does not allow on ``machine``."""
    allowed = _policies()[parse_tag(tag)].get(machine, {})
    found: list[TooNew] = []
    for library, version in version_needs(binary):
        m = _VERSIONED.match(version)
        if not m or m.group("family") not in allowed:
            continue  # a library's private version (e.g. libcudart's): not the policy's business
        family, ver = m.group("family"), m.group("version")
        versions = allowed[family]
        if ver not in versions and all(_version_key(ver) > _version_key(v) for v in versions if v[0].isdigit()):
            newest = max((v for v in versions if v[0].isdigit()), key=_version_key)
            found.append(TooNew(name, library, version, f"{family}_{newest}"))
    return sorted(set(found), key=lambda t: (t.binary, t.library, _version_key(t.version.partition("_")[2])))


def split_plat(plat: str) -> tuple[str, str]:
    """``manylinux_2_28_x86_64`` -> (``manylinux_2_28``, ``x86_64``)."""
    for machine in ("x86_64", "aarch64"):
        if plat.endswith("_" + machine):
            return parse_tag(plat[: -len(machine) - 1]), machine
    raise ConfigError(f"'{plat}' names no machine", fix="give a tag such as manylinux_2_28_x86_64")


def wheel_tag(tag: str, machine: str) -> str:
    """auditwheel's ``--plat`` value: ``manylinux_2_28_x86_64``."""
    return f"{parse_tag(tag)}_{machine}"

"""Strict input at the edge: what a user types (CLI arguments, KFORGE_* variables) is checked once, here.

One rule per kind of input, applied before any command runs:

- **ids** (targets, project names): ASCII letters, digits and ``. _ + -``; no spaces.
- **arch spellings**: ASCII (``sm_90a``, ``9.0``; the arch table then decides what it means).
- **versions** (``--upstream-version``, ``--sdist-version``, git revisions): ASCII, no spaces.
- **CUDA versions** (``--cuda``, ``KFORGE_CUDA``): a CUDA release kforge knows (:data:`CUDA_RELEASES`);
  another one only with ``--allow-unknown-cuda`` (or ``KFORGE_ALLOW_UNKNOWN_CUDA=1``), on purpose.
- **paths** (``--wheelhouse``, ``-C``, ``--tree``, ...): ASCII, so that build tools (nvcc, CMake, MSVC)
  that mangle other characters never see one.

Why ASCII: ``int("٩٠")`` is 90 and ``"sm_٩٠"`` would quietly be sm_90; a non-breaking space pasted from
a web page looks like a space and is not one. Such input is refused with the position of the character.
"""

from __future__ import annotations

import argparse
import re
import unicodedata
from collections.abc import Mapping

from packaging.version import Version

from kforge.cuda.arch import as_cuda_version
from kforge.errors import ArchError, ConfigError, KforgeError, TargetError, ToolchainError

#: CUDA toolkit releases (major.minor) kforge knows exist. 12.7 was never released.
CUDA_RELEASES: tuple[Version, ...] = tuple(Version(v) for v in (
    "11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8",
    "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9",
    "13.0", "13.1", "13.2", "13.3", "13.4", "13.5",
))
ALLOW_UNKNOWN_CUDA_ENV = "KFORGE_ALLOW_UNKNOWN_CUDA"

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII without spaces

# argparse attribute -> kind of input
_IDS = ("target", "project", "projects", "targets")
_ARCHS = ("arch", "expect_arch")
_VERSIONS = ("upstream_version", "sdist_version", "rev", "base", "branch")
_PATHS = ("root", "wheelhouse", "tree", "repo", "path", "dest_dir", "sources", "wheel")


def _non_ascii(text: str) -> tuple[int, str] | None:
    for i, ch in enumerate(text):
        if not ch.isascii():
            return i, f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed character')}"
    return None


def ascii_only(text: str, what: str, error: type[KforgeError], fix: str) -> str:
    """``text`` if it is ASCII, else ``error`` naming the character and where it sits."""
    bad = _non_ascii(text)
    if bad is not None:
        pos, name = bad
        raise error(f"{what} {text!r} has a non-ASCII character at position {pos + 1} ({name})",
                    why="kforge takes ASCII only here, so that look-alike characters never stand for others",
                    fix=fix)
    return text


def check_id(text: str, what: str = "the target id") -> str:
    ascii_only(text, what, TargetError, "retype it in plain ASCII, e.g. fmha-sm90")
    if not _ID.fullmatch(text):
        raise TargetError(f"{what} {text!r} is not an id",
                          why="ids are letters, digits and . _ + - (no spaces), starting with a letter or digit",
                          fix="run `kforge targets` to list the valid ones")
    return text


def check_arch(text: str) -> str:
    return ascii_only(text, "the arch", ArchError, "write it like sm_90a, 90a or 9.0")


def check_version(text: str, what: str) -> str:
    ascii_only(text, what, ConfigError, "retype it in plain ASCII, e.g. 2.8.3")
    if not _TOKEN.fullmatch(text):
        raise ConfigError(f"{what} {text!r} is not a version or revision", fix="write it without spaces, e.g. 2.8.3")
    return text


def check_path(text: str, what: str) -> str:
    return ascii_only(str(text), what, ConfigError,
                      "use a folder whose path is plain ASCII (nvcc, CMake and MSVC mangle other characters)")


#: What a user may write for a CUDA version: 12.8, 12.8.1 or cu128 (nvcc's own "V13.0.88" is parsed elsewhere).
CUDA_VERSION_FORM = re.compile(r"\d+\.\d+(\.\d+)?|cu\d{2,3}")


def check_cuda(text: str, *, allow_unknown: bool = False, source: str = "--cuda") -> Version:
    """A CUDA version as ``major.minor``; unknown releases only with ``allow_unknown``."""
    ascii_only(text, f"{source}", ToolchainError, "write the CUDA version like 12.8 or 13.0")
    if not CUDA_VERSION_FORM.fullmatch(text.strip()):
        raise ToolchainError(f"{source}={text!r} is not a CUDA version",
                             why="a CUDA version is MAJOR.MINOR or MAJOR.MINOR.PATCH (12.8, 12.8.1), or a tag like cu128",
                             fix="write it like 12.8, 12.8.1 or cu128")
    try:
        version = as_cuda_version(text)
    except ToolchainError as exc:
        raise ToolchainError(f"{source}={text!r}: {exc.what}", fix=exc.fix) from None
    if version not in CUDA_RELEASES and not allow_unknown:
        known = ", ".join(str(v) for v in CUDA_RELEASES)
        raise ToolchainError(f"{source}={text!r}: CUDA {version} is not a CUDA release kforge knows",
                             why=f"known releases: {known}",
                             fix=f"pick one of those; to build with an unreleased or newer toolkit on purpose, "
                                 f"add --allow-unknown-cuda (or set {ALLOW_UNKNOWN_CUDA_ENV}=1)")
    return version


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def check_args(args: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Apply the rules above to every argument a kforge command parsed, and to the KFORGE_* inputs."""
    values = vars(args)

    def each(name: str) -> list[str]:
        value = values.get(name)
        if value is None:
            return []
        return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]

    for name in _IDS:
        for text in each(name):
            check_id(text, "the target id" if name.startswith("target") else "the project name")
    for name in _ARCHS:
        for text in each(name):
            check_arch(text)
    for name in _VERSIONS:
        for text in each(name):
            check_version(text, f"--{name.replace('_', '-')}")
    for name in _PATHS:
        for text in each(name):
            check_path(text, f"the path {'-C/--root' if name == 'root' else '--' + name.replace('_', '-')}")
    allow = bool(values.get("allow_unknown_cuda")) or _truthy(environ.get(ALLOW_UNKNOWN_CUDA_ENV))
    if values.get("cuda"):
        check_cuda(str(values["cuda"]), allow_unknown=allow)
    elif environ.get("KFORGE_CUDA") and "cuda" in values:
        check_cuda(environ["KFORGE_CUDA"], allow_unknown=allow, source="KFORGE_CUDA")

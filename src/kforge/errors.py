"""Error classes, one per kind of failure, each with its own exit code.

A :class:`KforgeError` is a *user* error: the CLI prints ``what``, ``why`` and ``fix``
as one paragraph and exits with :attr:`exit_code`, without a traceback (``--verbose``
shows it). Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class KforgeError(Exception):
    """Base class. ``what`` happened, ``why``, and what to do (``fix``)."""

    exit_code = 1
    kind = "error"

    def __init__(self, what: str, *, why: str | None = None, fix: str | None = None) -> None:
        self.what = what.strip()
        self.why = why.strip() if why else None
        self.fix = fix.strip() if fix else None
        super().__init__(self.render())

    def render(self) -> str:
        """One paragraph: what happened. Why. What to do."""
        parts = [self.what.rstrip(".") + "."]
        parts += [_sentence(p.rstrip(".") + ".") for p in (self.why, self.fix) if p]
        return " ".join(parts)


def _sentence(text: str) -> str:
    """Capitalise a plain first word ("install" -> "Install"), never a name ("sm_103a", "forge.toml")."""
    first = text.split(" ", 1)[0]
    if not (first.isalpha() and first.islower()) or first in _NAMES:
        return text
    return text[:1].upper() + text[1:]


#: Words that stay as written at the start of a sentence: commands and project names.
_NAMES = frozenset({"kforge", "nox", "pip", "git", "invoke", "nvcc", "cmake", "auditwheel", "delvewheel", "ccache",
                    "fmha", "flashmla", "flashinfer"})


class ConfigError(KforgeError):
    """forge.toml is malformed: unknown key, wrong type, duplicate project, unknown arch."""

    exit_code = 2
    kind = "config"


class TargetError(KforgeError):
    """A target id that names no known project, arch or platform, or a combination not in the matrix."""

    exit_code = 3
    kind = "target"


class ArchError(TargetError):
    """An arch spelling that kforge cannot parse, or an arch a project does not support."""

    kind = "arch"


class ToolchainError(KforgeError):
    """nvcc/torch/compiler missing or too old for what the plan asks."""

    exit_code = 4
    kind = "toolchain"


class SourceError(KforgeError):
    """Upstream source missing, dirty, at the wrong commit, or an sdist with the wrong sha256."""

    exit_code = 5
    kind = "source"


class PatchError(KforgeError):
    """A patch series that does not apply (the tree is restored before this is raised)."""

    exit_code = 6
    kind = "patch"


class BuildError(KforgeError):
    """The compile itself failed."""

    exit_code = 7
    kind = "build"


class RepairError(KforgeError):
    """auditwheel/delvewheel could not repair the wheel."""

    exit_code = 8
    kind = "repair"


class DoctorError(KforgeError):
    """The wheel does not contain what it must (an expected arch, resolved symbols, allowed libs)."""

    exit_code = 9
    kind = "doctor"


class GPUError(KforgeError):
    """No usable GPU where one is required."""

    exit_code = 10
    kind = "gpu"


class GpuTestError(KforgeError):
    """A target's GPU tests ran and failed (or could not be installed to run)."""

    exit_code = 12
    kind = "gpu test"


class PublishError(KforgeError):
    """The wheelhouse could not take the wheel (nothing half-published is left behind)."""

    exit_code = 11
    kind = "publish"


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 3) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choices, or ``""``."""
    matches: Sequence[str] = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    if not matches:
        return ""
    if len(matches) == 1:
        return f" (did you mean '{matches[0]}'?)"
    return " (did you mean " + ", ".join(f"'{m}'" for m in matches) + "?)"


def decode_utf8(raw: bytes, path: object, error: type[KforgeError] = ConfigError) -> str:
    """``raw`` as UTF-8 text, or ``error`` naming the file and the byte offset of the first bad byte.

    A UTF-8 BOM is dropped; a UTF-16 one (a Windows editor's "Unicode") is named as such.
    """
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start:exc.start + 1]
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        why = ("it starts with a UTF-16 byte-order mark (saved as 'Unicode' by a Windows editor?)" if utf16
               else f"byte {exc.start} (0x{bad.hex()}) {exc.reason}")
        raise error(f"{path} is not UTF-8 text: byte offset {exc.start}", why=why,
                    fix="save the file as UTF-8 (the byte offset above is where the first bad byte sits)") from None


#: What to do when the disk says no (errno -> advice).
_OS_FIXES = {
    28: "free space on that disk, or point kforge at another folder",
    30: "the file system is read-only: remount it read-write, or point kforge at another folder",
    13: "make the folder writable by this user, or point kforge at another folder",
    1: "make the folder writable by this user, or point kforge at another folder",
    122: "the disk quota is used up: free space, or point kforge at another folder",
    24: "too many open files: raise `ulimit -n`",
}


def os_fix(errno: int | None) -> str:
    """The advice for an OSError's errno."""
    return _OS_FIXES.get(errno or 0, "check the path, its permissions and its disk")


def as_error(exc: OSError) -> KforgeError:
    """An OSError no step turned into a better error: one paragraph with the file and what to do."""
    where = f" ({exc.filename})" if exc.filename else ""
    return KforgeError(f"{exc.strerror or exc}{where}", why="the operating system refused a file operation",
                       fix=os_fix(exc.errno))

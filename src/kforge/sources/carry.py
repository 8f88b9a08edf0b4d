"""A patch that carries files of ours into an upstream tree as new files, in ``git format-patch`` form.

Some of our code lives in this repository and is also needed inside an upstream project's build (kforge's
own ``kernels/fmha`` kernels in FlashMLA's sm_120 dense prefill, patches/flashmla). The patch series is
the only place our changes to upstream live (docs/patches.md), so such files are carried by a patch that
creates them. Written by hand, that patch drifts from the files it copies; rendered by
:func:`render_new_files_patch` from the files themselves, it can be regenerated and compared byte for byte
(a unit test does, so an edit to the originals without regenerating fails).

The output is deterministic: fixed author, date and a zero commit id (as the series' other patches), the
files in the order given, ``index`` lines with git's blob ids, so ``git apply`` and ``git am`` take it and
the same inputs always give the same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kforge.errors import PatchError

AUTHOR = "kforge <kforge@users.noreply.invalid>"
DATE = "Mon, 23 Nov 2026 01:25:05 +0000"  # the series' other patches carry this date


@dataclass(frozen=True)
class CarriedFile:
    """One new file of the patch: its path in the upstream tree and its bytes (UTF-8 text)."""

    path: str
    data: bytes


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob of these bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _file_diff(f: CarriedFile) -> list[str]:
    try:
        text = f.data.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchError(f"{f.path} is not UTF-8 text", fix="carry only text files (sources, headers)") from None
    if "\r" in text:
        raise PatchError(f"{f.path} has carriage returns", fix="convert it to LF line endings before carrying it")
    out = [f"diff --git a/{f.path} b/{f.path}", "new file mode 100644", f"index 0000000..{git_blob_id(f.data)[:7]}"]
    if not text:
        return out
    lines = text.split("\n")
    missing_newline = lines[-1] != ""
    if not missing_newline:
        lines = lines[:-1]
    count = f"+1,{len(lines)}" if len(lines) != 1 else "+1"
    out += ["--- /dev/null", f"+++ b/{f.path}", f"@@ -0,0 {count} @@"]
    out += ["+" + line for line in lines]
    if missing_newline:
        out.append("\\ No newline at end of file")
    return out


def _line_count(f: CarriedFile) -> int:
    text = f.data.decode("utf-8")
    return text.count("\n") + (0 if not text or text.endswith("\n") else 1)


def render_new_files_patch(files: Sequence[CarriedFile], subject: str, body: str = "") -> str:
    """A ``git format-patch`` file that creates ``files`` (none of which may exist upstream)."""
    if not files:
        raise PatchError("a carry patch needs at least one file", fix="list the files to carry")
    paths = [f.path for f in files]
    dupes = sorted({p for p in paths if paths.count(p) > 1})
    if dupes:
        raise PatchError(f"a carry patch lists {', '.join(dupes)} twice", fix="carry each file once")
    for p in paths:
        if p.startswith("/") or ".." in p.split("/") or not p or " " in p:
            raise PatchError(f"'{p}' is not a relative path inside the upstream tree",
                             fix="write paths like csrc/sm120/prefill/dense/x.h")
    diffs = [line for f in files for line in _file_diff(f)]
    everything = subject + body + "\n".join(diffs)
    head = ["From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001", f"From: {AUTHOR}", f"Date: {DATE}",
            f"Subject: [PATCH] {subject}"]
    if not everything.isascii():  # as git format-patch marks a UTF-8 message or diff
        head += ["MIME-Version: 1.0", "Content-Type: text/plain; charset=UTF-8", "Content-Transfer-Encoding: 8bit"]
    counts = [_line_count(f) for f in files]
    width = max(len(p) for p in paths)
    stat = [f" {p.ljust(width)} | {n}" for p, n in zip(paths, counts, strict=True)]
    total = sum(counts)
    stat.append(f" {len(files)} file{'s' if len(files) != 1 else ''} changed, {total} insertion{'s' if total != 1 else ''}(+)")
    stat += [f" create mode 100644 {p}" for p in paths]
    msg = [""] + (body.rstrip("\n").split("\n") if body.strip() else []) + ["---", *stat, ""]
    return "\n".join([*head, *msg, *diffs, "-- ", "kforge", "", ""])

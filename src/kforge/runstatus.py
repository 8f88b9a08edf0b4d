"""The outcome of each kforge run, kept for a CI step to read: which kind of failure, past nox's exit 1.

nox turns every failed command into exit code 1, so a workflow step can't tell a toolchain error from
failed GPU tests by the exit code. When ``KFORGE_STATUS_FILE`` is set (the generated workflow sets
it, and nox passes the environment through to kforge), every ``kforge`` run that fails with a kforge
error appends one JSON line to that file: the command, the exit code, the error kind and its message.
``kforge ci summary`` reads the last line and, with GitHub's ``job.status``, writes the job summary
("toolchain error", "GPU tests failed", or "failed outside kforge" when no kforge error was recorded).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from kforge.errors import (
    ArchError,
    BuildError,
    ConfigError,
    DoctorError,
    GPUError,
    GpuTestError,
    KforgeError,
    PatchError,
    PublishError,
    RepairError,
    SourceError,
    TargetError,
    ToolchainError,
)

STATUS_ENV = "KFORGE_STATUS_FILE"

#: What a job summary calls each error kind (the kinds are kforge.errors' ``kind`` attributes).
HEADLINES = {
    cls.kind: text
    for cls, text in (
        (ConfigError, "configuration error"),
        (TargetError, "unknown target"),
        (ArchError, "arch not supported"),
        (ToolchainError, "toolchain error"),
        (SourceError, "source error"),
        (PatchError, "patch series does not apply"),
        (BuildError, "build failed"),
        (RepairError, "wheel repair failed"),
        (DoctorError, "wheel check (doctor) failed"),
        (GPUError, "no usable GPU"),
        (GpuTestError, "GPU tests failed"),
        (PublishError, "publish failed"),
        (KforgeError, "kforge error"),
    )
}


@dataclass(frozen=True)
class RunStatus:
    command: str  # "build fmha-sm90"
    exit_code: int
    kind: str  # "ok", or an error kind ("toolchain", "gpu test", ...)
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def headline(self) -> str:
        if self.ok:
            return "passed"
        return f"{HEADLINES.get(self.kind, self.kind + ' error')} (exit {self.exit_code})"


def record(environ: Mapping[str, str], status: RunStatus) -> Path | None:
    """Append ``status`` to ``$KFORGE_STATUS_FILE`` (one JSON line); do nothing when it is unset.

    A status file that can't be written never changes the outcome of the run it describes.
    """
    target = environ.get(STATUS_ENV, "").strip()
    if not target:
        return None
    path = Path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(status)) + "\n")
    except OSError:
        return None
    return path


def read(path: Path) -> tuple[RunStatus, ...]:
    """Every run recorded in ``path``, oldest first; lines that aren't status records are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return ()
    out = []
    for line in lines:
        try:
            raw = json.loads(line)
            out.append(RunStatus(command=str(raw["command"]), exit_code=int(raw["exit_code"]), kind=str(raw["kind"]),
                                 message=str(raw.get("message", ""))))
        except (ValueError, KeyError, TypeError):
            continue
    return tuple(out)


def summarize(job: str, runs: tuple[RunStatus, ...], job_status: str | None) -> str:
    """The job summary in Markdown: a headline from the last recorded kforge error, then each record.

    ``job_status`` is GitHub's ``job.status`` (success, failure, cancelled). Only failures are
    recorded, and a job stops at its first failed step, so a failed job with no record failed
    outside kforge (nox, pip, an action, or a kforge crash with a traceback), and says so.
    """
    last = runs[-1] if runs else None
    if job_status == "cancelled":
        head = "cancelled"
    elif last is not None and not last.ok:
        head = last.headline
    elif job_status == "failure":
        head = "failed outside kforge (nox, pip, an action, or a crash: see the step log)"
    else:
        head = "passed"
    lines = [f"### {job}: {head}", ""]
    for run in runs:
        lines.append(f"- `kforge {run.command}`: {run.headline}" + (f": {run.message}" if run.message else ""))
    return "\n".join(lines) + "\n"

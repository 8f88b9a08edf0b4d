"""The delvewheel repairer (Windows wheels; delvewheel runs on Linux too): ``--exclude`` per policy pattern,
``--add-path`` for the libraries' folders."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kforge.config.repairpolicy import RepairPolicy
from kforge.wheels.repairkit import Prepared, RepairResult


class Delvewheel:
    name = "delvewheel"

    def prepare(self, wheel: Path, work: Path, members: list[str], *, plat: str | None,
                platform_policy: str | None) -> Prepared:
        return Prepared(wheel, members, None)

    def command(self, wheel: Path, out: Path, *, python: str, plat: str | None, policy: RepairPolicy,
                paths: Sequence[str], env: dict[str, str]) -> list[str]:
        cmd = [python, "-m", "delvewheel", "repair", "-w", str(out)]
        for pattern in policy.windows_exclude:
            cmd += ["--exclude", pattern]
        if paths:
            cmd += ["--add-path", os.pathsep.join(paths)]
        return [*cmd, str(wheel)]

    def failed(self, wheel: Path, out_dir: Path, *, code: int, log: str, plat: str | None,
               cmd: Sequence[str]) -> RepairResult | None:
        return None

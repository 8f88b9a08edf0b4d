"""What a wheel is judged against (repair policy, expected archs, exact or not), and where that comes from.

A build records its judgement in the wheel's manifest (``doctor.judged_by``), so ``kforge doctor``
run later on the published wheel judges it the way the build did: the same repair policy (a torch
extension's ``libcudart.so.13`` comes from torch, not the wheel), the same archs, exact or not.
Older manifests without it still name the project and the torch the wheel was built against.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kforge.config.repairpolicy import RepairPolicy, default_policy
from kforge.errors import DoctorError


@dataclass(frozen=True)
class Judgement:
    policy: RepairPolicy  # what may stay out of the wheel (torch's libraries, the driver, a shared cudart)
    expect: tuple[str, ...] = ()  # sm_90, compute_90, ...
    exact: bool = False
    exact_ptx: bool = True  # with exact: PTX judged too (kforge.cuda.enforce: only where the wrapper rewrote)
    stripped: bool = False  # no binary of the wheel's own may keep host debug info (the plan's strip_debug)
    ptxas_threads: int | None = None  # > 1: every recorded ptxas ran with -split-compile N (the plan's ptxas_threads)
    source: str = ""  # where it came from, for the report ("manifest <name>", "forge.toml project")

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.name, "exclude": list(self.policy.exclude), "torch_free": self.policy.torch_free,
                "expect": list(self.expect), "exact": self.exact, "exact_ptx": self.exact_ptx, "stripped": self.stripped,
                "ptxas_threads": self.ptxas_threads}

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any], source: str) -> Judgement:
        judged = (data.get("doctor") or {}).get("judged_by")
        project = str(data.get("project") or "default")
        if isinstance(judged, Mapping):
            policy = RepairPolicy(exclude=tuple(judged.get("exclude") or ()), name=str(judged.get("policy") or project),
                                  torch_free=bool(judged.get("torch_free")))  # manifests before it: not checked
            return cls(policy=policy, expect=tuple(judged.get("expect") or ()), exact=bool(judged.get("exact")),
                       exact_ptx=bool(judged.get("exact_ptx", True)), stripped=bool(judged.get("stripped")),
                       ptxas_threads=judged.get("ptxas_threads") or None, source=source)
        torch = (data.get("toolchain") or {}).get("torch") is not None  # older manifests: built against torch or not
        return cls(policy=default_policy(project, torch=torch, cudart_shared=torch),
                   expect=tuple(data.get("archs") or ()), source=source)


def manifest_for(wheel: Path) -> Path | None:
    """The wheelhouse manifest published next to ``wheel`` (``<wheel>.manifest.json``), if any."""
    path = Path(str(wheel) + ".manifest.json")
    return path if path.is_file() else None


def from_manifest_file(path: Path) -> Judgement:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DoctorError(f"cannot read the wheel's manifest {path}", why=str(exc),
                          fix="republish the wheel with kforge, or pass --policy/--expect-arch yourself") from exc
    if not isinstance(data, Mapping):
        raise DoctorError(f"{path} is not a kforge manifest", why="it holds no JSON object",
                          fix="republish the wheel with kforge, or pass --policy/--expect-arch yourself")
    return Judgement.from_manifest(data, f"manifest {Path(path).name}")


def with_overrides(base: Judgement, *, expect: Sequence[str] = (), exact: bool | None = None,
                   stripped: bool | None = None) -> Judgement:
    """Flags given on the command line win over the manifest's."""
    return Judgement(policy=base.policy, expect=tuple(expect) or base.expect, exact=base.exact if exact is None else exact,
                     exact_ptx=True if exact or expect else base.exact_ptx,
                     stripped=base.stripped if stripped is None else stripped, ptxas_threads=base.ptxas_threads,
                     source=base.source)

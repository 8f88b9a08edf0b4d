"""A build's inputs as one hash: what a release compares to skip a build whose wheel is already published.

The hash covers what decides the wheel's bytes: the target, the source's identity (commit, sdist sha256,
or the content hash of a local tree), the selected patches, the archs, the variant (CUDA, torch, Python),
the build environment less the job counts and machine paths, the nvcc flags, backend, repair policy,
platform tag, image, arch enforcement and kforge's version. It leaves out what only changes how fast a build runs
(MAX_JOBS, nvcc threads) and where (the work dir, the nvcc path), since builds are reproducible
(kforge.build.reproducible): same inputs, same wheel.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kforge import __version__
from kforge.plan import Plan

#: Variables of the plan's environment that only say how fast or where: not inputs.
_NOT_INPUTS = ("MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "CUDA_HOME", "CUDACXX", "CUDA_PATH")


def inputs(plan: Plan, source_identity: str) -> dict[str, Any]:
    """The inputs, as the JSON the hash is taken of (readable, for a diff when two hashes differ)."""
    data = plan.to_dict()
    tc = data["toolchain"]
    skip = set(_NOT_INPUTS) | set(plan.jobs.thread_vars)
    return {
        "kforge": __version__,
        "target": data["target"],
        "source": {"kind": plan.source_kind, "identity": source_identity},
        "patches": data["patches"],
        "arch": data["arch"],
        "variant": data["variant"],
        "toolchain": {"cuda": tc["cuda"], "torch": tc["torch"], "python": tc["python"]},
        "env": {k: v for k, v in data["env"].items() if k not in skip},
        "nvcc_flags": data["nvcc_flags"],
        "backend": data["backend"],
        "build_dir": data["build_dir"],
        "build_isolation": data["build_isolation"],
        "profile": data["profile"],
        "local_version": data["local_version"],
        "repair": data["repair"],
        "platform": data["platform"],
        "platform_tag": data["platform_tag"],
        "image": data["image"],
        "arch_enforce": data.get("arch_enforce"),  # the nvcc wrapper rewrites the compile flags
    }


def inputs_hash(plan: Plan, source_identity: str) -> str:
    """sha256 of :func:`inputs` as canonical JSON."""
    text = json.dumps(inputs(plan, source_identity), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()

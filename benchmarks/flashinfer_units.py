"""Benchmark: how big FlashInfer's `full` AOT build is for one arch, and what its units cost (issue 33, item 3).

FlashInfer's jit-cache build compiles whatever its own generator lists. This script runs that generator
(``flashinfer.aot.gen_all_modules`` with ``get_default_config()``, the ``full`` profile) from a FlashInfer source
tree, for the arch list in ``FLASHINFER_CUDA_ARCH_LIST``. The tree is a kit's or a checkout's; nothing of it is
copied here. The script then counts the compile units per family. With ``--sample K`` it also compiles K seeded
random units of each large family (100 units or more), each through FlashInfer's own ``build.ninja``, one ninja
target at a time, and times them. The results are in docs/matrix-build-times.md.

It needs an interpreter with torch (CPU torch is enough) and apache-tvm-ffi, and nvcc on PATH. FlashInfer's
sources include CUDA's curand and cublasLt headers, which a bare toolkit may lack: the ``nvidia-*-cu13`` wheels
have them (put them where nvcc looks, for the sample only)::

    FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_NVCC_THREADS=1 \\
        python benchmarks/flashinfer_units.py SRC_TREE WORK_DIR --sample 3 --jobs 2 > units.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: Families with at least this many units are sampled (the rest are a few percent of the build).
SAMPLED_FAMILY = 100


def family(module: str) -> str:
    """``batch_prefill_with_kv_cache_dtype_..._sm90`` -> ``batch_prefill``: the generator's module kind."""
    return re.split(r"_with_|_input_|_dtype|_\d", module)[0]


def generate(root: Path, work: Path) -> list:
    """FlashInfer's own list of AOT modules for the ``full`` profile, generated sources under ``work``."""
    sys.path.insert(0, str(root))
    from flashinfer import aot  # noqa: PLC0415 (the tree given on the command line)
    from flashinfer.jit import env as jit_env  # noqa: PLC0415

    jit_env.FLASHINFER_CSRC_DIR = root / "csrc"
    jit_env.FLASHINFER_INCLUDE_DIR = root / "include"
    jit_env.CUTLASS_INCLUDE_DIRS = [root / "3rdparty/cutlass/include", root / "3rdparty/cutlass/tools/util/include"]
    jit_env.SPDLOG_INCLUDE_DIR = root / "3rdparty/spdlog/include"
    jit_env.CCCL_INCLUDE_DIRS = [root / "3rdparty/cccl" / d for d in ("cub", "libcudacxx/include", "thrust")]
    jit_env.FLASHINFER_WORKSPACE_DIR = work
    jit_env.FLASHINFER_JIT_DIR = work / "cached_ops"
    jit_env.FLASHINFER_GEN_SRC_DIR = work / "generated"
    for d in (jit_env.FLASHINFER_JIT_DIR, jit_env.FLASHINFER_GEN_SRC_DIR):
        d.mkdir(parents=True, exist_ok=True)
    c = aot.get_default_config()
    return aot.gen_all_modules(
        c["f16_dtype"], c["f8_dtype"], c["fa2_head_dim"], c["fa3_head_dim"], c["use_sliding_window"],
        c["use_logits_soft_cap"], aot.detect_sm_capabilities(), c["add_comm"], c["add_gemma"], c["add_oai_oss"],
        c["add_moe"], c["add_act"], c["add_misc"], c["add_xqa"],
    )


def compile_one(spec, source: Path) -> dict:
    """Compile one unit of ``spec`` through its build.ninja; seconds and return code."""
    spec.write_ninja()
    target = next(
        line.split(": ", 1)[0][len("build "):]
        for line in spec.ninja_path.read_text().splitlines()
        if line.startswith("build ") and line.rstrip().endswith(str(source))
    )
    start = time.monotonic()
    done = subprocess.run(["ninja", "-C", str(spec.build_dir), "-j1", target], capture_output=True, text=True)
    return {"module": spec.name, "family": family(spec.name), "unit": Path(target).name,
            "seconds": round(time.monotonic() - start, 1), "rc": done.returncode,
            "error": done.stdout[-600:] if done.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="a FlashInfer source tree (with 3rdparty/cutlass, cccl)")
    ap.add_argument("work", type=Path, help="where the generated sources and build folders go")
    ap.add_argument("--sample", type=int, default=0, help="units to compile from each large family")
    ap.add_argument("--jobs", type=int, default=2, help="units compiled at once")
    ap.add_argument("--seed", type=int, default=33)
    args = ap.parse_args(argv)
    if "FLASHINFER_CUDA_ARCH_LIST" not in os.environ:
        print("error: set FLASHINFER_CUDA_ARCH_LIST (e.g. 9.0a): the generator's module list depends on it",
              file=sys.stderr)
        return 2
    specs = generate(args.root.resolve(), args.work.resolve())
    units = [(s, src) for s in specs for src in s.sources if str(src).endswith((".cu", ".cpp", ".cc"))]
    by_family: dict[str, list] = collections.defaultdict(list)
    for item in units:
        by_family[family(item[0].name)].append(item)
    out = {"arch_list": os.environ["FLASHINFER_CUDA_ARCH_LIST"], "modules": len(specs), "units": len(units),
           "families": {f: len(v) for f, v in sorted(by_family.items(), key=lambda kv: -len(kv[1]))}, "sample": []}
    if args.sample:
        rng = random.Random(args.seed)
        chosen = [x for f in sorted(by_family) if len(by_family[f]) >= SAMPLED_FAMILY
                  for x in rng.sample(by_family[f], min(args.sample, len(by_family[f])))]
        with ThreadPoolExecutor(args.jobs) as pool:
            out["sample"] = list(pool.map(lambda item: compile_one(*item), chosen))
    print(json.dumps(out, indent=1))
    return 1 if any(r["rc"] for r in out["sample"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""nvcc's command line, read: which words are options with values, which are inputs, what a step does.

The vocabulary :mod:`kforge.cuda.nvccwrap` rewrites with: every spelling of the arch, thread and split-compile
options, the host-only and device-only switches, and :func:`parse`, which splits a command line into them. Like the
wrapper, it imports only the standard library: it runs once per compile unit.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Options whose value is the next word (or follows ``=``) and is never an input file or an arch flag.
VALUE_OPTIONS = frozenset({
    "-o", "--output-file", "-Xcompiler", "--compiler-options", "-Xptxas", "--ptxas-options", "-Xlinker",
    "--linker-options", "-Xnvlink", "--nvlink-options", "-Xfatbin", "--fatbin-options", "-Xarchive",
    "--archive-options", "-MF", "-MT", "-MQ", "--dependency-output", "--dependency-target-name", "-ccbin",
    "--compiler-bindir", "-I", "--include-path", "-isystem", "--system-include", "-L", "--library-path",
    "-l", "--library", "-D", "--define-macro", "-U", "--undefine-macro", "-include", "--pre-include",
    "-x", "--x", "-odir", "--output-directory", "-std", "--std", "-maxrregcount", "--maxrregcount",
    "-rdc", "--relocatable-device-code", "-Werror", "-diag-suppress", "--diag-suppress", "-optf",
    "--options-file", "-time", "--time", "-split-compile", "--split-compile", "-default-stream",
    "--default-stream", "-Xcudafe", "-keep-dir", "--keep-dir", "-arbin", "--archiver-binary",
})  # fmt: skip
GENCODE = ("-gencode", "--generate-code")
ARCH = ("-arch", "--gpu-architecture")
CODE = ("-code", "--gpu-code")
THREADS = ("-t", "--threads")
HOST_ONLY = frozenset({
    "-E", "--preprocess", "-M", "-MM", "--generate-dependencies", "--generate-nonsystem-dependencies",
    "-V", "--version", "-h", "--help", "--list-gpu-arch", "-arch-ls", "--list-gpu-code", "-code-ls",
    "-lib", "--lib",
})  # fmt: skip
COMPILE_ONLY = frozenset({"-c", "--compile", "-dc", "--device-c", "-dw", "--device-w", "-ptx", "--ptx",
                           "-cubin", "--cubin", "-fatbin", "--fatbin", "-optix-ir", "--optix-ir"})
DEVICE_ONLY = frozenset({"-dc", "--device-c", "-dw", "--device-w", "-ptx", "--ptx", "-cubin", "--cubin",
                          "-fatbin", "--fatbin", "-dlink", "--device-link"})
INPUT = re.compile(r"\.(cu|o|obj|a|lib|so|ptx|cubin|fatbin|cpp|cc|cxx|c|C)$")
ARCH_NAME = re.compile(r"^(?:sm|compute|lto)_(\d+)([a-z]?)$")
SPECIAL = ("all", "all-major", "native")


def split_gencode(value: str) -> tuple[str, tuple[str, ...]]:
    """``arch=compute_90,code=[sm_90,compute_90]`` -> ``("compute_90", ("sm_90", "compute_90"))``."""
    text = value.strip().strip("'\"")
    m = re.match(r"^arch=([^,]+),code=(.+)$", text)
    if not m:
        raise ValueError(f"cannot read -gencode value {value!r} (expected arch=compute_XY,code=sm_XY)")
    return m.group(1).strip(), codes(m.group(2))


def codes(value: str) -> tuple[str, ...]:
    text = value.strip().strip("'\"").strip("[]").strip("'\"")
    return tuple(c.strip().strip("'\"") for c in text.split(",") if c.strip())


def option(words: Sequence[str], i: int, names: Sequence[str]) -> tuple[str | None, str | None, int]:
    """If ``words[i]`` is one of ``names`` (``-x v``, ``-x=v``), return (name, value, next index)."""
    word = words[i]
    for name in names:
        if word == name:
            return name, words[i + 1] if i + 1 < len(words) else None, i + 2
        if word.startswith(name + "="):
            return name, word[len(name) + 1:], i + 1
    return None, None, i + 1


@dataclass(frozen=True)
class Parsed:
    kept: tuple[str, ...]
    gencodes: tuple[tuple[str, tuple[str, ...]], ...]
    arch: tuple[str, ...]
    code: tuple[str, ...]
    threads: int | None
    inputs: tuple[str, ...]
    host_only: bool
    cuda_language: bool
    compile_only: bool
    device_flag: bool


def parse(argv: Sequence[str]) -> Parsed:
    kept: list[str] = []
    gencodes: list[tuple[str, tuple[str, ...]]] = []
    arch: list[str] = []
    code: list[str] = []
    threads: int | None = None
    inputs: list[str] = []
    host_only = cuda_language = compile_only = device_flag = False
    i = 0
    while i < len(argv):
        word = argv[i]
        name, value, nxt = option(argv, i, GENCODE)
        if name:
            for part in (value or "").split():  # -gencode "a b" is rare, but one word per pair is nvcc's rule
                gencodes.append(split_gencode(part))
            i = nxt
            continue
        name, value, nxt = option(argv, i, ARCH)
        if name:
            arch += [v for v in (value or "").split(",") if v]
            i = nxt
            continue
        name, value, nxt = option(argv, i, CODE)
        if name:
            code += list(codes(value or ""))
            i = nxt
            continue
        name, value, nxt = option(argv, i, THREADS)
        if name:
            threads = int(value) if value and value.strip().isdigit() else threads
            i = nxt
            continue
        if word in HOST_ONLY:
            host_only = True
        if word in COMPILE_ONLY:
            compile_only = True
        if word in DEVICE_ONLY or word.lower() in ("-rdc=true", "--relocatable-device-code=true"):
            device_flag = True
        if word in ("-x", "--x") and i + 1 < len(argv):
            cuda_language = cuda_language or argv[i + 1] == "cu"
        elif word in ("-xcu", "-x=cu", "--x=cu"):
            cuda_language = True
        if word in VALUE_OPTIONS and i + 1 < len(argv):
            kept += [word, argv[i + 1]]
            i += 2
            continue
        if not word.startswith("-") and INPUT.search(word):
            inputs.append(word)
        kept.append(word)
        i += 1
    return Parsed(tuple(kept), tuple(gencodes), tuple(arch), tuple(code), threads, tuple(inputs), host_only,
                   cuda_language, compile_only, device_flag)


SPLIT = ("-split-compile", "--split-compile")
PTXAS_OPTIONS = ("-Xptxas", "--ptxas-options")


def splits_ptxas(argv: Sequence[str]) -> bool:
    """Whether nvcc ``argv`` already asks for a split compile: nvcc's ``--split-compile`` (cicc and ptxas) or a
    ``--split-compile`` handed to ptxas (``-Xptxas``, ``--ptxas-options``), in any spelling."""
    i = 0
    while i < len(argv):
        name, _, nxt = option(argv, i, SPLIT)
        if name:
            return True
        name, value, nxt = option(argv, i, PTXAS_OPTIONS)
        if name and value and "split-compile" in value:
            return True
        i = nxt
    return False


def is_device_step(p: Parsed) -> bool:
    if p.host_only or not p.inputs:
        return False
    cuda_input = p.cuda_language or any(x.endswith(".cu") for x in p.inputs)
    if p.compile_only:
        return cuda_input or p.device_flag
    return True  # a link driven by nvcc: it device-links a registration stub for its archs


def fold_env_flags(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``NVCC_PREPEND_FLAGS`` + argv + ``NVCC_APPEND_FLAGS``, as nvcc itself would see them."""
    return [*shlex.split(env.get("NVCC_PREPEND_FLAGS", "")), *argv, *shlex.split(env.get("NVCC_APPEND_FLAGS", ""))]


CCBIN = ("-ccbin", "--compiler-bindir")


def short_dependency_flags(argv: Sequence[str]) -> list[str]:
    """torch's ``--generate-dependencies-with-compile --dependency-output F`` as ``-MD -MF F``.

    ccache 4.x only recognises the short spellings and calls every compile with the long ones
    "unsupported" (uncacheable); torch >= 2.11 already writes the short ones.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--generate-dependencies-with-compile":
            out.append("-MD")
        elif word == "--dependency-output" and i + 1 < len(argv):
            out += ["-MF", argv[i + 1]]
            i += 1
        elif word.startswith("--dependency-output="):
            out += ["-MF", word.split("=", 1)[1]]
        else:
            out.append(word)
        i += 1
    return out

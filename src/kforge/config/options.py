"""The build options as one table: it makes the CLI flags, the KFORGE_* cascade and the options page of the docs.

Each :class:`Option` names its field of :class:`PlanOptions`, its ``KFORGE_*`` variable, its CLI flag,
its type, its choices and its one-line doc. :func:`add_arguments` turns the table into argparse flags,
:meth:`PlanOptions.from_cascade` applies it (KFORGE_* variables, then CLI flags), and
:func:`markdown_table` writes the table in ``docs/options.md`` (a test keeps that page in sync).
``forge.toml`` values come before all of these; ``--env KEY=VALUE`` comes after them.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kforge.config.model import BACKEND_NAMES, PTX_POLICIES
from kforge.errors import ConfigError

_YES = ("1", "true", "yes")
_NO = ("0", "false", "no")


@dataclass(frozen=True)
class Option:
    name: str  # the PlanOptions field
    env: str  # KFORGE_* variable
    flag: str  # the CLI flag
    type: str  # "str" | "int" (positive) | "bool" (a yes/no variable; the flag sets it to ``flag_value``)
    doc: str
    choices: tuple[str, ...] = ()
    flag_value: bool | None = None  # for "bool": what giving the flag means


OPTIONS: tuple[Option, ...] = (
    Option("cuda", "KFORGE_CUDA", "--cuda", "str", "CUDA version to build with, e.g. 12.8 (default: the installed nvcc)"),
    Option("torch", "KFORGE_TORCH", "--torch", "str",
           "torch version of the variant, e.g. 2.9.1 or 2.11 (default: this interpreter's torch, else forge.toml's "
           "first); torch-ABI projects only; kforge provisions it with uv when it is not here"),
    Option("python", "KFORGE_PYTHON", "--python", "str",
           "Python of the variant, e.g. 3.10 (default: this interpreter's); another one is provisioned with uv"),
    Option("index_url", "KFORGE_INDEX_URL", "--index-url", "str",
           "the package index a variant's environment installs torch from (default: uv's, PyPI); {cuda} becomes the "
           "variant's cu130, e.g. https://download.pytorch.org/whl/{cuda}"),
    Option("find_links", "KFORGE_FIND_LINKS", "--find-links", "str",
           "a folder of wheels to provision a variant's environment from, offline (uv --offline --find-links)"),
    Option("profile", "KFORGE_PROFILE", "--profile", "str", "a build profile from forge.toml, e.g. minimal"),
    Option("backend", "KFORGE_BACKEND", "--backend", "str", "override the project's build backend",
           choices=BACKEND_NAMES),
    Option("max_jobs", "KFORGE_MAX_JOBS", "--max-jobs", "int",
           "parallel compile units (default: chosen from free memory)"),
    Option("nvcc_threads", "KFORGE_NVCC_THREADS", "--nvcc-threads", "int",
           "nvcc --threads per unit, in every thread variable of the project (default: chosen with --max-jobs)"),
    Option("build_isolation", "KFORGE_BUILD_ISOLATION", "--no-build-isolation", "bool",
           "build with this interpreter's packages, not an isolated env (offline hosts)", flag_value=False),
    Option("image", "KFORGE_IMAGE", "--image", "str",
           "cibuildwheel's Linux image: manylinux_2_28 (official, the default), kforge:bullseye (made here with "
           "debootstrap and podman; manylinux_2_31), or an image reference of your own"),
    Option("platform_tag", "KFORGE_PLATFORM_TAG", "--platform-tag", "str",
           "the oldest manylinux tag the wheel must reach, e.g. manylinux_2_28 (default: the project's platform_tag); "
           "the repair fails naming the too-new symbols"),
    Option("ptx", "KFORGE_PTX", "--ptx", "str",
           "which archs get PTX besides SASS: upstream (what upstream's own build ships, the project's upstream_ptx), "
           "highest (the highest arch only), none, all (default: the project's ptx)", choices=PTX_POLICIES),
    Option("ptxas_threads", "KFORGE_PTXAS_THREADS", "--ptxas-threads", "int",
           "ptxas --split-compile N in every device step, through kforge's nvcc wrapper: the same SASS, a long unit's "
           "ptxas on up to N cores (default: the project's ptxas_threads, 1 unless forge.toml sets it)"),
    Option("split_units", "KFORGE_SPLIT_UNITS", "--split-units", "str",
           "compile the project's longest units in parts (its forge.toml unit_split): auto (where the plan predicts it "
           "faster, the default), on, off", choices=("auto", "on", "off")),
    Option("strip_debug", "KFORGE_STRIP_DEBUG", "--keep-debug", "bool",
           "keep the host debug info (.debug_* sections) in the wheel's binaries; KFORGE_STRIP_DEBUG=1 strips it "
           "(default: the project's strip_debug)", flag_value=False),
    Option("allow_unknown_cuda", "KFORGE_ALLOW_UNKNOWN_CUDA", "--allow-unknown-cuda", "bool",
           "accept a CUDA version that is not a release kforge knows (kforge.config.inputs.CUDA_RELEASES), on purpose",
           flag_value=True),
)
BY_NAME: Mapping[str, Option] = MappingProxyType({o.name: o for o in OPTIONS})


@dataclass(frozen=True)
class PlanOptions:
    cuda: str | None = None
    torch: str | None = None  # the variant's torch (torch-ABI projects)
    python: str | None = None  # the variant's Python (3.N)
    index_url: str | None = None  # where a variant's environment gets torch (default: uv's index)
    find_links: str | None = None  # offline: a folder of wheels for the variant's environment
    profile: str | None = None
    backend: str | None = None
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    build_isolation: bool | None = None  # False: build with the interpreter's packages (offline hosts)
    image: str | None = None  # cibuildwheel's Linux image (manylinux_2_28, kforge:bullseye, a reference)
    platform_tag: str | None = None  # the oldest manylinux tag the wheel must reach (overrides the project's)
    ptx: str | None = None  # upstream | highest | none | all: overrides the project's ptx
    strip_debug: bool | None = None  # False: keep host debug info (--keep-debug); overrides the project's strip_debug
    ptxas_threads: int | None = None  # ptxas --split-compile N; overrides the project's ptxas_threads
    split_units: str | None = None  # auto | on | off: the project's unit_split (kforge.build.unitsplit); None: auto
    allow_unknown_cuda: bool | None = None  # True: a --cuda/KFORGE_CUDA outside kforge.config.inputs.CUDA_RELEASES is fine
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # --env KEY=VALUE, applied last
    cuda_from: str | None = None  # which layer set ``cuda`` ("KFORGE_CUDA" or "--cuda"), for the plan's story

    @classmethod
    def from_cascade(cls, environ: Mapping[str, str], **cli: Any) -> PlanOptions:
        """KFORGE_* variables first, then whatever CLI flags were given (None means 'not given')."""
        values: dict[str, Any] = {}
        for opt in OPTIONS:
            raw = environ.get(opt.env, "").strip()
            if raw:
                values[opt.name] = parse_value(opt, raw, opt.env)
        if "cuda" in values:
            values["cuda_from"] = "KFORGE_CUDA"
        for key, value in cli.items():
            if value is None or key == "env":
                continue
            if key not in BY_NAME:
                raise TypeError(f"PlanOptions has no option {key!r}")
            if isinstance(value, str):
                value = parse_value(BY_NAME[key], value, BY_NAME[key].flag)
            values[key] = value
            if key == "cuda":
                values["cuda_from"] = "--cuda"
        return cls(**values, env=MappingProxyType(dict(cli.get("env") or {})))


def parse_value(opt: Option, raw: str, where: str) -> Any:
    """One option's text (from its variable or its flag) as its type; bad text is a ConfigError."""
    text = raw.strip()
    if not text:
        raise ConfigError(f"{where} is empty", fix=f"give {where} a value, or leave it out")
    if opt.type == "int":
        if not text.isascii() or not text.isdigit() or int(text) < 1:  # "²".isdigit() is True
            raise ConfigError(f"{where}={raw!r} is not a positive whole number",
                              fix=f"set {where} to a number such as 4, or leave it out")
        return int(text)
    if opt.type == "bool":
        if text.lower() not in _YES + _NO:
            raise ConfigError(f"{where}={raw!r} is not a yes/no value", fix="set it to 0 or 1")
        return text.lower() in _YES
    if opt.choices and text not in opt.choices:
        from_env = where.startswith("KFORGE_")
        raise ConfigError(f"{where}={text!r} is not one of {', '.join(opt.choices)}",
                          fix=f"{'set' if from_env else 'pass'} one of those" + (f", or unset {where}" if from_env else ""))
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The table's flags, plus ``--env KEY=VALUE`` (applied after everything else)."""
    for opt in OPTIONS:
        if opt.type == "bool":
            parser.add_argument(opt.flag, dest=opt.name, action="store_const", const=opt.flag_value, help=opt.doc)
        else:
            parser.add_argument(opt.flag, dest=opt.name, type=_argparse_type(opt), choices=opt.choices or None,
                                help=f"{opt.doc} [{opt.env}]")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra build environment, applied last (MAX_JOBS, NVCC_THREADS are read back into the plan)")


def _argparse_type(opt: Option):  # type: ignore[no-untyped-def]
    def convert(text: str) -> Any:
        try:
            return parse_value(opt, text, opt.flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.what) from None

    convert.__name__ = opt.type
    return convert


def parse_env_pairs(pairs: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` pairs as a dict; a pair without ``=`` is a ConfigError."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--env {pair!r} is not KEY=VALUE", fix="write it as --env NVCC_THREADS=2")
        out[key.strip()] = value
    return out


def markdown_table() -> str:
    """The options page's table (docs/options.md)."""
    rows = ["| Option | Variable | Flag | Type | Doc |", "| --- | --- | --- | --- | --- |"]
    for o in OPTIONS:
        kind = o.type + (f" ({' / '.join(o.choices)})" if o.choices else "")
        rows.append(f"| `{o.name}` | `{o.env}` | `{o.flag}` | {kind} | {o.doc} |")
    rows.append("| `env` | | `--env KEY=VALUE` | repeated | extra build environment, applied last; "
                "`MAX_JOBS`, `NVCC_THREADS` and the project's `threads_env` are read back into the job choice |")
    return "\n".join(rows) + "\n"


def options_page() -> str:
    """docs/options.md, whole."""
    return f"""# Build options

Every option of a build comes from one table, `kforge.config.options.OPTIONS`: it makes the CLI flags of
`kforge plan`, `kforge build`, `kforge test` and `kforge release`, and the `KFORGE_*` cascade. This page is generated from
it (`python -m kforge.config.options > docs/options.md`; a test fails when the two differ).

The cascade, lowest first: forge.toml (platform env, project env, profile env, rendered arch knobs)
→ `KFORGE_*` variables → CLI flags → `--env KEY=VALUE`. `--env MAX_JOBS=..`, `--env NVCC_THREADS=..`
and `--env <threads_env>=..` (a project's own name for the nvcc thread count, such as flashinfer's
`FLASHINFER_NVCC_THREADS`) are read back into the plan's job choice, so every thread variable agrees, and
an out-of-memory retry lowers all of them. `kforge plan TARGET --json` shows the result.

{markdown_table()}"""


if __name__ == "__main__":  # pragma: no cover - `python -m kforge.config.options > docs/options.md`
    print(options_page(), end="")

"""The nvcc wrapper kforge puts in front of every build: the plan's archs and thread count, enforced.

A build reaches nvcc through ``PATH``, ``$CUDA_HOME/bin/nvcc``, ``$PYTORCH_NVCC``, ``$CUDACXX``
or CMake's ``CMAKE_CUDA_COMPILER``; :mod:`kforge.cuda.enforce` points all of them at a small
script that runs ``python -I <boot> <config> "$@"``, which lands in :func:`main` here.
:func:`rewrite` is the pure part: it reads one nvcc command line and returns the one to run.

* ``--threads``/``-t`` becomes the build's ``NVCC_THREADS`` (kforge's job choice, halved by an OOM
  retry), else the plan's thread count.
* With the plan's ``ptxas_threads`` N > 1, every device step gets ``-Xptxas --split-compile=N``: ptxas compiles
  a unit's functions on N threads. The SASS is the same as with one thread (checked: ``tests/integration/
  test_ptxas_threads.py``); each cubin's ``.note.nv.tkinfo`` records ptxas's options, so the doctor can tell
  that it ran. A step whose own flags already split (nvcc ``--split-compile``, or ``-Xptxas`` with
  ``--split-compile``) keeps them.
* Device steps (compiling ``.cu``, and nvcc-driven links, which embed a registration stub
  built for the link's archs: ``sm_75``, nvcc 13.0's default, when none is given) lose every
  ``-gencode``/``--generate-code``/``-arch``/``--gpu-architecture``/``-code``/``--gpu-code``
  in every spelling and get the plan's ``-gencode`` flags instead: those of the plan's archs
  the step asked for (so an upstream's per-file arch split survives), or all of them when it
  asked for none of the plan's archs.
* ``NVCC_PREPEND_FLAGS``/``NVCC_APPEND_FLAGS`` (read by nvcc itself) are folded into the
  command line first, so flags hidden there are enforced too.
* Host-only steps pass untouched: ``-E``, ``-M``/``-MM``, ``--version``, ``--list-gpu-*``,
  ``-lib``, compiles of non-CUDA sources, and calls without input files.
* Mode ``check`` runs the command as given and only records what ``on`` would change.
* Path maps (``Config.path_maps``, the plan's ``-ffile-prefix-map`` pairs; :mod:`kforge.build.reproducible`):
  nvcc has no prefix map for device code, so in every device step (:func:`map_device_step`)

  - an input ``.cu`` under a mapped folder is passed relative to the step's folder (the fatbin
    names each image after nvcc's input argument);
  - cudafe++ gets the input's mapped path (``-Xcudafe --orig_src_path_name``): it hashes the path
    nvcc gives it into the names of internal-linkage device symbols (``_INTERNAL_<hash>_``);
  - nvcc's host compiler becomes a shim (``-ccbin``, :func:`host_compiler_main`) that runs the real
    one and maps the line markers of what it preprocesses: cicc names device files after them, and
    ``-ffile-prefix-map`` leaves line markers as they are. The CUDA toolkit's own folder is mapped there
    too (:func:`kforge.cuda.devicepaths.toolkit_maps`: ptxas records the files' times in ``-lineinfo``).

Every step that asked for something other than what runs is appended to a JSON-lines log;
the pipeline summarises it once per build. This module imports only the standard library,
:mod:`kforge.cuda.nvccargs` (nvcc's command line, read) and :mod:`kforge.cuda.devicepaths` (the host-compiler
shim's half): it runs once per compile unit.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kforge.cuda.devicepaths import (
    HOSTCC_ENV,
    MAPS_ENV,
    ensure_shim,
    host_compiler_main,
    map_path,
    toolkit_maps,
    under,
)
from kforge.cuda.nvccargs import (
    ARCH_NAME,
    CCBIN,
    GENCODE,
    SPECIAL,
    VALUE_OPTIONS,
    Parsed,
    fold_env_flags,
    is_device_step,
    option,
    parse,
    short_dependency_flags,
    split_gencode,
    splits_ptxas,
)

MODES = ("on", "check", "off")



@dataclass(frozen=True)
class PlanArch:
    """One arch as the plan builds it: ``compute_90a`` compiled to SASS ``sm_90a`` and/or PTX."""

    virtual: str  # compute_90a
    sass: str | None  # sm_90a, or None for PTX only
    ptx: bool

    @property
    def key(self) -> str:
        """The arch number without variant (``90``): how an upstream's request is matched to it."""
        m = ARCH_NAME.match(self.virtual)
        return m.group(1) if m else self.virtual

    def flags(self) -> list[str]:
        out = []
        if self.sass:
            out.append(f"-gencode=arch={self.virtual},code={self.sass}")
        if self.ptx:
            out.append(f"-gencode=arch={self.virtual},code={self.virtual}")
        return out

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(c for c in (self.sass, self.virtual if self.ptx else None) if c)


@dataclass(frozen=True)
class Policy:
    """What the wrapper enforces: the mode, the plan's archs (from its gencode flags), the thread count."""

    mode: str = "on"
    archs: tuple[PlanArch, ...] = ()
    threads: int | None = None
    ptxas_threads: int | None = None  # > 1: -Xptxas --split-compile=N in every device step

    @property
    def codes(self) -> tuple[str, ...]:
        """What every binary carries: SASS ``sm_*`` and PTX ``compute_*`` names, in plan order."""
        return tuple(c for a in self.archs for c in a.codes)


@dataclass(frozen=True)
class Rewrite:
    """The outcome for one nvcc command line."""

    argv: tuple[str, ...]  # what to run (the input itself in check/off mode and for host-only steps)
    device: bool  # a step whose device code lands in an output (compile or nvcc-driven link)
    asked: tuple[str, ...] = ()  # codes the step asked for (sm_*/compute_*; nvcc's default if none)
    got: tuple[str, ...] = ()  # codes that run (== asked when nothing changes)
    threads_asked: int | None = None
    threads_got: int | None = None
    inputs: tuple[str, ...] = field(default=(), compare=False)
    ptxas_threads: int | None = None  # the --split-compile this step's ptxas got from the plan (None: none added)

    @property
    def changed(self) -> bool:
        return self.device and (set(self.asked) != set(self.got) or (
            self.threads_asked is not None and self.threads_asked != self.threads_got))


# ---------------------------------------------------------------------------- parsing


def policy_from_flags(flags: Sequence[str], *, mode: str = "on", threads: int | None = None,
                      ptxas_threads: int | None = None) -> Policy:
    """The policy for a plan's ``-gencode=arch=X,code=Y`` flags (as :func:`kforge.cuda.render.render_gencode` writes them)."""
    if mode not in MODES:
        raise ValueError(f"arch enforcement mode {mode!r} is not one of {', '.join(MODES)}")
    order: list[str] = []
    sass: dict[str, str] = {}
    ptx: set[str] = set()
    words = list(flags)
    i = 0
    while i < len(words):
        word = words[i]
        name, value, i = option(words, i, GENCODE)
        if name is None:
            raise ValueError(f"the plan's nvcc flags hold {word!r}, which is not a -gencode flag")
        virtual, codes = split_gencode(value or "")
        if virtual not in order:
            order.append(virtual)
        for code in codes:
            if code.startswith("sm_"):
                sass[virtual] = code
            else:
                ptx.add(virtual)
    return Policy(mode=mode, archs=tuple(PlanArch(v, sass.get(v), v in ptx) for v in order), threads=threads,
                  ptxas_threads=ptxas_threads)


def _asked_codes(p: Parsed) -> tuple[str, ...]:
    """The SASS/PTX names the step's own flags produce, by nvcc's rules (``()``: nvcc's default arch)."""
    out: list[str] = []
    for _virtual, codes in p.gencodes:
        out += codes
    for a in p.arch:
        if a in SPECIAL:
            out.append(a)
        elif p.code:
            out += p.code
        elif a.startswith("sm_"):  # -arch=sm_XY is -arch=compute_XY -code=sm_XY,compute_XY
            out += [a, "compute_" + a[3:]]
        else:
            out.append(a)  # -arch=compute_XY alone: PTX only
    if p.code and not p.arch:
        out += p.code
    return tuple(dict.fromkeys(out))


def _key(name: str) -> str | None:
    m = ARCH_NAME.match(name)
    return m.group(1) if m else None


def rewrite(argv: Sequence[str], policy: Policy) -> Rewrite:
    """The command to run for nvcc ``argv`` (without the program name) under ``policy``. Pure."""
    argv = tuple(argv)
    if policy.mode == "off" or not policy.archs:
        return Rewrite(argv=argv, device=False)
    p = parse(argv)
    if not is_device_step(p):
        return Rewrite(argv=argv, device=False, threads_asked=p.threads, threads_got=p.threads, inputs=p.inputs)
    asked = _asked_codes(p)
    wanted = {k for k in map(_key, asked) if k}
    chosen = [a for a in policy.archs if a.key in wanted]
    if not chosen or any(a in SPECIAL for a in asked):
        chosen = list(policy.archs)
    got = tuple(c for a in chosen for c in a.codes)
    threads = policy.threads if policy.threads is not None else p.threads
    new = list(p.kept) + [f for a in chosen for f in a.flags()]
    if threads is not None:
        new += ["--threads", str(threads)]
    ptx_only = any(w in ("-ptx", "--ptx") for w in argv)  # no ptxas runs
    split = policy.ptxas_threads if policy.ptxas_threads and policy.ptxas_threads > 1 and not splits_ptxas(argv) \
        and not ptx_only else None
    if split:
        new += ["-Xptxas", f"--split-compile={split}"]
    return Rewrite(
        argv=tuple(new) if policy.mode == "on" else argv,
        device=True,
        asked=asked or ("nvcc default",),
        got=got,
        threads_asked=p.threads,
        threads_got=threads,
        inputs=p.inputs,
        ptxas_threads=split,
    )


# ---------------------------------------------------------------------------- the wrapper's entry point


@dataclass(frozen=True)
class Config:
    """What the wrapper file hands to :func:`main` (as one JSON word)."""

    policy: Policy
    nvcc: str  # the real nvcc
    launcher: str | None = None  # ccache/sccache, run in front of nvcc
    log: str | None = None  # JSON-lines file of the steps that were (or, in check mode, would be) rewritten
    short_deps: bool = False  # spell torch's long dependency flags short (-MD/-MF) so ccache can cache them
    path_maps: tuple[tuple[str, str], ...] = ()  # (old, new) folder pairs device code is mapped by (see above)
    shim_dir: str | None = None  # where the host-compiler shims are written (needed with path_maps)
    boot: str | None = None  # the boot file the shims run (kforge.cuda.enforce.boot_file)

    def to_json(self) -> str:
        return json.dumps({
            "mode": self.policy.mode, "threads": self.policy.threads, "ptxas_threads": self.policy.ptxas_threads,
            "archs": [[a.virtual, a.sass, a.ptx] for a in self.policy.archs],
            "nvcc": self.nvcc, "launcher": self.launcher, "log": self.log, "short_deps": self.short_deps,
            **({"path_maps": [list(m) for m in self.path_maps], "shim_dir": self.shim_dir, "boot": self.boot}
               if self.path_maps else {}),
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Config:
        d = json.loads(text)
        policy = Policy(mode=d["mode"], threads=d.get("threads"), ptxas_threads=d.get("ptxas_threads"),
                        archs=tuple(PlanArch(v, s, bool(p)) for v, s, p in d.get("archs", ())))
        return cls(policy=policy, nvcc=d["nvcc"], launcher=d.get("launcher"), log=d.get("log"),
                   short_deps=bool(d.get("short_deps")),
                   path_maps=tuple((str(o), str(n)) for o, n in d.get("path_maps", ())), shim_dir=d.get("shim_dir"),
                   boot=d.get("boot"))


# ---------------------------------------------------------------------------- path maps for device code

def map_device_step(argv: Sequence[str], maps: Sequence[tuple[str, str]], cwd: str, shim_dir: str,
                    environ: Mapping[str, str]) -> tuple[list[str], dict[str, str], str]:
    """A device step's nvcc arguments with its ``.cu`` inputs relative to ``cwd`` (where both lie in one mapped
    folder), cudafe++'s path for a single ``.cu`` input mapped, and the host compiler replaced by the shim.
    Returns (argv, environment for nvcc, shim name). Pure."""
    out: list[str] = []
    real = environ.get("NVCC_CCBIN") or None
    cwd_root = under(cwd, maps)
    sources: list[str] = []  # the .cu inputs' absolute paths
    i = 0
    while i < len(argv):
        word = argv[i]
        name, value, nxt = option(argv, i, CCBIN)
        if name:
            real = value or real
            i = nxt
            continue
        if word in VALUE_OPTIONS and i + 1 < len(argv):
            out += [word, argv[i + 1]]
            i += 2
            continue
        if not word.startswith("-") and word.endswith(".cu"):
            full = os.path.normpath(os.path.join(cwd, word))
            sources.append(full)
            if os.path.isabs(word) and cwd_root is not None and under(word, maps) == cwd_root:
                word = os.path.relpath(word, cwd)
        out.append(word)
        i += 1
    if len(sources) == 1 and under(sources[0], maps):
        # nvcc hands cudafe++ the input's absolute path, and cudafe++ hashes it into the module id that names
        # every internal-linkage device symbol (_INTERNAL_<hash>_...): the mapped path, given last, wins
        out += ["-Xcudafe", f"--orig_src_path_name={map_path(sources[0], maps)}"]
    real = real or "gcc"  # nvcc's own default on Linux
    if os.path.isdir(real):  # -ccbin may name the folder that holds gcc
        real = os.path.join(real, "gcc")
    name = os.path.basename(real) or "gcc"
    shim = os.path.join(shim_dir, name)
    env = {HOSTCC_ENV: real, MAPS_ENV: json.dumps([list(m) for m in maps])}
    return [*out, "-ccbin", shim], env, name


def record(result: Rewrite, mode: str) -> str:
    """One JSON line for the log."""
    return json.dumps({"mode": mode, "inputs": list(result.inputs), "asked": list(result.asked),
                       "got": list(result.got), "threads": [result.threads_asked, result.threads_got],
                       "ptxas_threads": result.ptxas_threads})


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``<config json> <nvcc args...>``: rewrite, log, then exec (launcher) nvcc."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if environ is None else environ)
    if args[:1] == ["--host-compiler"]:
        return host_compiler_main(args[1:], env)
    if not args:
        sys.stderr.write("kforge nvcc wrapper: no configuration given (this script is written by kforge)\n")
        return 2
    config = Config.from_json(args[0])
    nvcc_args = args[1:]
    if config.policy.mode != "off":
        # The build's NVCC_THREADS is the job choice of the moment (an OOM retry halves it; --env sets it).
        raw = env.get("NVCC_THREADS", "").strip()
        policy = replace(config.policy, threads=int(raw)) if raw.isdigit() and int(raw) > 0 else config.policy
        folded = fold_env_flags(nvcc_args, env)
        result = rewrite(folded, policy)
        if config.policy.mode == "on" and result.device:
            nvcc_args = list(result.argv)
            env.pop("NVCC_PREPEND_FLAGS", None)
            env.pop("NVCC_APPEND_FLAGS", None)
        if (result.changed or result.ptxas_threads) and config.log:
            try:
                with open(config.log, "a", encoding="utf-8") as fh:  # one short line: an atomic O_APPEND write
                    fh.write(record(result, config.policy.mode) + "\n")
            except OSError as exc:
                sys.stderr.write(f"kforge nvcc wrapper: cannot write {config.log}: {exc}\n")
    if config.path_maps and config.shim_dir and config.boot and is_device_step(parse(fold_env_flags(nvcc_args, env))):
        maps = (*config.path_maps, *toolkit_maps(config.nvcc))
        nvcc_args, extra, name = map_device_step(fold_env_flags(nvcc_args, env), maps, os.getcwd(), config.shim_dir, env)
        env.pop("NVCC_PREPEND_FLAGS", None)
        env.pop("NVCC_APPEND_FLAGS", None)
        env.pop("NVCC_CCBIN", None)
        env.update(extra)
        try:
            ensure_shim(config.shim_dir, name, python=sys.executable, boot=config.boot, env=extra)
        except OSError as exc:
            sys.stderr.write(f"kforge nvcc wrapper: cannot write the host-compiler shim in {config.shim_dir}: {exc}\n")
            return 1
    if config.short_deps:
        nvcc_args = short_dependency_flags(nvcc_args)
    command = ([config.launcher] if config.launcher else []) + [config.nvcc, *nvcc_args]
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        sys.stderr.write(f"kforge nvcc wrapper: cannot run {command[0]}: {exc}\n")
        return 127
    return 0  # pragma: no cover (exec does not return)


if __name__ == "__main__":
    sys.exit(main())

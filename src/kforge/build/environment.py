"""A build's environment, assembled in one place: the plan's variables, then the toolkit, git isolation,
reproducibility, the compiler cache, kforge's nvcc wrapper and its ninja shim, in that order.

Each layer puts its folder first on ``PATH`` with :func:`kforge.fsutil.prepend_path` and writes its shims
with :func:`kforge.fsutil.write_executable`. What applies (the wrapper, the shim, the unit order) the plan
decided; this module only carries it out, so the backend's environment is the plan's plus these layers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from kforge.build import distclient, reproducible, toolchain
from kforge.build import order as buildorder
from kforge.config.source import Source
from kforge.cuda import enforce as archenforce
from kforge.fsutil import prepend_path
from kforge.sources.upstream import PreparedSource

Say = Callable[[str], None]


@dataclass(frozen=True)
class Assembled:
    env: Mapping[str, str]  # the build's whole environment
    cache: toolchain.CacheSetup | None
    wrapper: archenforce.WrapperSetup | None
    order: buildorder.OrderSetup | None


@dataclass(frozen=True)
class Layers:
    """What the plan decided about the environment's layers (the fields of :class:`kforge.plan.Plan` they come from)."""

    project: str
    root: Path
    work_dir: Path
    source: Source
    enforce: archenforce.ArchEnforcement | None
    order: tuple[tuple[str, float], ...]  # plan.jobs.order
    order_from: str  # plan.jobs.order_from
    ninja_shim: bool
    backend: str
    reproducible: reproducible.Reproducibility  # plan.reproducible: the seed and the path maps


def assemble(environ: Mapping[str, str], plan_env: Mapping[str, str], layers: Layers, nvcc: toolchain.Nvcc,
             prepared: PreparedSource, say: Say) -> Assembled:
    env = {**environ, **plan_env}
    env.update(nvcc.env(env))  # CUDA_HOME & co, and the host include path for CCCL on CUDA >= 13
    env["PATH"] = prepend_path(nvcc.home / "bin", env.get("PATH"))
    isolate_git(env, layers.work_dir)
    epoch = reproducible.source_epoch(layers.root, layers.source, prepared)
    repro = layers.reproducible
    env.update(reproducible.build_env(repro, epoch, env))
    say(f"reproducible: SOURCE_DATE_EPOCH={env.get('SOURCE_DATE_EPOCH', 'unset')} ({epoch.origin}), "
        f"NVCC_APPEND_FLAGS={env['NVCC_APPEND_FLAGS']}"
        + "".join(f", {v}={env[v]}" for v in repro.host_vars if repro.path_maps and v in env))
    cache = toolchain.compiler_cache(env, wrapper_dir=layers.work_dir / "cc-wrappers", nvcc=nvcc.path)
    if cache is not None:
        env.update(cache.env)
        say(f"compiler cache: {cache.tool} ({cache.path})")
    wrapper = install_wrapper(layers, env, nvcc, cache, say)
    if cache is not None and cache.tool == "sccache" and wrapper is not None and layers.reproducible.device_maps:
        shims = layers.work_dir / "nvcc-wrap" / "hostcc"
        extra = distclient.prepare(env, shims, layers.work_dir / "sccache-dist", cache.path,
                                   exclude=(cache.wrapper_dir,))
        if extra:
            env.update(extra)
            say(f"sccache-dist: the host-compiler shims in {shims} travel as the real compilers "
                f"(client config {extra['SCCACHE_CONF']})")
            why = distclient.start_client(env, cache.path)
            if why:
                say(f"WARNING: sccache's client daemon did not start with that config ({why}): a daemon that already "
                    "runs keeps its own config, and units it cannot send compile locally; stop it first "
                    "(sccache --stop-server) or give the build its own SCCACHE_SERVER_PORT")
    order = install_order(layers, env, say)
    return Assembled(MappingProxyType(env), cache, wrapper, order)


def isolate_git(env: dict[str, str], work: Path) -> None:
    """Upstream setup.py files run git (FlashMLA: `git submodule update`, versions from `git describe`).

    The scratch tree is an export without .git, under the monorepo: stop git from finding the
    monorepo's repository above it.
    """
    env["GIT_CEILING_DIRECTORIES"] = prepend_path(work.parent, env.get("GIT_CEILING_DIRECTORIES"))


def install_wrapper(layers: Layers, env: dict[str, str], nvcc: toolchain.Nvcc, cache: toolchain.CacheSetup | None,
                    say: Say) -> archenforce.WrapperSetup | None:
    """Route every nvcc call of the build through kforge's wrapper (kforge.cuda.enforce), where the plan says so."""
    enforce = layers.enforce
    if enforce is None or not enforce.wrapper:
        return None
    setup = archenforce.install(enforce, nvcc=nvcc.path, cuda_home=nvcc.home, dest=layers.work_dir / "nvcc-wrap",
                                launcher=cache.path if cache is not None else None,
                                short_deps=cache is not None and cache.tool == "ccache", env=env,
                                path_maps=tuple((m.old, m.new) for m in layers.reproducible.path_maps)
                                if layers.reproducible.device_maps else ())
    env.update(setup.env)
    found = enforce.hardcoded  # the plan scanned the build scripts once
    say(f"arch enforcement {enforce.mode}: every nvcc step gets {enforce.contents()}"
        + (f"; the build scripts write their own arch flags ({len(found)} line(s), e.g. {found[0]})" if found else ""))
    return setup


def install_order(layers: Layers, env: dict[str, str], say: Say) -> buildorder.OrderSetup | None:
    """kforge's ninja shim first on ``PATH`` with the plan's unit times, where the plan says the shim applies."""
    times: Sequence[tuple[str, float]] = layers.order if layers.ninja_shim else ()
    order = buildorder.install(times, dest=layers.work_dir / "ninja-order", env=env)
    if order is not None:
        env.update(order.env)
        what = ("the seed's unit times (nothing measured here yet)" if layers.order_from == "seed"
                else f"{order.units} measured unit times")
        say(f"build order: longest first by {what} (ninja shim {order.shim} in front of {order.ninja})")
    else:
        say("build order: upstream's" + (" (no unit times measured yet)" if not layers.order else
                                         " (no ninja on PATH for the shim)" if layers.ninja_shim else
                                         f" (the ninja shim does not run under {layers.backend})"))
    return order

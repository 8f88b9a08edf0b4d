"""Judge a report: expected archs present, device code linked, libraries where the policy wants them.

What an expected arch means (the rule :func:`check` applies to every binary that carries
CUDA device code, except libraries a repair tool vendored into ``*.libs/``):

``sm_90a`` (arch-specific, ``a``)
    needs SASS ``sm_90a``. Only PTX ``compute_90a`` is a warning (the driver JIT-compiles it
    at first load). Anything else, plain ``sm_90`` included, is an error: the ``a`` features
    (wgmma, setmaxnreg, ...) are not in the binary.
``sm_120f`` (family, ``f``)
    needs SASS ``sm_120f``; only PTX ``compute_120f`` is a warning; anything else an error.
``sm_90`` (plain)
    is met by any SASS for 9.0 (``sm_90``, ``sm_90a``, ``sm_90f`` all run on a 9.0 GPU).
    SASS for an older minor of the same major (``sm_80`` for an expected ``sm_86``) runs too,
    by CUDA's binary compatibility, and is reported as info. Otherwise PTX that the driver can
    JIT for 9.0 (plain ``compute_XY`` with XY <= 90, or ``compute_90a``/``compute_9Yf`` with
    Y <= 0) is a warning; nothing usable is an error.
``compute_120a`` (PTX)
    needs exactly that PTX.

Exact mode (``exact=True``, what a build whose plan enforces archs uses, and ``kforge doctor
--exact``) holds every judged binary to exactly the expected names: each expected SASS and PTX
must be there by name (a compatible ``sm_90a`` does not stand in for ``sm_90``), and any other
SASS or PTX is an error naming the binary and the arch (``extra-arch``, ``extra-ptx``). With
``exact_ptx=False`` (a build whose wrapper only checks) PTX is left to the upstream.

Stripped (``stripped=True``, a build whose plan strips host debug info, and ``kforge doctor --stripped``): every ELF
binary of the wheel's own (not the ``*.libs/`` a repair tool vendored) must be free of ``.debug_*`` sections
(``debug-info``), whether it carries device code or not.

ptxas threads (``ptxas_threads=N``, a build whose plan gives ptxas ``--split-compile N``): every cubin of a judged
binary whose ``.note.nv.tkinfo`` records ptxas's options must record ``-split-compile N`` (``ptxas-threads``); a cubin
without such a note is not judged.

Relocatable device code (``__nv_relfatbin`` of an ``-rdc=true`` object that was never
device-linked) does not count: the driver cannot load it.

Size: a wheel larger than PyPI takes by default (:data:`PYPI_FILE_LIMIT`) is a warning (``pypi-size``): a wheelhouse
serves it, an upload to PyPI is refused unless the project has a larger limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kforge.config.repairpolicy import TORCH_LIBRARIES, RepairPolicy, unmangle
from kforge.cuda.arch import PTX, Arch, code_kind, parse_arch
from kforge.doctor.model import BinaryReport, Finding, WheelReport
from kforge.doctor.resources import resource_findings, split_compile
from kforge.errors import DoctorError

NO_KERNEL_IMAGE = "'no kernel image is available for execution on the device'"
#: PyPI's default limit for one file (warehouse's MAX_FILESIZE: 100 MiB); a project can ask PyPI for a larger one.
PYPI_FILE_LIMIT = 100 * 1024 * 1024


def check(
    report: WheelReport | BinaryReport,
    *,
    expect_archs: Sequence[str | Arch] = (),
    policy: RepairPolicy | None = None,
    exact: bool = False,
    exact_ptx: bool = True,
    stripped: bool = False,
    ptxas_threads: int | None = None,
) -> list[Finding]:
    """Every finding for ``report``: errors first, then warnings, then info.

    ``exact_ptx=False`` (with ``exact``) holds SASS exactly and leaves PTX unjudged; ``stripped``: no host debug info.

    ``policy`` None skips the library checks (bundled-but-excluded and unbundled NEEDED).
    """
    wheel = report if isinstance(report, WheelReport) else None
    binaries = report.binaries if isinstance(report, WheelReport) else (report,)
    label = f"wheel {wheel.filename}" if wheel else "binary"
    wanted = expected(expect_archs)
    findings: list[Finding] = []

    judged = [b for b in binaries if b.is_cuda and not _vendored(b.path)]
    if wanted and not judged:
        findings.append(Finding("error", "no-device-code", f"{label}: no binary carries CUDA device code (no fatbin in "
                                f"any .so/.pyd/.dll), so none of {', '.join(t for t, _, _ in wanted)} is there"))
    for binary in judged:
        if exact:
            findings.extend(_judge_exact(label, binary, wanted, ptx=exact_ptx))
            continue
        for text, kind, arch in wanted:
            finding = _judge_arch(label, binary, text, kind, arch)
            if finding:
                findings.append(finding)
    for binary in judged:
        findings.extend(resource_findings(label, binary.path, binary.kernels))
    findings.extend(_debug_findings(label, binaries) if stripped else ())
    findings.extend(_ptxas_findings(label, judged, ptxas_threads or 1))
    for binary in binaries:
        for symbol in binary.linked_binary_symbols:
            findings.append(
                Finding(
                    "error",
                    "unresolved-device-link",
                    f"{label}: {binary.path} needs {symbol}, which nothing defines: it was compiled with "
                    "-rdc=true but never device-linked, so loading it fails with 'undefined symbol'",
                    binary=binary.path,
                )
            )
    if policy is not None:
        findings.extend(_library_findings(label, binaries, wheel.files if wheel else (), policy))
    if wheel is not None:
        findings.extend(_size_findings(wheel))
        findings = [dataclasses.replace(f, wheel=wheel.filename) for f in findings]
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order.get(f.severity, 3))


def _size_findings(wheel: WheelReport) -> list[Finding]:
    if wheel.size <= PYPI_FILE_LIMIT:
        return []
    return [Finding("warning", "pypi-size", f"wheel {wheel.filename} is {wheel.size:,} bytes ({wheel.size / 2**20:.1f} "
                    f"MiB), above PyPI's default limit of {PYPI_FILE_LIMIT // 2**20} MiB a file: a wheelhouse serves "
                    "it, but an upload to PyPI is refused unless the project has a larger limit (ask pypi/support); "
                    "fewer archs a wheel (one target per arch) make it smaller")]


def expected(expect_archs: Sequence[str | Arch]) -> list[tuple[str, str | None, Arch]]:
    """``(label, kind, arch)`` for each expected arch: kind is PTX for ``compute_XY`` (PTX required),
    None for SASS. ``sm_90+PTX`` (or an :class:`~kforge.cuda.arch.Arch` with ``ptx``) asks for both.

    Spellings go through :func:`kforge.cuda.arch.parse_arch`, the one table of known archs and suffixes,
    so a misspelt or unknown arch is an :class:`~kforge.errors.ArchError` with a suggestion.
    """
    out: list[tuple[str, str | None, Arch]] = []
    for item in expect_archs:
        arch = parse_arch(item) if isinstance(item, str) else item
        if isinstance(item, str) and code_kind(item) == PTX:
            kinds: tuple[str | None, ...] = (PTX,)
        else:
            kinds = (None, PTX) if arch.ptx else (None,)
        want = arch.with_ptx(False)
        for kind in kinds:
            label = want.compute if kind == PTX else want.sm
            if all(label != w[0] for w in out):
                out.append((label, kind, want))
    return out


def verify(
    report: WheelReport | BinaryReport,
    expect_archs: Sequence[str | Arch] = (),
    policy: RepairPolicy | None = None,
    *,
    exact: bool = False,
    exact_ptx: bool = True,
    stripped: bool = False,
    ptxas_threads: int | None = None,
) -> list[Finding]:
    """Like :func:`check`, but raise :class:`DoctorError` when there is any error finding.

    Returns the (non-error) findings when the report passes.
    """
    findings = check(report, expect_archs=expect_archs, policy=policy, exact=exact, exact_ptx=exact_ptx, stripped=stripped,
                     ptxas_threads=ptxas_threads)
    errors = [f for f in findings if f.is_error]
    if not errors:
        return findings
    codes = {f.code for f in errors}
    fixes = []
    if codes & {"missing-arch", "missing-ptx", "no-device-code"}:
        fixes.append(
            "build the missing arch: check the -gencode flags the build passed "
            "(TORCH_CUDA_ARCH_LIST, FLASH_ATTN_CUDA_ARCHS, CMAKE_CUDA_ARCHITECTURES) against the target's archs, and rebuild"
        )
    if "kernel-over-limit" in codes:
        fixes.append("size the kernel's tiles for the arch it was built for (shared memory per block, registers per block), or stop building it for that arch")
    if "stub-sass" in codes:
        fixes.append("compile the kernels' real bodies for that arch (check the __CUDA_ARCH__ guards and the FLASH_*_DISABLE_* knobs), or drop the arch")
    if codes & {"extra-arch", "extra-ptx"}:
        fixes.append(
            "the build compiled device code the plan did not ask for: keep arch_enforce = \"on\" for the project "
            "(kforge's nvcc wrapper rewrites hard-coded -gencode/-arch flags; the build report's arch_enforcement "
            "section lists what it rewrote), or remove the arch from the upstream's build"
        )
    if "debug-info" in codes:
        fixes.append("strip it before repair: kforge's repair step does when the plan's debug line says stripped "
                     "(`kforge repair --strip-debug` for a wheel repaired by hand); or keep it on purpose with --keep-debug")
    if "ptxas-threads" in codes:
        fixes.append("build it through kforge's nvcc wrapper (arch_enforce = \"on\", a native or cmake build), which gives "
                     "ptxas the plan's --split-compile; or set ptxas_threads to what the build's own flags ask for")
    if "unresolved-device-link" in codes:
        fixes.append("link the device code: let nvcc link the library, add an `nvcc -dlink` step, or set CUDA_RESOLVE_DEVICE_SYMBOLS ON")
    if codes & {"needs-torch", "bundles-torch"}:
        fixes.append("drop the torch link from the build (no libtorch/c10 in its link line, no torch.utils.cpp_extension), "
                     "or, if the project really builds against torch, set torch_abi = true for it in forge.toml")
    if "bundled-excluded" in codes:
        fixes.append("repair the wheel again with kforge's repair policy so that these libraries are excluded, not grafted")
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    raise DoctorError(
        errors[0].message + more,
        why="\n".join(f"- {f.message}" for f in errors) if len(errors) > 1 else "shipping it would break users at run time",
        fix="; ".join(fixes) or "fix the build and run kforge doctor again",
    )


def _vendored(path: str) -> bool:
    top = path.split("/", 1)[0]
    return top.endswith(".libs") or "/.libs/" in f"/{path}"


def _judge_arch(label: str, binary: BinaryReport, text: str, kind: str | None, want: Arch) -> Finding | None:
    sass = {e.cuda_arch for e in binary.sass if not e.relocatable}
    ptx = {e.cuda_arch for e in binary.ptx}
    has = _describe(binary)
    if kind == PTX:
        if want in ptx:
            return None
        return Finding("error", "missing-ptx", f"{label}: {binary.path} has no PTX for {want.compute} ({has})", binary=binary.path, arch=want.compute)

    name = want.sm
    if want.variant:
        if want in sass:
            return None
        if want in ptx:
            return Finding(
                "warning", "ptx-only", f"{label}: {binary.path} has no SASS for {name}, only PTX {want.compute}: "
                "the driver JIT-compiles it at first load (slow start, needs a driver that knows the PTX version)",
                binary=binary.path, arch=name,
            )  # fmt: skip
    else:
        if any((a.major, a.minor) == (want.major, want.minor) for a in sass):
            return None
        older = sorted(a for a in sass if a.major == want.major and a.minor < want.minor and a.variant != "a")
        if older:
            return Finding(
                "info", "compatible-sass", f"{label}: {binary.path} has no SASS built for {name}; {older[-1].sm} "
                "runs on it by binary compatibility, but was not tuned for it",
                binary=binary.path, arch=name,
            )  # fmt: skip
        jit = [a for a in ptx if _ptx_runs_on(a, want)]
        if jit:
            return Finding(
                "warning", "ptx-only", f"{label}: {binary.path} has no SASS for {name}, only PTX {max(jit).compute}: "
                "the driver JIT-compiles it at first load (slow start, needs a driver that knows the PTX version)",
                binary=binary.path, arch=name,
            )  # fmt: skip
    relocatable = sorted({e.arch for e in binary.sass if e.relocatable})
    extra = f"; its relocatable device code ({', '.join(relocatable)}) was never device-linked" if relocatable else ""
    return Finding(
        "error",
        "missing-arch",
        f"{label}: {binary.path} has no SASS for {name} ({has}){extra}; a GPU with {name} would fail with {NO_KERNEL_IMAGE}",
        binary=binary.path,
        arch=name,
    )


def _judge_exact(label: str, binary: BinaryReport, wanted: Sequence[tuple[str, str | None, Arch]], *,
                 ptx: bool = True) -> list[Finding]:
    """Exact mode: the binary's SASS names (and PTX names, with ``ptx``) are exactly the expected ones."""
    sass = {e.arch for e in binary.sass if not e.relocatable}
    has_ptx = {e.arch for e in binary.ptx} if ptx else set()
    if not ptx:
        wanted = [w for w in wanted if w[1] != PTX]
    want_sass = {text for text, kind, _ in wanted if kind != PTX}
    want_ptx = {text for text, kind, _ in wanted if kind == PTX}
    order = {e.arch: e.cuda_arch for e in binary.fatbins}  # sort names by their arch
    has = _describe(binary)
    asked = ", ".join(t for t, _, _ in wanted)
    out = []
    for text, kind, _ in wanted:
        if kind == PTX and text not in has_ptx:
            out.append(Finding("error", "missing-ptx", f"{label}: {binary.path} has no PTX for {text} ({has})",
                               binary=binary.path, arch=text))
        elif kind != PTX and text not in sass:
            out.append(Finding("error", "missing-arch", f"{label}: {binary.path} has no SASS for {text} ({has}); a GPU "
                               f"with {text} would fail with {NO_KERNEL_IMAGE}", binary=binary.path, arch=text))
    for name in sorted(sass - want_sass, key=lambda n: order[n]):
        out.append(Finding("error", "extra-arch", f"{label}: {binary.path} carries SASS {name}, which the plan did not "
                           f"ask for (it asked for exactly {asked})", binary=binary.path, arch=name))
    for name in sorted(has_ptx - want_ptx, key=lambda n: order[n]):
        out.append(Finding("error", "extra-ptx", f"{label}: {binary.path} carries PTX {name}, which the plan did not "
                           f"ask for (it asked for exactly {asked})", binary=binary.path, arch=name))
    return out


def _debug_findings(label: str, binaries: Sequence[BinaryReport]) -> list[Finding]:
    """An error for every ELF binary of the wheel's own that kept host debug info, naming its largest sections."""
    out = []
    for b in binaries:
        debug = b.debug_sections if b.format == "elf" and not _vendored(b.path) else ()
        if debug:
            sizes = ", ".join(f"{s.name} {s.size / 1e6:.1f} MB" for s in debug[:3]) + (" ..." if len(debug) > 3 else "")
            out.append(Finding("error", "debug-info", f"{label}: {b.path} carries host debug info ({sizes}; "
                               f"{sum(s.size for s in debug) / 1e6:.1f} MB in all), and the plan strips it (strip_debug)",
                               binary=b.path))
    return out


def _ptxas_findings(label: str, judged: Sequence[BinaryReport], threads: int) -> list[Finding]:
    """An error for every binary with cubins whose ptxas did not run with the plan's ``-split-compile N`` (N > 1)."""
    out: list[Finding] = []
    if threads <= 1:
        return out
    for b in judged:
        recorded = [k for k in b.kernels if k.ptxas is not None]
        wrong = [k for k in recorded if split_compile(k.ptxas) != threads]
        if wrong:
            seen = sorted({k.ptxas or "" for k in wrong})
            out.append(Finding("error", "ptxas-threads", f"{label}: {b.path}: {len(wrong)} of {len(recorded)} kernels were "
                               f"compiled by ptxas without -split-compile {threads} (the plan's ptxas_threads), e.g. with "
                               f"'{seen[0]}'", binary=b.path))
    return out


def _ptx_runs_on(ptx: Arch, device: Arch) -> bool:
    if ptx.variant == "a":
        return (ptx.major, ptx.minor) == (device.major, device.minor)
    if ptx.variant == "f":
        return ptx.major == device.major and ptx.minor <= device.minor
    return ptx.number <= device.number


def _describe(binary: BinaryReport) -> str:
    sass = {e.arch: e.cuda_arch for e in binary.sass if not e.relocatable}
    sass_names = sorted(sass, key=lambda n: sass[n])
    parts = [f"it has {', '.join(sass_names)}" if sass_names else "it has no SASS"]
    if binary.ptx_archs:
        parts.append(f"PTX {', '.join(binary.ptx_archs)}")
    return "; ".join(parts)


def _library_findings(label: str, binaries: Sequence[BinaryReport], files: Sequence[str], policy: RepairPolicy) -> list[Finding]:
    findings = _torch_findings(label, binaries, files, policy) if policy.torch_free else []
    basenames = {f.rsplit("/", 1)[-1] for f in files} | {b.path.rsplit("/", 1)[-1] for b in binaries}
    for f in files:
        base = f.rsplit("/", 1)[-1]
        if not f.endswith("/") and _is_library(base) and policy.excludes(base):
            findings.append(
                Finding(
                    "error",
                    "bundled-excluded",
                    f"{label}: bundles {f} ({unmangle(base)}), which the repair policy '{policy.name}' says must come "
                    "from the user's system (torch or the NVIDIA driver); a bundled copy shadows or conflicts with it",
                    binary=f,
                )
            )
    for binary in binaries:
        for lib in binary.needed:
            if policy.forbids(lib) or policy.excludes(lib) or policy.is_system(lib) or lib in basenames \
                    or lib.lower() in {b.lower() for b in basenames}:
                continue
            findings.append(
                Finding(
                    "warning",
                    "unbundled-needed",
                    f"{label}: {binary.path} needs {lib}, which is not in the wheel, not a system library and not "
                    f"excluded by the repair policy '{policy.name}': was the wheel repaired?",
                    binary=binary.path,
                )
            )
    return findings


def _torch_findings(label: str, binaries: Sequence[BinaryReport], files: Sequence[str],
                    policy: RepairPolicy) -> list[Finding]:
    """A torch-free policy: an error for every binary that needs (and every file that is) one of torch's libraries;
    an info finding that says the check ran when none does."""
    why = (f"the repair policy '{policy.name}' is torch-free (its project has torch_abi = false): the wheel must "
           "load without torch, and work with any torch")
    findings = [Finding("error", "needs-torch", f"{label}: {b.path} needs {lib}; {why}", binary=b.path)
                for b in binaries for lib in b.needed if policy.forbids(lib)]
    findings += [Finding("error", "bundles-torch", f"{label}: bundles {f} ({unmangle(f.rsplit('/', 1)[-1])}); {why}",
                         binary=f) for f in files if not f.endswith("/") and _is_library(f.rsplit("/", 1)[-1])
                 and policy.forbids(f)]
    if not findings:
        findings.append(Finding("info", "torch-free", f"{label}: torch-free: no binary needs "
                                f"{', '.join(TORCH_LIBRARIES)} ({len(binaries)} checked)"))
    return findings


def _is_library(name: str) -> bool:
    low = name.lower()
    return low.endswith((".dll", ".so")) or ".so." in low

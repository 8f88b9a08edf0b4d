"""Knob audit: which environment variables an upstream's build scripts read, against what kforge sets.

``kforge audit <project>`` reads the pinned source (a git commit through ``git cat-file``, an sdist
archive, or an unpacked tree) without building anything, and reports:

* for every variable kforge sets for the project (forge.toml's env, profiles, arch knobs, its
  threads/local-version names, and the toolchain variables every build gets): where upstream reads
  it, or which tool reads it instead (torch's cpp_extension, nvcc, g++, CMake), or that nothing
  known does (a dead knob: the exit code is 1);
* the variables upstream reads that kforge never sets (knobs it ignores);
* the gencode/arch flags upstream hard-codes (which override ``TORCH_CUDA_ARCH_LIST``);
* whether forge.toml's ``upstream_version`` agrees with the version the tree declares.

Python files are read with :mod:`ast`: ``os.environ[...]``, ``os.environ.get(...)``,
``os.getenv(...)``, ``"X" in os.environ``, and calls of the file's own helpers that pass their
argument to one of those (FlashMLA's ``is_flag_set("FLASH_MLA_DISABLE_SM90")``). CMake files
are read for ``$ENV{X}``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kforge.config.model import Project
from kforge.errors import SourceError
from kforge.sources.upstream import run_git

#: Folders that hold no build logic (tests, docs, vendored third-party code).
SKIP_DIRS = frozenset({
    "tests", "test", "benchmarks", "benchmark", "docs", "doc", "examples", "example", "3rdparty", "third_party",
    "csrc", "include", "scripts", "ci", ".github", "tools", "profiler", "cutlass", "composable_kernel",
})
#: Variables every build gets from kforge, and the tool that reads them when upstream does not.
TOOLCHAIN_READERS: Mapping[str, str] = {
    "MAX_JOBS": "torch.utils.cpp_extension (ninja -j)",
    "CMAKE_BUILD_PARALLEL_LEVEL": "CMake",
    "CUDA_HOME": "torch.utils.cpp_extension",
    "CUDACXX": "CMake",
    "CUDA_PATH": "torch.utils.cpp_extension (Windows)",
    "CPLUS_INCLUDE_PATH": "g++ (the host compiler)",
    "TORCH_CUDA_ARCH_LIST": "torch.utils.cpp_extension, only when no nvcc flag names an arch",
    "NVCC_APPEND_FLAGS": "nvcc itself",
    "DISTUTILS_USE_SDK": "setuptools (MSVC)",
    "CMAKE_CUDA_ARCHITECTURES": "CMake",
    "CMAKE_ARGS": "scikit-build-core and kforge's cmake backend (extra CMake options: flash-attn3-standalone's FA3S_PROFILE)",
}
#: Variables kforge sets for every project whatever its upstream reads: not reading one is no finding.
GENERIC = frozenset({"NVCC_THREADS", "MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "CUDA_HOME", "CUDACXX"})
#: Readers that exist only in a torch extension build (torch's cpp_extension).
TORCH_READERS = frozenset({"MAX_JOBS", "CUDA_HOME", "CUDA_PATH", "TORCH_CUDA_ARCH_LIST"})
_ENV_FUNCS = {("os", "getenv"), ("os.environ", "get"), ("environ", "get"), ("os.environ", "setdefault")}
_ARCH_FLAG = re.compile(r"(-gencode[= ]?\S*|arch=compute_\w+(?:,code=\w+)?|code=sm_\w+|-arch[= ]sm_\w+|"
                        r"--generate-code\S*|CUDA_ARCHITECTURES\s+\S+)")
_CMAKE_ENV = re.compile(r"\$ENV\{(\w+)\}")
_VERSION_ASSIGN = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)
_SETUP_VERSION = re.compile(r"""version\s*=\s*["']([0-9][^"'+]*)["']""")


@dataclass(frozen=True)
class Site:
    """One place in upstream's tree: ``file:line`` and the source text there."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class EnvRead:
    name: str
    site: Site


@dataclass(frozen=True)
class KnobCheck:
    """One variable kforge sets, and who reads it."""

    name: str
    origin: str  # where forge.toml/kforge sets it: "env", "profile minimal", "arch knob", "toolchain", ...
    upstream: tuple[Site, ...]  # where upstream reads it
    other_reader: str | None  # a known tool that reads it instead
    patches: tuple[str, ...] = ()  # our patches that make upstream read it

    @property
    def status(self) -> str:
        if self.upstream:
            return "read by upstream"
        if self.patches:
            return f"read through our patch {', '.join(self.patches)}"
        if self.other_reader:
            return f"read by {self.other_reader}"
        if self.name in GENERIC:
            return "not read here (kforge sets it for every project)"
        return "NOT READ"

    @property
    def dead(self) -> bool:
        return not self.upstream and not self.patches and self.other_reader is None and self.name not in GENERIC


@dataclass(frozen=True)
class AuditReport:
    project: str
    source: str  # what was read: "git <repo> @ <sha>", "sdist <file>", "tree <path>"
    files: tuple[str, ...]  # the build scripts read
    knobs: tuple[KnobCheck, ...]
    ignored: tuple[tuple[str, tuple[Site, ...]], ...]  # upstream knobs kforge never sets
    arch_flags: tuple[Site, ...]
    version_declared: str | None  # forge.toml's upstream_version
    version_found: tuple[str, Site] | None  # what the tree says

    @property
    def dead_knobs(self) -> tuple[KnobCheck, ...]:
        return tuple(k for k in self.knobs if k.dead)

    @property
    def version_mismatch(self) -> bool:
        if self.version_declared is None or self.version_found is None:
            return False
        return self.version_declared.split("+")[0] != self.version_found[0].split("+")[0]

    @property
    def ok(self) -> bool:
        return not self.dead_knobs and not self.version_mismatch


# --------------------------------------------------------------------------- reading a tree


@dataclass(frozen=True)
class Tree:
    """A file listing and a reader over one upstream source, whatever it is stored in."""

    description: str
    names: tuple[str, ...]
    read: Callable[[str], bytes | None]


def git_tree(repo: Path, rev: str) -> Tree:
    """The files of commit ``rev`` in ``repo`` (a checkout or a bare mirror); nested submodules are not read."""
    proc = run_git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=repo, check=False)
    sha = proc.stdout.decode().strip()
    if proc.returncode != 0 or not sha:
        raise SourceError(f"{rev} is not a commit in {repo}",
                          fix=f"fetch it into {repo} (git -C {repo} fetch origin {rev}), or point --repo at a mirror that has it")
    out = run_git(["ls-tree", "-r", "-z", "--full-tree", sha], cwd=repo).stdout.decode()
    blobs: dict[str, str] = {}
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        _mode, kind, obj = meta.split()
        if kind == "blob":
            blobs[path] = obj

    def read(name: str) -> bytes | None:
        obj = blobs.get(name)
        if obj is None:
            return None
        got = subprocess.run(["git", "cat-file", "blob", obj], cwd=repo, capture_output=True, check=False)
        return got.stdout if got.returncode == 0 else None

    return Tree(f"git {repo} @ {sha}", tuple(sorted(blobs)), read)


def dir_tree(path: Path) -> Tree:
    root = Path(path)
    if not root.is_dir():
        raise SourceError(f"{path} is not a directory", fix="pass --tree an unpacked source tree")
    names = tuple(sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and ".git" not in p.parts))
    return Tree(f"tree {root}", names, lambda n: (root / n).read_bytes() if (root / n).is_file() else None)


def archive_tree(archive: Path) -> Tree:
    """An sdist (``.tar.gz`` or ``.zip``), read in memory; paths relative to its top folder."""
    files: dict[str, bytes] = {}
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for n in zf.namelist():
                    if not n.endswith("/") and _wanted_in_archive(n):
                        files[_strip_top(n)] = zf.read(n)
        else:
            with tarfile.open(archive) as tf:
                for m in tf.getmembers():
                    if m.isfile() and _wanted_in_archive(m.name):
                        fh = tf.extractfile(m)
                        if fh is not None:
                            files[_strip_top(m.name)] = fh.read()
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise SourceError(f"cannot read {archive}", why=str(exc), fix="fetch the sdist again (kforge sources fetch)") from exc
    return Tree(f"sdist {archive.name}", tuple(sorted(files)), files.get)


def _wanted_in_archive(name: str) -> bool:
    return name.endswith((".py", ".txt", ".cmake", "PKG-INFO")) or name.endswith("CMakeLists.txt")


def _strip_top(name: str) -> str:
    parts = name.lstrip("./").split("/", 1)
    return parts[1] if len(parts) == 2 else parts[0]


# --------------------------------------------------------------------------- which files are build scripts


def build_scripts(names: Iterable[str], build_dir: str = ".", imported: Iterable[str] = ()) -> tuple[str, ...]:
    """The files whose env reads and flags decide a build: Python and CMake files of the build dir
    (minus tests, docs and vendored code) and, when the build dir is a subfolder, the top-level
    modules and packages its scripts import (FlashInfer's jit-cache build imports ``flashinfer``)."""
    base = PurePosixPath(build_dir) if build_dir not in ("", ".") else None
    wanted = set(imported)
    chosen = []
    for name in names:
        p = PurePosixPath(name)
        if not (p.suffix in (".py", ".cmake") or p.name == "CMakeLists.txt"):
            continue
        if base is not None and not _under(p, base):
            top = p.parts[0] if len(p.parts) > 1 else p.stem
            if top not in wanted:
                continue
            rel = p
        else:
            rel = p.relative_to(base) if base is not None else p
        if any(part in SKIP_DIRS or part.startswith(("test_", ".")) for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("test_") or rel.name == "conftest.py":
            continue
        chosen.append(name)
    return tuple(chosen)


def imported_modules(text: str) -> set[str]:
    """Top-level names a Python file imports (``from flashinfer import aot`` -> ``flashinfer``)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def _under(p: PurePosixPath, base: PurePosixPath) -> bool:
    return p.parts[: len(base.parts)] == base.parts


# --------------------------------------------------------------------------- finding env reads


def _attr_chain(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _is_environ(node: ast.AST) -> bool:
    return _attr_chain(node) in ("os.environ", "environ")


def _env_call_arg(call: ast.Call) -> ast.AST | None:
    """The variable-name argument of ``os.getenv(X)`` / ``os.environ.get(X)``, else None."""
    if not isinstance(call.func, ast.Attribute) or not call.args:
        return None
    owner = _attr_chain(call.func.value)
    return call.args[0] if (owner, call.func.attr) in _ENV_FUNCS else None


def python_env_reads(text: str, file: str) -> list[EnvRead]:
    """Every environment variable a Python file reads by a literal name (or through a helper of its own)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [EnvRead(m.group(1), _site(text, file, m.start()))
                for m in re.finditer(r"""(?:getenv|environ\.get|environ)\s*[\(\[]\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""", text)]
    lines = text.splitlines()
    reads: list[EnvRead] = []
    helpers: set[str] = set()
    # helpers: def f(name, ...): ... os.getenv(name ...) -> calls f("X") read X
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.args.args:
            first = fn.args.args[0].arg
            for node in ast.walk(fn):
                arg = _env_call_arg(node) if isinstance(node, ast.Call) else None
                sub = node.slice if isinstance(node, ast.Subscript) and _is_environ(node.value) else None
                if any(isinstance(a, ast.Name) and a.id == first for a in (arg, sub)):
                    helpers.add(fn.name)
    # names bound to one string constant (FlashInfer: env_var_name = "FLASHINFER_NVCC_THREADS")
    consts: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    consts.setdefault(target.id, set()).add(node.value.value)
    for node in ast.walk(tree):
        name_node: ast.AST | None = None
        if isinstance(node, ast.Call):
            name_node = _env_call_arg(node)
            if name_node is None and isinstance(node.func, ast.Name) and node.func.id in helpers and node.args:
                name_node = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            name_node = node.slice
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and _is_environ(node.comparators[0]):
            name_node = node.left
        names: set[str] = set()
        if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str):
            names = {name_node.value}
        elif isinstance(name_node, ast.Name) and len(consts.get(name_node.id, ())) == 1:
            names = consts[name_node.id]
        line = getattr(node, "lineno", 0)
        for name in names:
            reads.append(EnvRead(name, Site(file, line, lines[line - 1].strip() if 0 < line <= len(lines) else "")))
    return reads


def patch_env_reads(patch_text: str, patch_name: str) -> list[EnvRead]:
    """Env reads in the lines a patch adds (kforge's own patches add some: FLASH_MLA_LOCAL_VERSION)."""
    added = [ln[1:] for ln in patch_text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    found = re.finditer(r"""(?:getenv|environ\.get|environ)\s*[\(\[]\s*["']([A-Za-z_][A-Za-z0-9_]*)["']""", "\n".join(added))
    return [EnvRead(m.group(1), Site(patch_name, 0, "")) for m in found]


def cmake_env_reads(text: str, file: str) -> list[EnvRead]:
    return [EnvRead(m.group(1), _site(text, file, m.start())) for m in _CMAKE_ENV.finditer(text)]


def hard_coded_arch_flags(text: str, file: str) -> list[Site]:
    """Lines that name a gencode/arch themselves (comments skipped)."""
    out = []
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#") or not _ARCH_FLAG.search(line):
            continue
        out.append(Site(file, i, line[:160]))
    return out


def _site(text: str, file: str, offset: int) -> Site:
    line = text.count("\n", 0, offset) + 1
    return Site(file, line, text.splitlines()[line - 1].strip() if text else "")


# --------------------------------------------------------------------------- what kforge sets


def kforge_variables(project: Project, platform_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable kforge may set for this project's builds, with where it comes from."""
    out: dict[str, str] = {}
    for name in (platform_env or {}):
        out.setdefault(name, "platform env")
    for name in project.env:
        out[name] = "project env"
    for prof in project.profiles.values():
        for name in prof.env:
            out.setdefault(name, f"profile {prof.name}")
    for knob in project.arch_knobs:
        if knob.format == "disable-flags":
            for fam in knob.families:
                out.setdefault(f"{knob.prefix or ''}{fam}", "arch knob (disable-flags)")
        elif knob.env:
            out.setdefault(knob.env, f"arch knob ({knob.format})")
    out.setdefault(project.threads_env, "threads (job choice)")
    out.setdefault("NVCC_THREADS", "threads (job choice)")
    if project.local_version_env:
        out.setdefault(project.local_version_env, "local version")
    for name in ("MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL", "CUDA_HOME", "CUDACXX", "CPLUS_INCLUDE_PATH"):
        out.setdefault(name, "toolchain")
    return out


# --------------------------------------------------------------------------- the audit


def audit(project: Project, tree: Tree, *, platform_env: Mapping[str, str] | None = None,
          patches: Sequence[tuple[str, str]] = ()) -> AuditReport:
    """Read the build scripts of ``tree`` and compare their env reads with what kforge sets.

    ``patches`` are ``(name, text)`` of the project's series: a variable only our patch reads
    counts as read (through that patch), not as dead."""
    files = build_scripts(tree.names, project.build_dir)
    if project.build_dir not in ("", "."):
        imported: set[str] = set()
        for name in files:
            if name.endswith(".py"):
                imported |= imported_modules((tree.read(name) or b"").decode("utf-8", errors="replace"))
        files = build_scripts(tree.names, project.build_dir, imported)
    reads: dict[str, list[Site]] = {}
    flags: list[Site] = []
    for name in files:
        data = tree.read(name)
        if data is None:
            continue
        text = data.decode("utf-8", errors="replace")
        found = cmake_env_reads(text, name) if not name.endswith(".py") else python_env_reads(text, name)
        for r in found:
            reads.setdefault(r.name, []).append(r.site)
        flags.extend(hard_coded_arch_flags(text, name))
    ours = kforge_variables(project, platform_env)
    by_patch: dict[str, list[str]] = {}
    for pname, ptext in patches:
        for r in patch_env_reads(ptext, pname):
            if pname not in by_patch.setdefault(r.name, []):
                by_patch[r.name].append(pname)
    def other_reader(name: str) -> str | None:
        if reads.get(name) or (name in TORCH_READERS and not project.torch_abi):
            return None
        return TOOLCHAIN_READERS.get(name)

    knobs = tuple(
        KnobCheck(name, origin, tuple(reads.get(name, ())), other_reader(name), tuple(by_patch.get(name, ())))
        for name, origin in sorted(ours.items())
    )
    ignored = tuple((name, tuple(sites)) for name, sites in sorted(reads.items()) if name not in ours)
    return AuditReport(
        project=project.name,
        source=tree.description,
        files=files,
        knobs=knobs,
        ignored=ignored,
        arch_flags=tuple(flags),
        version_declared=project.upstream_version,
        version_found=declared_version(tree, project.build_dir),
    )


def declared_version(tree: Tree, build_dir: str = ".") -> tuple[str, Site] | None:
    """The version the tree states for itself: version.txt, ``__version__`` in the build dir's
    ``__init__.py``, PKG-INFO, or a literal ``version="..."`` in setup.py (first found)."""
    base = "" if build_dir in ("", ".") else build_dir.rstrip("/") + "/"
    for name in ("version.txt", f"{base}__init__.py", "PKG-INFO", f"{base}setup.py", "setup.py"):
        data = tree.read(name)
        if data is None:
            continue
        text = data.decode("utf-8", errors="replace")
        if name.endswith("version.txt"):
            v = text.strip().splitlines()[0].strip() if text.strip() else ""
            if v:
                return v, Site(name, 1, v)
            continue
        if name == "PKG-INFO":
            m = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
        elif name.endswith("__init__.py"):
            m = _VERSION_ASSIGN.search(text)
        else:
            m = _SETUP_VERSION.search(text)
        if m:
            return m.group(1), _site(text, name, m.start())
    return None


def render_text(report: AuditReport, *, width: int = 100) -> list[str]:
    """The report as plain lines (the CLI prints them; tests read them)."""
    lines = [f"audit {report.project}: {report.source}", f"  build scripts read: {len(report.files)}"]
    if report.version_declared or report.version_found:
        found = f"{report.version_found[0]} ({report.version_found[1]})" if report.version_found else "not found"
        verdict = "MISMATCH" if report.version_mismatch else "ok"
        lines.append(f"  version: forge.toml {report.version_declared or '-'}, tree {found}: {verdict}")
    lines.append("  variables kforge sets:")
    for k in report.knobs:
        where = ", ".join(str(s) for s in k.upstream[:3]) + (f" (+{len(k.upstream) - 3})" if len(k.upstream) > 3 else "")
        lines.append(f"    {k.name:<34} {k.status}{': ' + where if where else ''}   [{k.origin}]")
    lines.append(f"  upstream knobs kforge does not set ({len(report.ignored)}):")
    for name, sites in report.ignored:
        lines.append(f"    {name:<34} {sites[0]}" + (f" (+{len(sites) - 1})" if len(sites) > 1 else ""))
    lines.append(f"  hard-coded arch flags ({len(report.arch_flags)}):")
    for s in report.arch_flags:
        lines.append(f"    {str(s):<40} {s.text[: max(20, width - 46)]}")
    return lines


def dead_knob_summary(report: AuditReport) -> Sequence[str]:
    return [f"{k.name} ({k.origin})" for k in report.dead_knobs]

"""The layers hold: every package imports only its own floor or those below (imports inside functions and
behind TYPE_CHECKING included), the import graph has no cycle, nothing below the CLI imports kforge.commands,
commands don't import each other, and no kforge import hides inside a function or behind TYPE_CHECKING."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kforge"

#: The floors, bottom first: a module imports only from its own floor or those below. A unit is a subpackage
#: of kforge or a top-level module (``plan`` is plan.py); docs/architecture.md draws the same picture.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "log", "fsutil", "locking", "runstatus"),  # the ground floor
    ("cuda",),
    ("config",),
    ("sources",),
    ("build",),
    ("doctor",),
    ("wheels",),
    ("plan", "planenv", "buildinputs", "verified", "platformfloor"),
    ("backends", "preflight", "gputest"),
    ("pipeline",),
    ("release", "ci"),
    ("commands",),
    ("cli", "sessions", "__main__"),
)
FLOOR = {unit: n for n, units in enumerate(FLOORS) for unit in units}

#: Function-level kforge imports that stay for a reason (or belong to another change): path -> why.
ALLOWED_LOCAL_IMPORTS = {
    "sessions.py": "nox imports the noxfile before kforge is installed; register() imports kforge when called",
}


@functools.cache
def _modules(src: Path = SRC) -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(src)), ast.parse(p.read_text())) for p in sorted(src.rglob("*.py"))]


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def _dotted(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["kforge", *parts])


def _unit(rel: str) -> str:
    return rel.split("/")[0].removesuffix(".py")


@functools.cache
def _graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the kforge modules it imports, anywhere in the file (``from kforge.x import y`` names y where y
    is a module, else x; relative imports resolved)."""
    known = {_dotted(rel): rel for rel, _ in _modules(src)}
    graph: dict[str, set[str]] = {}
    for rel, tree in _modules(src):
        me = _dotted(rel)
        package = me if rel.endswith("__init__.py") else me.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.split(".")[0] == "kforge"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                if module.split(".")[0] != "kforge":
                    continue
                for alias in node.names:
                    out.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                  and node.args[0].value.startswith("kforge.")):
                out.add(node.args[0].value)  # importlib.import_module("kforge.x") is an import too
        graph[me] = {m for m in out if m != me}
        assert graph[me] <= set(known), f"{rel} imports a kforge module that does not exist: {graph[me] - set(known)}"
    return graph


def _rel(dotted: str) -> str:
    return {_dotted(rel): rel for rel, _ in _modules()}[dotted]


def test_every_module_has_a_floor() -> None:
    assert sorted({_unit(rel) for rel, _ in _modules()} - set(FLOOR)) == []


def test_nothing_imports_a_floor_above_it() -> None:
    upward = []
    for module, imported in _graph().items():
        mine = FLOOR[_unit(_rel(module))]
        upward += [f"{module} -> {dep}" for dep in sorted(imported) if FLOOR[_unit(_rel(dep))] > mine]
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles(_graph()) == []


def test_the_graph_sees_imports_in_functions_type_checking_and_relative(tmp_path: Path) -> None:
    """The checks above can fail: a cycle made of a function-level, a TYPE_CHECKING and a relative import is found."""
    pkg = tmp_path / "kforge"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from kforge.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("import kforge.a\n")
    graph = _graph(pkg)
    assert graph["kforge.a"] == {"kforge.sub.b"} and graph["kforge.sub.b"] == {"kforge.sub.c"}
    assert _cycles(graph) == [["kforge.a", "kforge.sub.b", "kforge.sub.c", "kforge.a"]]


def test_no_kforge_import_behind_type_checking() -> None:
    found = [f"{rel}:{node.lineno}" for rel, tree in _modules() for node in ast.walk(tree)
             if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
             and any(m.split(".")[0] == "kforge" for m in _imports(node))]
    assert found == []


#: Functions over 60 lines, each with the reason it stays whole: path:function -> why.
LONG_FUNCTIONS = {
    "backends/_runner.py:run_step": "one attempt loop with its OOM retry; the closures share the attempt's state",
    "backends/cibuildwheel.py:cibuildwheel_env": "one CIBW_* mapping written top to bottom, a line per key",
    "config/targets.py:parse_target": "one grammar read left to right (project, arch, platform), an error per token",
    "locking.py:hold": "a context manager whose try/finally owns the lock: wait, report and release share it",
    "sessions.py:_register_matrix": "its imports stay inside (nox loads it before kforge is installed)",
    "sources/gitarchive.py:write": "one atomic archive: built under a temporary name and renamed in one try block",
    "sources/kit.py:build": "one atomic folder: built beside the kit and moved into place in one try block",
    "sources/patches.py:refresh": "one swap by renames, with the restore on failure, in one try block",
}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def test_no_module_over_500_lines() -> None:
    long = [f"{rel}: {len(p.read_text().splitlines())}" for rel, p in
            ((str(p.relative_to(SRC)), p) for p in sorted(SRC.rglob("*.py")))
            if len(p.read_text().splitlines()) > MAX_MODULE_LINES]
    assert long == []


def test_functions_over_60_lines_are_split_or_have_a_reason() -> None:
    long = {f"{rel}:{fn.name}" for rel, tree in _modules() for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES}
    assert sorted(long - set(LONG_FUNCTIONS)) == []
    assert sorted(set(LONG_FUNCTIONS) - long) == []  # a function split since: its reason goes too


def test_only_the_cli_imports_commands() -> None:
    offenders = [rel for rel, tree in _modules()
                 if not rel.startswith("commands/") and rel != "cli.py"
                 and any(m == "kforge.commands" or m.startswith("kforge.commands.") for m in _imports(tree))]
    assert offenders == []


def test_commands_do_not_import_sibling_commands() -> None:
    offenders = [(rel, m) for rel, tree in _modules() if rel.startswith("commands/")
                 for m in _imports(tree) if m.startswith("kforge.commands.") and m != "kforge.commands._common"]
    assert offenders == []


def test_no_kforge_import_inside_a_function() -> None:
    found = []
    for rel, tree in _modules():
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            if any(m == "kforge" or m.startswith("kforge.") for m in _imports(fn)):
                found.append(f"{rel}:{fn.lineno} {fn.name}")
    unexpected = [f for f in found if f.split(":")[0] not in ALLOWED_LOCAL_IMPORTS]
    assert unexpected == []


def test_jobs_and_buildrun_have_no_cycle_and_host_needs_no_jobs() -> None:
    code = ("import sys, kforge.build.jobs, kforge.build.host, kforge.build.measure; "
            "print(sorted(m for m in sys.modules if m in ('kforge.build.run', 'kforge.build.jobs', 'kforge.commands')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC.parent)}).stdout
    assert out.strip() == "['kforge.build.jobs']"  # jobs needs no buildrun; host and measure need neither


def test_nox_can_load_forge_toml_without_kforges_dependencies():
    """nox imports kforge.sessions (and through it config) from its own environment, before kforge is installed."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('elftools', 'auditwheel', 'pefile', 'rich', 'filelock', 'yaml', 'wheel'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.path.insert(0, {str(root / 'src')!r})\n"
        "import kforge.sessions\n"
        "from kforge.config.forge import load_forge\n"
        f"print(len(load_forge(__import__('pathlib').Path({str(root)!r})).projects))\n"
    )
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True)
    assert out.returncode == 0 and int(out.stdout) >= 1, out.stderr

"""The layers hold: nothing below the CLI imports kforge.commands, commands don't import each other, and no
kforge import hides inside a function (the way an import cycle gets dodged)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kforge"

#: Function-level kforge imports that stay for a reason (or belong to another change): path -> why.
ALLOWED_LOCAL_IMPORTS = {
    "sessions.py": "nox imports the noxfile before kforge is installed; register() imports kforge when called",
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(SRC)), ast.parse(p.read_text())) for p in sorted(SRC.rglob("*.py"))]


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


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

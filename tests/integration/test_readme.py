"""The README installs what it uses: every command it shows exists and parses, in order, on a fresh venv.

Each `kforge ...` command the README shows (in code blocks and inline) is parsed by kforge's own
argument parser (placeholders filled in), each `nox -s X` names a session `nox -l` lists, and in a
fresh venv that ran the README's `pip install` lines in order, `kforge --help`, every shown subcommand's `--help`,
`kforge targets`, `python -m kforge --help` and `invoke --list` run and exit 0.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOOLS = ("kforge", "nox", "pip", "invoke", "python")

#: README placeholders -> a value the command accepts
_FILL = [
    (re.compile(r"\$NEW|\$OLD"), "0" * 40),
    (re.compile(r"<target>"), "fmha-sm90"),
    (re.compile(r"<wheel\|dir>"), "wheelhouse"),
    (re.compile(r"<project>"), "fmha"),
    (re.compile(r"\bNAME-sm90\b"), "fmha-sm90"),
    (re.compile(r"\$PWD"), str(ROOT)),
]


def readme_commands(text: str) -> list[str]:
    """Every command line the README shows, in order: code-block lines and inline `tool ...` spans, split at &&."""
    out: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            cmd = line[2:] if line.startswith("$ ") else line
            cmd = cmd.split("  #", 1)[0].strip()
            if cmd.split(" ", 1)[0] in TOOLS:
                out += [c.strip() for c in cmd.split("&&")]
        else:
            for span in re.findall(r"`([^`]+)`", line):
                if span.split(" ", 1)[0] in TOOLS and " " in span:
                    out += [c.strip() for c in span.split("&&")]
    return out


def _fill(cmd: str) -> str:
    for pattern, value in _FILL:
        cmd = pattern.sub(value, cmd)
    return cmd.replace("[", "").replace("]", "")  # a synopsis' optional parts: parse them too


def _names_a_command(argv: list[str]) -> bool:
    """Bare words only (no arguments) that kforge knows as a (sub)command: `argv --help` exits 0."""
    if not argv or any(not w.isalpha() for w in argv):
        return False
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args([*argv, "--help"])
        except SystemExit as exc:
            return exc.code == 0
    return False


def test_readme_shows_the_install_before_the_first_kforge_command() -> None:
    cmds = readme_commands(README.read_text(encoding="utf-8"))
    first_kforge = next(i for i, c in enumerate(cmds) if c.startswith("kforge "))
    assert any(c.startswith("pip install -e .") for c in cmds[:first_kforge]), cmds[:first_kforge + 1]


def test_every_kforge_command_in_the_readme_parses() -> None:
    cmds = [c for c in readme_commands(README.read_text(encoding="utf-8")) if c.startswith("kforge ")]
    assert len(cmds) >= 8, cmds  # the README shows a dozen; finding none would prove nothing
    for cmd in cmds:
        argv = shlex.split(_fill(cmd))[1:]
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            if _names_a_command(argv):  # prose that names a command ("`kforge plan` shows it"), not a command line
                continue
            pytest.fail(f"README command `{cmd}` does not parse (exit {exc.code})")
        assert argv == ["-v"] or getattr(args, "func", None), f"`{cmd}` names no kforge command"


def test_every_nox_session_in_the_readme_is_listed() -> None:
    sessions = [c.split("-s", 1)[1].split()[0] for c in readme_commands(README.read_text(encoding="utf-8"))
                if c.startswith("nox ") and " -s " in c]
    assert sessions
    listed = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0, listed.stderr
    names = {ln.split()[1] for ln in listed.stdout.splitlines() if ln[:2] in ("* ", "- ")}
    for session in sessions:
        if "<" in session:  # a template (`build-<target>`), not a session name
            continue
        assert session in names, f"README runs `nox -s {session}`, which nox -l does not list"


@pytest.mark.integration
@pytest.mark.slow
def test_fresh_venv_follows_the_readme(tmp_path: Path) -> None:
    """Create a venv, run the README's install lines in order, then the commands it shows (their --help)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    installs = [c for c in readme_commands(README.read_text(encoding="utf-8"))
                if c.startswith("pip install") and "--index-url" not in c]  # that one needs a built wheelhouse
    assert any(c.startswith("pip install -e .") for c in installs), installs
    for cmd in dict.fromkeys(installs):  # in the README's order, each once
        argv = [str(bin_dir / "python"), "-m", "pip", *shlex.split(cmd)[1:], "-q"]
        install = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
        if install.returncode != 0 and "Could not find a version" in install.stderr + install.stdout:
            pytest.skip("no package index reachable for kforge's dependencies")
        assert install.returncode == 0, f"README `{cmd}`: {install.stdout[-2000:]}{install.stderr[-2000:]}"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(list(argv), env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{' '.join(argv)}: {out.stdout[-1500:]}{out.stderr[-1500:]}"
        assert "Traceback" not in out.stderr
        return out

    kforge = str(bin_dir / "kforge")  # the venv's own scripts, not whatever else is on PATH
    assert "fmha-sm90" in run(kforge, "targets").stdout
    run(kforge, "--help")
    run(str(bin_dir / "python"), "-m", "kforge", "--help")
    shown = {tuple(shlex.split(_fill(c))[1:3]) for c in readme_commands(README.read_text(encoding="utf-8"))
             if c.startswith("kforge ")}
    subcommands = sorted({words[0] if words[0] not in ("patches", "sources", "wheelhouse", "ci") else
                          " ".join(words) for words in shown if words and not words[0].startswith("-")})
    assert "plan" in subcommands and "patches check" in subcommands
    for sub in subcommands:
        run(kforge, *sub.split(), "--help")
    assert "externals" in run(str(bin_dir / "invoke"), "--list").stdout

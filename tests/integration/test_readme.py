"""The README installs what it uses: every command it shows exists and parses, in order, on a fresh venv.

Each `kforge ...` command the README shows (in code blocks and inline) is parsed by kforge's own
argument parser (placeholders filled in), each `nox -s X` names a session `nox -l` lists, and in a
fresh venv that ran the README's `pip install` lines in order, `kforge --help`, every shown subcommand's `--help`,
`kforge targets`, `python -m kforge --help` and `invoke --list` run and exit 0. The README's plan sample is
what `kforge plan` prints for its target (host-dependent values aside, named below), and every link of the
README and of docs/ leads to a file (and heading) of the repository, as does every repository path they cite.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.cli import build_parser, main

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
    """The README's sessions, and those its docs pages show (docs/*.md)."""
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    sessions = [c.split("-s", 1)[1].split()[0] for page in pages for c in readme_commands(page.read_text(encoding="utf-8"))
                if c.startswith("nox ") and " -s " in c]
    assert len(sessions) > 10, sessions
    listed = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0, listed.stderr
    names = {ln.split()[1] for ln in listed.stdout.splitlines() if ln[:2] in ("* ", "- ")}
    for session in sessions:
        if re.search(r"[<*A-Z]|\.\.\.", session):  # a template: `build-<target>`, `release-NAME`, `build-flashmla-*`
            continue
        assert session in names, f"the README or docs run `nox -s {session}`, which nox -l does not list"


#: Pages whose `kforge plan TARGET` lines are examples that must plan (docs/plan.md also shows one that must fail).
PLAN_PAGES = ("README.md", "docs/targets.md", "docs/windows.md")


@pytest.mark.parametrize("cmd", sorted({c for page in PLAN_PAGES for c in readme_commands((ROOT / page).read_text(encoding="utf-8"))
                                        if c.startswith("kforge plan ") and "<" not in c}))
def test_every_plan_the_readme_and_the_target_pages_show_plans(cmd: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KFORGE_PROFILE", raising=False)
    assert main(shlex.split(cmd)[1:]) == 0, capsys.readouterr().err[-2000:]
    assert capsys.readouterr().out.startswith("plan ")


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
    assert {"plan", "build", "doctor", "targets"} <= set(subcommands), subcommands
    for sub in subcommands:
        run(kforge, *sub.split(), "--help")
    assert "externals" in run(str(bin_dir / "invoke"), "--list").stdout


# ---------------------------------------------------------------------------------------------
# The plan sample: what `kforge plan <target>` prints, less what the host decides

#: Plan lines whose value comes from the host, not the target: the interpreter's Python and torch (variant,
#: torch, python, version), the nvcc found (cuda), CPU count and free memory (jobs), what this kforge cache has
#: measured (order), the checkout's folder and state (work dir, enforce). Compared by name only.
HOST_LINES = ("variant", "cuda", "torch", "python", "jobs", "order", "version", "work dir", "enforce")
#: Printed only when torch is, or is to be, provisioned: dropped on both sides. (On the backend line, whose
#: packages the build uses depends on the same thing: normalised too.)
OPTIONAL_LINES = ("c++ abi", "build env")
#: env entries with host values (toolkit paths, job counts, the local version that names torch): dropped.
HOST_ENV = ("CMAKE_BUILD_PARALLEL_LEVEL", "CPLUS_INCLUDE_PATH", "CUDACXX", "CUDA_HOME", "MAX_JOBS", "NVCC_THREADS")
README_ROOT = "~/kforge"  # how the README writes the checkout's folder


def _normalise_plan(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if line.startswith("    "):  # an env entry
            name = line.strip().split("=", 1)[0]
            if name in HOST_ENV or name.endswith(("_LOCAL_VERSION", "_NVCC_THREADS")):
                continue
            out.append(line.rstrip())
            continue
        key = line[2:14].strip() if line.startswith("  ") else None
        if key in OPTIONAL_LINES:
            continue
        if key == "backend":  # whose packages: this interpreter's, or a uv environment's where it lacks the variant's torch
            line = re.sub(r"uses (this interpreter's|the variant environment's) packages", "uses <host> packages", line)
        if key == "platform":  # the host's glibc against the project's floor: the version is the host's
            line = re.sub(r"glibc \d+\.\d+", "glibc <host>", line)
        out.append(f"  {key:<12}<host>" if key in HOST_LINES else line.rstrip())
    return out


def _readme_plan_sample(text: str) -> tuple[str, str]:
    """The README's `$ kforge plan TARGET` console block: the target and the output shown under it."""
    match = re.search(r"^```console\n\$ kforge plan (\S+)\n(.*?)^```", text, re.M | re.S)
    assert match, "the README shows no `$ kforge plan TARGET` console block"
    return match.group(1), match.group(2)


def test_the_readme_plan_sample_is_what_kforge_plan_prints(tmp_path: Path) -> None:
    target, shown = _readme_plan_sample(README.read_text(encoding="utf-8"))
    env = {**os.environ, "KFORGE_CACHE": str(tmp_path / "cache"), "NO_COLOR": "1"}
    env.pop("KFORGE_PROFILE", None)
    run = subprocess.run([sys.executable, "-m", "kforge", "plan", target], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    printed = run.stdout.replace(str(ROOT), README_ROOT)
    want, got = _normalise_plan(shown), _normalise_plan(printed)
    assert len(want) > 15 and any(line.startswith("  nvcc flags") for line in want)  # a whole plan, not a stub
    assert got == want, ("the README's plan sample is stale: regenerate it with "
                         f"`kforge plan {target} | sed 's#'$PWD'#{README_ROOT}#g'`\n"
                         + "\n".join(difflib.unified_diff(want, got, "README", "kforge plan", lineterm="")))


def test_normalising_keeps_what_the_target_decides() -> None:
    """The comparison can fail: a changed patch list, arch flag or arch-knob variable is not normalised away."""
    _, shown = _readme_plan_sample(README.read_text(encoding="utf-8"))
    base = _normalise_plan(shown)
    for old, new in (("sm_120a", "sm_120f"), ("TORCH_CUDA_ARCH_LIST=", "TORCH_CUDA_ARCH_LIST=9.0;"),
                     ("patches/flashmla (11", "patches/flashmla (10")):
        assert old in shown
        assert _normalise_plan(shown.replace(old, new)) != base, old


# ---------------------------------------------------------------------------------------------
# Links and cited paths of the README and docs/

DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
#: A repository path in backticks (`src/kforge/plan.py`, `tests/unit/test_x.py::name`, `kernels/fmha/csrc/x.cuh:19`).
_CITED = re.compile(r"`((?:src/kforge|tests/(?:unit|integration|gpu|faults|fixtures)|kernels|patches|benchmarks|docs"
                    r"|\.github)/[^`\s<>*{}…]+)`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", md.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_to_a_file_and_heading_of_the_repository(doc: Path) -> None:
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        if not target.exists() or ROOT not in target.parents and target != ROOT:
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no heading '{anchor}' there)")
    assert broken == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_it_cites_exists(doc: Path) -> None:
    missing = []
    for cited in _CITED.findall(doc.read_text(encoding="utf-8")):
        path = re.sub(r"(::\S+|:\d[\d,-]*)$", "", cited).rstrip(".,;:)")
        if re.search(r"/[A-Z][A-Z_]*(/|$)", path):  # a placeholder: patches/NAME/series
            continue
        if not (ROOT / path).exists():
            missing.append(cited)
    assert missing == []

"""One logger for the pipeline: numbered steps with timings, and CI log groups where CI shows them."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console


@dataclass
class StepLog:
    """Prints ``==> [3/8] build: ...`` and ``<== build 12.3 s``; in GitHub Actions each step is a group."""

    total: int
    title: str = ""
    console: Console = field(default_factory=lambda: Console(stderr=True, highlight=False, soft_wrap=True))
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    timings: dict[str, float] = field(default_factory=dict)
    _n: int = 0

    @property
    def in_ci_groups(self) -> bool:
        return self.environ.get("GITHUB_ACTIONS") == "true"

    @contextmanager
    def step(self, name: str, detail: str = "") -> Iterator[None]:
        self._n += 1
        head = f"[{self._n}/{self.total}] {name}" + (f": {detail}" if detail else "")
        if self.in_ci_groups:
            print(f"::group::{self.title} {head}", file=sys.stderr, flush=True)
        self.console.print(f"[bold cyan]==>[/] {head}")
        start = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            took = time.monotonic() - start
            self.timings[name] = took
            mark = "[green]ok[/]" if ok else "[red]failed[/]"
            self.console.print(f"[dim]<==[/] {name} {mark} in {took:.1f} s")
            if self.in_ci_groups:
                print("::endgroup::", file=sys.stderr, flush=True)

    def info(self, text: str) -> None:
        self.console.print(f"    {text}", highlight=False, markup=False)

    def warning(self, text: str) -> None:
        self.console.print(f"    [yellow]warning:[/] {text}", highlight=False)

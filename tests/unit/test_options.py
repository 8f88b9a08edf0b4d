"""The option table: it makes the flags and the cascade, and docs/options.md is generated from it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kforge.config import options
from kforge.config.model import BACKEND_NAMES
from kforge.config.options import OPTIONS, PlanOptions
from kforge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_docs_options_page_is_generated_from_the_table() -> None:
    assert (ROOT / "docs" / "options.md").read_text() == options.options_page(), \
        "run: python -m kforge.config.options > docs/options.md"


def test_every_option_is_a_flag_and_a_variable() -> None:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    flags = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for opt in OPTIONS:
        assert opt.flag in flags and flags[opt.flag].dest == opt.name
        assert opt.env.startswith("KFORGE_") and opt.name in PlanOptions.__dataclass_fields__
    assert tuple(flags["--backend"].choices) == BACKEND_NAMES  # the one list of backend names
    args = parser.parse_args(["--max-jobs", "3", "--no-build-isolation", "--env", "A=1"])
    assert (args.max_jobs, args.build_isolation, args.env) == (3, False, ["A=1"])


def test_cascade_flags_over_variables() -> None:
    environ = {"KFORGE_CUDA": "12.8", "KFORGE_MAX_JOBS": "4", "KFORGE_BACKEND": "cmake", "KFORGE_BUILD_ISOLATION": "no"}
    opts = PlanOptions.from_cascade(environ, max_jobs=2, backend=None)
    assert (opts.cuda, opts.cuda_from, opts.max_jobs, opts.backend, opts.build_isolation) == ("12.8", "KFORGE_CUDA", 2, "cmake", False)
    assert PlanOptions.from_cascade(environ, cuda="13.0").cuda_from == "--cuda"
    with pytest.raises(ConfigError, match="KFORGE_BACKEND='nativ' is not one of"):
        PlanOptions.from_cascade({"KFORGE_BACKEND": "nativ"})
    with pytest.raises(ConfigError, match="--env 'X' is not KEY=VALUE"):
        options.parse_env_pairs(["X"])


def test_ptx_and_keep_debug_come_from_flags_and_variables() -> None:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(["--ptx", "none", "--keep-debug"])
    assert (args.ptx, args.strip_debug) == ("none", False)
    assert parser.parse_args([]).strip_debug is None  # not given: the project's strip_debug decides
    opts = PlanOptions.from_cascade({"KFORGE_PTX": "all", "KFORGE_STRIP_DEBUG": "0"})
    assert (opts.ptx, opts.strip_debug) == ("all", False)
    assert PlanOptions.from_cascade({"KFORGE_PTX": "all"}, ptx="highest").ptx == "highest"  # the flag wins
    assert PlanOptions.from_cascade({"KFORGE_STRIP_DEBUG": "yes"}).strip_debug is True
    with pytest.raises(ConfigError, match="KFORGE_PTX='sass' is not one of upstream, highest, none, all"):
        PlanOptions.from_cascade({"KFORGE_PTX": "sass"})

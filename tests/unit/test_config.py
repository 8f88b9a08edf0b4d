"""forge.toml loading: the real file, and every kind of malformed input with its key path."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from kforge.config import forge as config
from kforge.config import model, releasematrix
from kforge.config.forge import load_forge, normalise_env_value
from kforge.config.source import GitSource, SdistSource
from kforge.errors import ConfigError
from kforge.sources.series import load_series

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = """
[platforms.linux-x86_64]
alias = "linux"
os = "linux"

[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a"]
arch_knobs = [{ env = "DEMO_ARCHS", format = "numbers" }]
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "forge.toml").write_text(text)
    return tmp_path


def test_real_forge_toml_declares_every_project() -> None:
    forge = load_forge(ROOT)
    assert list(forge.projects) == ["fmha", "flash-attn", "flash-attn3", "flash-attn3-standalone", "flashmla", "flashinfer"]
    assert forge.projects["fmha"].source.path == "kernels/fmha"
    fa = forge.projects["flash-attn"]
    assert fa.sdist is not None and fa.sdist.version == "2.8.3.post2" and len(fa.sdist.sha256) == 64
    assert fa.git is not None and len(fa.git.commit) == 40
    assert forge.projects["flash-attn3"].build_dir == "hopper"
    assert set(forge.projects["flash-attn3"].profiles) == {"minimal", "full"}
    assert {p.name for p in forge.platforms.values()} >= {"linux-x86_64", "windows-amd64"}


def test_the_standalone_fa3_library_shares_flash_attn3s_pin_and_series() -> None:
    forge = load_forge(ROOT)
    fa3, lib = forge.projects["flash-attn3"], forge.projects["flash-attn3-standalone"]
    assert lib.git == fa3.git and lib.source == fa3.source and lib.patches == fa3.patches
    assert lib.upstream_version == fa3.upstream_version and lib.knobs_valid_for == fa3.knobs_valid_for
    assert lib.build_dir == "hopper/standalone" and [a.sm for a in lib.archs] == ["sm_90a"]
    assert (lib.backend, lib.torch_abi, lib.build_isolation) == ("native", False, True)
    assert [(k.env, k.format) for k in lib.arch_knobs] == [("CMAKE_CUDA_ARCHITECTURES", "cmake")]
    assert {p: lib.profiles[p].env["CMAKE_ARGS"] for p in lib.profiles} == {
        "minimal": "-DFA3S_PROFILE=minimal", "full": "-DFA3S_PROFILE=full"}
    assert (lib.units("minimal"), lib.units("full"), lib.default_profile) == (23, 225, "full")
    assert lib.gpu_tests is not None and lib.gpu_tests.paths == ("hopper/standalone/tests/python",)
    assert "scikit-build-core>=0.10" in lib.build_requires and lib.ci_runner == "self-hosted"


# aot.get_default_config()'s keys at the flashinfer pin; patch 0004 adds its own add_* switches to them.
FLASHINFER_AOT_KEYS = {"fa2_head_dim", "fa3_head_dim", "f16_dtype", "f8_dtype", "use_sliding_window",
                       "use_logits_soft_cap", "add_comm", "add_gemma", "add_oai_oss", "add_moe", "add_act",
                       "add_misc", "add_xqa"}


def test_flashinfer_decode_profile_narrows_generation_with_keys_its_series_defines() -> None:
    """The decode profile's FLASHINFER_AOT_CONFIG turns every add_* switch off and names only keys that upstream
    or the series' 0004 defines (an unknown key fails the build), and agrees with FLASHINFER_AOT_MODULES."""
    fi = load_forge(ROOT).projects["flashinfer"]
    env = fi.profiles["decode"].env
    assert set(env) == {"FLASHINFER_AOT_CONFIG", "FLASHINFER_AOT_MODULES"}
    assert fi.profiles["full"].env == {}
    patch = next(e.path for e in load_series(fi.patches).entries if e.name.startswith("0004-"))
    added = re.search(r"^\+_ATTENTION_ADD_KEYS = \((.*?)^\+\)", patch.read_text(), re.M | re.S)
    assert added is not None, patch.name
    series_keys = set(re.findall(r'"(add_\w+)"', added.group(1)))
    assert {"add_prefill", "add_trtllm_gen_fmha", "add_mla"} <= series_keys
    cfg = json.loads(env["FLASHINFER_AOT_CONFIG"])
    assert set(cfg) == FLASHINFER_AOT_KEYS | series_keys  # every switch is named, so none is left on by default
    assert [k for k, v in cfg.items() if k.startswith("add_") and v is not False] == []
    assert (cfg["fa2_head_dim"], cfg["fa3_head_dim"], cfg["f8_dtype"]) == ([[128, 128]], [], [])
    assert (cfg["use_sliding_window"], cfg["use_logits_soft_cap"]) == ([False], [False])
    modules = env["FLASHINFER_AOT_MODULES"].split(",")
    assert len(modules) == 4 and all("head_dim_qk_128_head_dim_vo_128" in m and m.endswith(
        "use_swa_False_use_logits_cap_False") for m in modules)
    assert {re.search(r"dtype_q_(\w+?)_", m).group(1) for m in modules} == {
        {"float16": "f16", "bfloat16": "bf16"}[d] for d in cfg["f16_dtype"]}


def test_compile_units_per_profile_fall_back_to_the_projects(tmp_path: Path) -> None:
    text = MINIMAL.replace("[projects.demo]", "[projects.demo]\ncompile_units = 7") + (
        '\n[projects.demo.profiles.small]\ncompile_units = 3\n[projects.demo.profiles.full]\nenv = {}\n')
    demo = load_forge(write(tmp_path, text)).projects["demo"]
    assert (demo.units("small"), demo.units("full"), demo.units(None), demo.default_profile) == (3, 7, 7, "full")
    bare = load_forge(write(tmp_path, MINIMAL)).projects["demo"]
    assert (bare.units(None), bare.default_profile, bare.ci_runner) == (None, None, "hosted")


def test_ci_runner_defaults_to_self_hosted_for_torch_abi_projects(tmp_path: Path) -> None:
    torch = load_forge(write(tmp_path, MINIMAL + "torch_abi = true\n")).projects["demo"]
    assert torch.ci_runner == "self-hosted"
    hosted = load_forge(write(tmp_path, MINIMAL + 'torch_abi = true\nci_runner = "hosted"\n')).projects["demo"]
    assert hosted.ci_runner == "hosted"


def test_minimal_file_loads_with_defaults(tmp_path: Path) -> None:
    forge = load_forge(write(tmp_path, MINIMAL))
    demo = forge.projects["demo"]
    assert [a.sm for a in demo.archs] == ["sm_80", "sm_90a"]
    assert demo.default_arch.sm == "sm_90a"
    assert demo.backend == "native" and demo.platforms == ("linux-x86_64",)
    assert demo.threads_env == "NVCC_THREADS"


@pytest.mark.parametrize(
    ("text", "key_path", "hint"),
    [
        (MINIMAL.replace('archs = ["sm_80"', 'arhcs = ["sm_80"'), "projects.demo.arhcs", "did you mean 'archs'"),
        (MINIMAL.replace('"sm_90a"]', '"sm_91"]'), "projects.demo.archs[1]", "sm_91"),
        (MINIMAL.replace('archs = ["sm_80", "sm_90a"]', 'archs = "sm_80"\nbackend = 3'), "projects.demo.backend", "must be a string"),
        (MINIMAL + '\nbackend = "nativ"\n', "", "did you mean 'native'"),
        (MINIMAL.replace('format = "numbers"', 'format = "number"'), "projects.demo.arch_knobs[0].format", "did you mean 'numbers'"),
        (MINIMAL.replace('os = "linux"', 'os = "mac"'), "platforms.linux-x86_64.os", "must be 'linux' or 'windows'"),
        (MINIMAL + 'knobs_valid_for = "==1.0"\n', "projects.demo.knobs_valid_for", "needs upstream_version"),
        (MINIMAL + 'upstream_version = "1.0"\nknobs_valid_for = "1.0 or so"\n', "projects.demo.knobs_valid_for",
         "is not a version specifier"),
        (MINIMAL + 'upstream_version = "main"\n', "projects.demo.upstream_version", "is not a PEP 440 version"),
        (MINIMAL.replace('source = { local = "kernels/demo" }',
                         'source = { git = { path = "externals/demo", url = "https://x.invalid/demo.git", '
                         'commit = "9241ae3ef9bac614dd25e45e507e089f888280e0" } }')
         + 'upstream_version = "1.0.0+323f076"\n', "projects.demo.upstream_version", "names commit 323f076"),
        (MINIMAL + '\n[matrix]\nexclude = [{ project = "demoo" }]\n', "matrix.exclude[0].project", "did you mean 'demo'"),
        (MINIMAL.replace("[projects.demo]", "[projects.demo]\nplatforms = [\"linux-x86\"]"), "projects.demo.platforms[0]", "linux-x86_64"),
        (MINIMAL.replace('{ local = "kernels/demo" }', '{ git = { path = "x", url = "u", commit = "abc" } }'),
         "projects.demo.source.git.commit", "40-hex"),
        ("[platforms.linux-x86_64]\nos='linux'\n[projects]\n", "projects", "is empty"),
        (MINIMAL.replace('format = "numbers" }', 'format = "numbers", only = ["120"] }'), "projects.demo.arch_knobs[0].only[0]", "arch number"),
        ("[toolchains]\ncuda = []\n" + MINIMAL, "toolchains.cuda", "is empty"),
        (MINIMAL + 'arch_sets = { release = ["sm_80", "sm_100"] }\n', "projects.demo.arch_sets.release[1]", "not in projects.demo.archs"),
        (MINIMAL + 'arch_sets = { release = ["sm_80", "8.0"] }\n', "projects.demo.arch_sets.release[1]", "lists sm_80 twice"),
        (MINIMAL + 'arch_sets = { sm90 = ["sm_90a"] }\n', "projects.demo.arch_sets.sm90", "reads as an arch"),
        (MINIMAL + 'arch_sets = { linux = ["sm_90a"] }\n', "projects.demo.arch_sets.linux", "or a platform"),
        (MINIMAL + 'arch_sets = { "a-b" = ["sm_90a"] }\n', "projects.demo.arch_sets.a-b", "not a valid arch set name"),
        (MINIMAL + 'arch_sets = { release = [] }\n', "projects.demo.arch_sets.release", "is empty"),
        (MINIMAL + 'arch_sets = { release = ["sm_90f"] }\n', "projects.demo.arch_sets.release[0]", "no 'f' variant"),
        (MINIMAL + 'arch_sets = { "sm90+sm80" = ["sm_80", "sm_90a"] }\n', "projects.demo.arch_sets.sm90+sm80", 'Name it "sm80+sm90"'),
        (MINIMAL + 'arch_sets = { "sm80+sm90" = ["sm_80"] }\n', "projects.demo.arch_sets.sm80+sm90", "joins archs with '+' but lists sm_80"),
        (MINIMAL + 'arch_sets = { "sm80+gpu" = ["sm_80", "sm_90a"] }\n', "projects.demo.arch_sets.sm80+gpu", "a name with '+' joins archs"),
        (MINIMAL + '\n[projects.demo.profiles.small]\ncompile_units = 0\n', "projects.demo.profiles.small.compile_units",
         "positive integer"),
        (MINIMAL + '\n[projects.demo.profiles.small]\ncompile_unit = 3\n', "projects.demo.profiles.small.compile_unit",
         "did you mean 'compile_units'"),
        (MINIMAL + '\n[projects.demo.profiles."../x"]\nenv = {}\n', "projects.demo.profiles.../x", "not a valid profile name"),
        (MINIMAL + 'ci_runner = "self_hosted"\n', "projects.demo.ci_runner", "did you mean 'self-hosted'"),
        (MINIMAL + 'ptx = "hihgest"\n', "projects.demo.ptx", "did you mean 'highest'"),
        (MINIMAL + 'ptx = true\n', "projects.demo.ptx", "must be a string"),
        (MINIMAL + 'upstream_ptx = "upstream"\n', "projects.demo.upstream_ptx", "records what upstream's own build ships"),
        (MINIMAL + 'upstream_ptx = "sass"\n', "projects.demo.upstream_ptx", "must be one of none, highest, all"),
        (MINIMAL + 'strip_debug = "yes"\n', "projects.demo.strip_debug", "must be a boolean"),
        (MINIMAL + 'ptxas_threads = 0\n', "projects.demo.ptxas_threads", "from 1 (ptxas on one thread"),
        (MINIMAL + 'ptxas_threads = 65\n', "projects.demo.ptxas_threads", "to 64"),
        (MINIMAL + 'ptxas_threads = "4"\n', "projects.demo.ptxas_threads", "must be an integer"),
    ],
)
def test_malformed_files_name_the_key(tmp_path: Path, text: str, key_path: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_forge(write(tmp_path, text))
    message = info.value.render()
    assert key_path in message
    assert hint in message
    assert "Traceback" not in message


def test_ptx_and_strip_debug_default_to_upstreams_and_stripped(tmp_path: Path) -> None:
    demo = load_forge(write(tmp_path, MINIMAL)).projects["demo"]
    assert (demo.ptx, demo.upstream_ptx, demo.strip_debug) == ("upstream", None, True)
    text = MINIMAL + 'ptx = "all"\nupstream_ptx = "none"\nstrip_debug = false\n'
    demo = load_forge(write(tmp_path, text)).projects["demo"]
    assert (demo.ptx, demo.upstream_ptx, demo.strip_debug) == ("all", "none", False)


def test_ptxas_threads_default_to_one(tmp_path: Path) -> None:
    assert load_forge(write(tmp_path, MINIMAL)).projects["demo"].ptxas_threads == 1
    assert load_forge(write(tmp_path, MINIMAL + "ptxas_threads = 4\n")).projects["demo"].ptxas_threads == 4


def test_every_real_project_says_what_ptx_it_ships() -> None:
    """No project of the real file falls back to kforge's default: each records upstream's PTX, or sets its own."""
    forge = load_forge(ROOT)
    unsaid = [p.name for p in forge.projects.values() if p.ptx == "upstream" and p.upstream_ptx is None]
    assert unsaid == []
    assert {n: (p.ptx, p.upstream_ptx) for n, p in forge.projects.items()} == {
        "fmha": ("highest", None), "flash-attn": ("upstream", "none"), "flash-attn3": ("upstream", "none"),
        "flash-attn3-standalone": ("upstream", "none"), "flashmla": ("upstream", "none"), "flashinfer": ("upstream", "none"),
    }
    assert all(p.strip_debug for p in forge.projects.values())


def test_a_plus_named_arch_set_lists_that_build_under_its_own_id(tmp_path: Path) -> None:
    from kforge.config.targets import expand_matrix, parse_target

    forge = load_forge(write(tmp_path, MINIMAL + 'arch_sets = { "sm80+sm90" = ["sm_90a", "8.0"] }\n'))
    assert [a.sm for a in forge.projects["demo"].arch_sets["sm80+sm90"]] == ["sm_80", "sm_90a"]
    assert [t.id for t in expand_matrix(forge, "linux-x86_64")] == ["demo-sm80", "demo-sm90", "demo-sm80+sm90"]
    assert parse_target(forge, "demo-sm90+sm80", "linux-x86_64").id == "demo-sm80+sm90"  # any spelling: one build


def test_arch_sets_resolve_to_the_declared_archs_in_order(tmp_path: Path) -> None:
    demo = load_forge(write(tmp_path, MINIMAL + 'arch_sets = { release = ["9.0", "sm_80"], hopper = ["sm_90a"] }\n')).projects["demo"]
    assert [a.sm for a in demo.arch_sets["release"]] == ["sm_80", "sm_90a"]  # the declared variant, sorted
    assert demo.release_set == demo.arch_sets["release"]
    assert load_forge(write(tmp_path, MINIMAL)).projects["demo"].release_set is None


def test_duplicate_project_is_a_toml_error(tmp_path: Path) -> None:
    text = MINIMAL + '\n[projects.demo]\nsource = { local = "x" }\narchs = ["sm_80"]\n'
    with pytest.raises(ConfigError) as info:
        load_forge(write(tmp_path, text))
    assert "not valid TOML" in info.value.render() and "demo" in info.value.render()


def test_missing_file_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_forge(tmp_path)
    assert "forge.toml" in info.value.render() and "--root" in info.value.render()


def test_env_values_are_normalised(tmp_path: Path) -> None:
    text = MINIMAL.replace("[projects.demo]", "[projects.demo]\nenv = { NVCC_THREADS = \" 4 \", FLAGS = \"-O3   -g\" }")
    demo = load_forge(write(tmp_path, text)).projects["demo"]
    assert demo.env["NVCC_THREADS"] == "4"
    assert demo.env["FLAGS"] == "-O3 -g"
    assert normalise_env_value("\t80;90 \n") == "80;90"


def test_docs_list_every_key_of_the_schema() -> None:
    """docs/forge-toml.md names every field of the dataclasses the file is read into."""
    page = (ROOT / "docs" / "forge-toml.md").read_text()
    words = {w for span in re.findall(r"`([^`]+)`", page) for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}  # words in code
    tables = (config.ToolchainsTable, model.Platform, config.ProjectTable, config.SourceTable, model.ArchKnob,
              model.GpuTests, model.Profile, config.RuleTable, GitSource, SdistSource,
              releasematrix.ReleaseTable, releasematrix.VariantTable, releasematrix.ReleaseRuleTable)
    missing = [f"{cls.__name__}.{f.name}" for cls in tables for f in dataclasses.fields(cls)
               if f.name != "name" and f.name not in words]
    assert missing == []

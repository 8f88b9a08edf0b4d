"""The release matrix: forge.toml's [projects.X.release] read, checked and expanded."""

from __future__ import annotations

import pytest
from kforge_testkit import write_forge_toml

from kforge.config.forge import load_forge
from kforge.config.releasematrix import expand, parse_selector, select
from kforge.errors import ConfigError

TORCH_PROJECT = """
[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a", "sm_120a"]
torch_abi = true
build_isolation = false

[projects.demo.release]
archs = ["sm_90a", "sm_120a"]
variants = [{ cuda = "13.0", torch = "2.11.0", python = "3.12" }, { cuda = "12.8", torch = "2.9.1", python = "3.10" }]
exclude = [{ arch = ["sm_120a"], cuda = ["12.8"] }]
"""


def test_expand_is_archs_times_variants_less_excludes(tmp_path):
    write_forge_toml(tmp_path, TORCH_PROJECT)
    forge = load_forge(tmp_path)
    builds = expand(forge.projects["demo"].release, "3.11")
    assert [(b.archs[0].sm, b.variant.id) for b in builds] == [
        ("sm_90a", "cu130-torch2.11-cp312"), ("sm_90a", "cu128-torch2.9-cp310"), ("sm_120a", "cu130-torch2.11-cp312")]


def test_variant_without_python_takes_the_hosts(tmp_path):
    write_forge_toml(tmp_path, """
[projects.free]
source = { local = "kernels/free" }
archs = ["sm_90a"]
[projects.free.release]
archs = ["sm_90a"]
variants = [{ cuda = "13.0" }]
""")
    builds = expand(load_forge(tmp_path).projects["free"].release, "3.13")
    assert [b.variant.id for b in builds] == ["cu130-cp313"]


@pytest.mark.parametrize("release,problem", [
    ('archs = ["sm_75"]\nvariants = [{ cuda = "13.0", torch = "2.11" }]', "release.archs[0] is sm_75, which is not in"),
    ('archs = ["sm_90a"]\nvariants = [{ cuda = "13.0" }]', "release.variants[0].torch is missing"),
    ('archs = ["sm_90a"]\nvariants = [{ cuda = "thirteen", torch = "2.11" }]', "release.variants[0].cuda"),
    ('archs = ["sm_90a"]\nvariants = [{ cuda = "13.0", torch = "2.11", python = "two" }]', "variants[0].python"),
    ('archs = ["sm_90a"]\nvariants = []', "release.variants is empty"),
    ('archs = ["sm_90a"]\nvariants = [{ cuda = "13.0", torch = "2.11" }]\nexclude = [{}]', "release.exclude[0] is empty"),
    ('archs = ["sm_90a"]\nvariants = [{ cuda = "13.0", torch = "2.11", pyton = "3.12" }]', "did you mean"),
])
def test_bad_release_tables_name_the_key(tmp_path, release, problem):
    body = TORCH_PROJECT.split("[projects.demo.release]")[0] + "[projects.demo.release]\n" + release + "\n"
    write_forge_toml(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_forge(tmp_path)
    assert problem in err.value.what


def test_torch_for_a_torch_free_project_is_refused(tmp_path):
    write_forge_toml(tmp_path, """
[projects.free]
source = { local = "kernels/free" }
archs = ["sm_90a"]
[projects.free.release]
archs = ["sm_90a"]
variants = [{ cuda = "13.0", torch = "2.11" }]
""")
    with pytest.raises(ConfigError, match="torch-free"):
        load_forge(tmp_path)


def test_selectors_name_an_arch_a_variant_or_both(tmp_path):
    write_forge_toml(tmp_path, TORCH_PROJECT)
    builds = expand(load_forge(tmp_path).projects["demo"].release, "3.11")
    assert [b.key for b in builds] == ["sm_90a/cu130-torch2.11-cp312", "sm_90a/cu128-torch2.9-cp310",
                                       "sm_120a/cu130-torch2.11-cp312"]

    def keys(*texts):  # noqa: ANN002, ANN202
        return [b.key for b in select(builds, [parse_selector(t) for t in texts], "demo")]

    assert keys("sm_90") == keys("sm90a") == keys("9.0") == ["sm_90a/cu130-torch2.11-cp312", "sm_90a/cu128-torch2.9-cp310"]
    assert keys("cu130-torch2.11-cp312") == ["sm_90a/cu130-torch2.11-cp312", "sm_120a/cu130-torch2.11-cp312"]
    assert keys("sm_120/cu130-torch2.11-cp312") == ["sm_120a/cu130-torch2.11-cp312"]
    assert keys("sm_120", "sm_90/cu128-torch2.9-cp310") == ["sm_90a/cu128-torch2.9-cp310", "sm_120a/cu130-torch2.11-cp312"]
    assert keys() == [b.key for b in builds]  # no selector: the whole matrix
    with pytest.raises(ConfigError, match="matches no build") as err:
        keys("sm_120/cu128-torch2.9-cp310")  # excluded by the matrix
    assert "sm_120a/cu130-torch2.11-cp312" in err.value.why


@pytest.mark.parametrize("text,problem", [
    ("sm_90/", "one side of '/' is empty"),
    ("/cu130-cp312", "one side of '/' is empty"),
    ("sm_90/cu130", "not a variant id"),
    ("cu130-torch2.11.0-cp312", "not a variant id"),
    ("sm_99x", "is not a CUDA arch"),
    ("everything", "is not a CUDA arch"),
])
def test_bad_selectors_say_how_to_write_one(text, problem):
    with pytest.raises(ConfigError) as err:
        parse_selector(text)
    assert "is not a build selector" in err.value.what and problem in err.value.why
    assert "--only sm_90/cu130-torch2.11-cp312" in err.value.fix


SET_PROJECT = """
[projects.demo]
source = { local = "kernels/demo" }
archs = ["sm_80", "sm_90a", "sm_120a"]
arch_sets = { release = ["sm_80", "sm_90a", "sm_120a"], hopper = ["sm_90a"] }
torch_abi = true
build_isolation = false

[projects.demo.release]
archs = ["release", "sm_90a"]
variants = [{ cuda = "13.0", torch = "2.11.0", python = "3.12" }, { cuda = "12.8", torch = "2.9.1", python = "3.12" }]
"""


def test_an_arch_set_in_the_matrix_is_one_fat_build_per_variant(tmp_path):
    write_forge_toml(tmp_path, SET_PROJECT)
    builds = expand(load_forge(tmp_path).projects["demo"].release, "3.11")
    assert [(b.key, [a.sm for a in b.archs], b.entry.arch_set) for b in builds] == [
        ("release/cu130-torch2.11-cp312", ["sm_80", "sm_90a", "sm_120a"], "release"),
        ("release/cu128-torch2.9-cp312", ["sm_80", "sm_90a", "sm_120a"], "release"),
        ("sm_90a/cu130-torch2.11-cp312", ["sm_90a"], None),
        ("sm_90a/cu128-torch2.9-cp312", ["sm_90a"], None)]
    # --only names the set by its name; an arch selects only its own per-arch builds, not the fat one
    sel = [parse_selector("release/cu130-torch2.11-cp312", ("release", "hopper"))]
    assert [b.key for b in select(builds, sel, "demo")] == ["release/cu130-torch2.11-cp312"]
    assert [b.key for b in select(builds, [parse_selector("sm_90")], "demo")] == [
        "sm_90a/cu130-torch2.11-cp312", "sm_90a/cu128-torch2.9-cp312"]
    with pytest.raises(ConfigError, match="matches no build"):
        select(builds, [parse_selector("hopper", ("release", "hopper"))], "demo")  # a set the matrix does not build


@pytest.mark.parametrize("rule,left", [
    # an arch rule leaves out the fat build when the set holds that arch (the pair is never built)
    ('{ arch = ["sm_120a"], cuda = ["12.8"] }', ["release/cu130-torch2.11-cp312", "sm_90a/cu130-torch2.11-cp312",
                                                "sm_90a/cu128-torch2.9-cp312"]),
    # a rule may name the set itself
    ('{ arch = ["release"], cuda = ["12.8"] }', ["release/cu130-torch2.11-cp312", "sm_90a/cu130-torch2.11-cp312",
                                               "sm_90a/cu128-torch2.9-cp312"]),
    ('{ arch = ["sm_80"] }', ["sm_90a/cu130-torch2.11-cp312", "sm_90a/cu128-torch2.9-cp312"]),
])
def test_excludes_reach_arch_set_builds(tmp_path, rule, left):
    write_forge_toml(tmp_path, SET_PROJECT + f"exclude = [{rule}]\n")
    builds = expand(load_forge(tmp_path).projects["demo"].release, "3.11")
    assert [b.key for b in builds] == left


@pytest.mark.parametrize("archs,problem", [
    ('["relase"]', "neither a CUDA arch nor one of the project's arch sets (release, hopper) (did you mean 'release'?)"),
    ('["release", "release"]', "archs[1] lists release twice"),
    ('["sm_90a", "sm90"]', "archs[1] lists sm_90a twice"),
])
def test_bad_arch_entries_name_the_sets(tmp_path, archs, problem):
    write_forge_toml(tmp_path, SET_PROJECT.replace('archs = ["release", "sm_90a"]', f"archs = {archs}"))
    with pytest.raises(ConfigError) as err:
        load_forge(tmp_path)
    assert problem in err.value.what


def test_a_set_name_without_arch_sets_says_how_to_declare_one(tmp_path):
    write_forge_toml(tmp_path, TORCH_PROJECT.replace('archs = ["sm_90a", "sm_120a"]', 'archs = ["release"]'))
    with pytest.raises(ConfigError) as err:
        load_forge(tmp_path)
    assert "neither a CUDA arch nor an arch set: projects.demo declares no arch_sets" in err.value.what
    assert 'arch_sets = { release = ["sm_80", "sm_90"] }' in err.value.what

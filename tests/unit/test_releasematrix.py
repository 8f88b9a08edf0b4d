"""The release matrix: forge.toml's [projects.X.release] read, checked and expanded."""

from __future__ import annotations

import pytest
from kforge_testkit import write_forge_toml

from kforge.config import load_forge
from kforge.errors import ConfigError
from kforge.releasematrix import expand

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
    assert [(b.arch.sm, b.variant.id) for b in builds] == [
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

"""kforge.wheels.platformtag: versioned symbols a binary needs, against auditwheel's manylinux policy."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kforge.errors import ConfigError
from kforge.wheels import platformtag

SOURCE = """
#include <sys/random.h>
int f(void) { char b[4]; return (int)getrandom(b, 4, 0); }  /* GLIBC_2.25 */
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("needs gcc to build a real shared library")
    d = tmp_path_factory.mktemp("lib")
    (d / "t.c").write_text(SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "t.so"), str(d / "t.c")], check=True)
    return d / "t.so"


def test_needs_are_read_from_the_binary(lib):
    needs = platformtag.version_needs(lib)
    assert ("libc.so.6", "GLIBC_2.25") in needs


def test_a_tag_older_than_the_needs_names_the_symbol_versions(lib):
    found = platformtag.too_new(lib, "pkg/t.so", "manylinux_2_17")
    assert [t.version for t in found] == ["GLIBC_2.25"]
    assert str(found[0]) == "pkg/t.so needs GLIBC_2.25 from libc.so.6 (the tag allows up to GLIBC_2.17)"
    assert platformtag.too_new(lib, "pkg/t.so", "manylinux_2_28") == []


def test_not_an_elf_file_needs_nothing(tmp_path):
    p = tmp_path / "x.so"
    p.write_bytes(b"not elf")
    assert platformtag.version_needs(p) == []


@pytest.mark.parametrize("text,tag", [("manylinux_2_28", "manylinux_2_28"), ("manylinux_2_31_x86_64", "manylinux_2_31")])
def test_tags_parse(text, tag):
    assert platformtag.parse_tag(text) == tag


@pytest.mark.parametrize("text", ["manylinux2014", "linux_x86_64", "manylinux_9_99", "musllinux_1_2"])
def test_unknown_tags_are_config_errors_listing_the_known_ones(text):
    with pytest.raises(ConfigError) as err:
        platformtag.parse_tag(text)
    assert "manylinux_2_28" in str(err.value)


def test_plat_splits_into_tag_and_machine():
    assert platformtag.split_plat("manylinux_2_28_x86_64") == ("manylinux_2_28", "x86_64")
    assert platformtag.wheel_tag("manylinux_2_28", "aarch64") == "manylinux_2_28_aarch64"

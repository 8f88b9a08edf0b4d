"""kforge.platformfloor: what a build enforces and how a release reaches a project's platform floor on this host."""

from __future__ import annotations

import pytest

from kforge.errors import ConfigError
from kforge.platformfloor import image_for_floor, parse_glibc, plan_floor, release_route

BOOKWORM = (2, 36)


def test_glibc_and_the_image_for_a_floor():
    assert parse_glibc("2.36") == (2, 36) and parse_glibc("glibc 2.31") == (2, 31) and parse_glibc(None) is None
    assert image_for_floor("manylinux_2_31") == "kforge:bullseye"
    assert image_for_floor("manylinux_2_34") == "kforge:bullseye"  # the newest image at or below the floor
    assert image_for_floor("manylinux_2_36") == "kforge:bookworm"
    assert image_for_floor("manylinux_2_28") is None  # older than every kforge image


def test_a_build_enforces_the_floor_where_it_can_reach_it():
    assert plan_floor("manylinux_2_31", None, None, (2, 31), "p").enforce == "manylinux_2_31"  # an old enough host
    assert plan_floor("manylinux_2_31", None, "kforge:bullseye", BOOKWORM, "p").enforce == "manylinux_2_31"
    assert plan_floor(None, None, "kforge:bullseye", BOOKWORM, "p").enforce == "manylinux_2_31"  # the image's promise
    assert plan_floor(None, "manylinux_2_17", None, BOOKWORM, "p").enforce == "manylinux_2_17"  # explicit: always
    assert plan_floor(None, None, None, BOOKWORM, "p").enforce is None


def test_a_native_build_on_a_newer_host_is_a_development_build_and_says_so():
    d = plan_floor("manylinux_2_31", None, None, BOOKWORM, "flashmla")
    assert d.enforce is None
    assert "2.36" in d.note and "manylinux_2_31" in d.note and "--image kforge:bullseye" in d.note


def _route(floor="manylinux_2_31", host=BOOKWORM, backend="native", chosen=False, image=None, tools=True, os="linux"):
    return release_route("flashmla", floor, platform_os=os, host_glibc=host, backend=backend, backend_chosen=chosen,
                         image=image, image_tools=tools)


def test_a_release_on_a_newer_host_builds_in_the_image():
    r = _route()
    assert (r.backend, r.image) == ("cibuildwheel", "kforge:bullseye") and "2.36" in r.note


def test_a_release_on_an_old_enough_host_or_without_a_floor_builds_as_planned():
    assert _route(host=(2, 31)).backend is None
    assert _route(floor=None).backend is None
    assert _route(os="windows").backend is None
    assert _route(backend="cibuildwheel", image="kforge:bullseye").backend is None  # already in the image


@pytest.mark.parametrize("kw,words", [
    ({"chosen": True}, ["--backend native", "rop --backend native (kforge then builds in kforge:bullseye)", "kforge:bullseye"]),
    ({"floor": "manylinux_2_28"}, ["manylinux_2_28", "--image manylinux_2_28", "glibc is 2.28 or older"]),
    ({"tools": False}, ["podman or debootstrap is missing", "apt-get install podman runc debootstrap"]),
    ({"backend": "cibuildwheel", "image": "kforge:bookworm"}, ["manylinux_2_36 wheels", "--image kforge:bullseye"]),
])
def test_a_release_that_cannot_reach_its_floor_is_refused_naming_the_fix(kw, words):
    with pytest.raises(ConfigError) as err:
        _route(**kw)
    text = str(err.value)
    assert "\n" not in text.strip() and all(w in text for w in words), text

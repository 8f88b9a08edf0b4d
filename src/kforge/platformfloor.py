"""A project's platform floor (forge.toml ``platform_tag``) against this host: who can reach it, and how.

A Linux wheel carries the glibc of the machine that linked it. A project's ``platform_tag`` is the floor its
release wheels must reach (``manylinux_2_31``: they install on glibc 2.31 and newer). A host whose glibc is
at or below the floor reaches it with any backend; a newer host reaches it only inside an older build image.

* :func:`plan_floor` is what ``kforge build`` enforces: an explicit ``--platform-tag`` always; the project's
  floor when the build can reach it (an image build, or a host at or below it). A native build on a newer
  host is a development build: it gets the best tag its binaries allow, and the plan says why.
* :func:`release_route` is what ``kforge release`` does: on a newer host it builds through kforge's image
  whose glibc is the floor's or older (``kforge:bullseye`` for ``manylinux_2_31``), and refuses, in one
  paragraph naming the fix, where that cannot be done (no such image, no podman/debootstrap, or a backend or
  image chosen on the command line that cannot reach the floor).

Pure functions: the host's glibc and the tools present are passed in (kforge.build.host detects them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.build.image import OFFICIAL_IMAGE, SUITES, image_platform_tag, is_kforge_image
from kforge.errors import ConfigError
from kforge.wheels.platformtag import parse_tag


def glibc_of_tag(tag: str) -> tuple[int, int]:
    """``manylinux_2_31`` -> (2, 31)."""
    parts = parse_tag(tag).split("_")
    return int(parts[1]), int(parts[2])


def parse_glibc(text: str | None) -> tuple[int, int] | None:
    """``"2.36"`` or ``"glibc 2.36"`` -> (2, 36); None when unknown (not glibc: musl, Windows)."""
    if not text:
        return None
    version = text.split()[-1]
    major, _, minor = version.partition(".")
    if not (major.isdigit() and minor.split(".")[0].isdigit()):
        return None
    return int(major), int(minor.split(".")[0])


def _tag(glibc: tuple[int, int]) -> str:
    return f"manylinux_{glibc[0]}_{glibc[1]}"


def image_for_floor(floor: str) -> str | None:
    """The newest kforge image whose wheels reach ``floor`` (``kforge:bullseye`` for manylinux_2_31 and up)."""
    want = glibc_of_tag(floor)
    fits = [(parse_glibc(g), s) for s, g in SUITES.items() if parse_glibc(g) and parse_glibc(g) <= want]
    return f"kforge:{max(fits)[1]}" if fits else None


def image_tag(image: str | None) -> str | None:
    """The manylinux tag an image's wheels reach: a kforge image's glibc, the official manylinux_X_Y's own; None: unknown."""
    if not image:
        return None
    if is_kforge_image(image):
        return image_platform_tag(image)
    if image.startswith("manylinux_"):
        return parse_tag(image)
    return None


@dataclass(frozen=True)
class FloorDecision:
    """What a build enforces (``enforce``; None: the best tag the binaries allow) and why, in words."""

    enforce: str | None
    note: str


def plan_floor(floor: str | None, explicit: str | None, image: str | None, host_glibc: tuple[int, int] | None,
               project: str) -> FloorDecision:
    """The tag ``kforge build`` makes its repair reach (see the module docstring)."""
    if explicit:
        return FloorDecision(parse_tag(explicit), "--platform-tag")
    if image:
        tag = floor or image_tag(image)
        return FloorDecision(parse_tag(tag) if tag else None, f"image {image}" if not floor else f"{project}'s platform_tag")
    if floor is None:
        return FloorDecision(None, "no platform_tag")
    if host_glibc is None or host_glibc <= glibc_of_tag(floor):
        return FloorDecision(parse_tag(floor), f"{project}'s platform_tag")
    fix = image_for_floor(floor)
    return FloorDecision(None, (
        f"this host's glibc {host_glibc[0]}.{host_glibc[1]} is above {project}'s release floor {parse_tag(floor)}: "
        "this development build gets the host's tag; `kforge release` builds in "
        + (f"{fix} (here: --backend cibuildwheel --image {fix})" if fix else "an older image")))


@dataclass(frozen=True)
class Route:
    """How a release reaches its floor: the backend and image its builds use (None: as planned)."""

    backend: str | None
    image: str | None
    note: str


def release_route(project: str, floor: str | None, *, platform_os: str, host_glibc: tuple[int, int] | None,
                  backend: str, backend_chosen: bool, image: str | None, image_tools: bool) -> Route:
    """The backend and image a release of ``project`` builds with on this host, or a ConfigError saying why none.

    ``backend`` is the planned one (``backend_chosen``: given on the command line or in KFORGE_BACKEND);
    ``image`` the ``--image`` given, if any; ``image_tools``: podman and debootstrap are installed.
    """
    if platform_os != "linux" or floor is None:
        return Route(None, None, "no platform floor" if platform_os == "linux" else f"{platform_os}: no manylinux floor")
    floor = parse_tag(floor)
    want = glibc_of_tag(floor)
    if backend == "cibuildwheel":
        img = image or OFFICIAL_IMAGE
        tag = image_tag(img)
        if tag is not None and glibc_of_tag(tag) > want:
            raise ConfigError(
                f"the release of {project} must reach its platform floor {floor}, and the image {img} makes "
                f"{tag} wheels", fix=_fix(floor, "use --image " + (image_for_floor(floor) or "an image with an older glibc")))
        return Route(None, None, f"cibuildwheel in {img}" + (f" ({tag} <= floor {floor})" if tag else
                                                               " (the repair checks the floor)"))
    if host_glibc is None:
        return Route(None, None, f"this host's glibc is unknown: the repair checks the floor {floor}")
    if host_glibc <= want:
        return Route(None, None, f"this host's glibc {host_glibc[0]}.{host_glibc[1]} reaches the floor {floor}")
    host = f"{host_glibc[0]}.{host_glibc[1]}"
    target_image = image_for_floor(floor)
    why = (f"this host's glibc ({host}) is newer than {project}'s platform floor {floor}, so a {backend} build here "
           f"makes wheels that need glibc {host}")
    if backend_chosen:
        raise ConfigError(f"the release of {project} cannot reach its platform floor {floor} with --backend {backend}",
                          why=why, fix=_fix(floor, f"drop --backend {backend} (kforge then builds in "
                                                   f"{target_image or 'an older image'})"))
    if target_image is None:
        raise ConfigError(f"the release of {project} cannot reach its platform floor {floor} on this host",
                          why=why + f"; kforge's own images start at {_tag(min(parse_glibc(g) for g in SUITES.values()))}",
                          fix=_fix(floor, f"pass --backend cibuildwheel --image {OFFICIAL_IMAGE} where a registry is reachable"))
    if not image_tools:
        raise ConfigError(f"the release of {project} must build in {target_image} to reach its platform floor {floor}, "
                          "and podman or debootstrap is missing", why=why,
                          fix="apt-get install podman runc debootstrap, or cut the release on a host whose glibc is "
                              f"{want[0]}.{want[1]} or older")
    return Route("cibuildwheel", target_image,
                 f"cibuildwheel in {target_image}: this host's glibc {host} is newer than the floor {floor}")


def _fix(floor: str, first: str) -> str:
    return (f"{first}, cut the release on a host whose glibc is {'.'.join(map(str, glibc_of_tag(floor)))} or older, "
            "or lower the project's platform_tag in forge.toml on purpose")

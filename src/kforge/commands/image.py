"""``kforge image``: make (or reuse) kforge's own manylinux-style build image with debootstrap + podman."""

from __future__ import annotations

import argparse
import os

from kforge.build import image
from kforge.commands._common import cache_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("image", help="make kforge's build image for the cibuildwheel backend (Debian + podman, no registry)")
    isub = p.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    b = isub.add_parser("build", help="debootstrap + provision + commit the image, unless one with the same inputs exists")
    b.add_argument("name", nargs="?", default="kforge:bullseye",
                   help="kforge:<suite>, suite one of " + ", ".join(image.SUITES) + " (default kforge:bullseye)")
    b.add_argument("--cuda", default="13.0", help="nvcc from PyPI inside the image (13.0 or newer; default 13.0)")
    b.add_argument("--torch", default=None,
                   help="add a torch layer: this torch from PyPI (its CUDA must be --cuda), for torch-ABI builds")
    b.add_argument("--python", default="3.12",
                   help="the torch layer's CPython, carried in from this host (default 3.12; $KFORGE_IMAGE_PYTHON picks one)")
    b.set_defaults(func=run_build)
    s = isub.add_parser("show", help="the image reference and the tag its wheels reach, without building")
    s.add_argument("name", nargs="?", default="kforge:bullseye")
    s.add_argument("--cuda", default="13.0")
    s.set_defaults(func=run_show)


def run_build(args: argparse.Namespace) -> int:
    ref = image.ensure_image(args.name, args.cuda, cache_dir(), os.environ, torch=args.torch,
                             python=args.python if args.torch else None, log=lambda line: print(line, flush=True))
    print(ref)
    return 0


def run_show(args: argparse.Namespace) -> int:
    spec = image.parse_image_name(args.name, args.cuda, ca_bundle=image.host_ca_bundle(os.environ))
    print(f"{spec.ref}\n  Debian {spec.suite} (glibc {spec.glibc}): wheels reach {spec.platform_tag}\n"
          f"  Python {spec.python} at /opt/python/cp{spec.python.replace('.', '')}-cp{spec.python.replace('.', '')}, "
          f"nvcc {spec.cuda} from PyPI at /usr/local/cuda-{spec.cuda}")
    return 0

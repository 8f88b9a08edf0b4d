"""Local build images: a Debian root made with debootstrap, provisioned for cibuildwheel, run by podman.

Container registries may be unreachable (build farms, this project's machines), so kforge can make
its own manylinux-style build image from Debian packages alone:

1. ``debootstrap --variant=minbase <suite>`` into a cache folder (``bullseye`` = glibc 2.31, so its
   wheels are ``manylinux_2_31``);
2. ``podman import`` of that root as ``localhost/kforge-base:<suite>-<key>``;
3. one provisioning container (host network) that installs the compilers, makes the
   ``/opt/python/cpXY-cpXY`` layout cibuildwheel expects, and installs nvcc from PyPI under
   ``/usr/local/cuda-<X.Y>`` (the path the cibuildwheel backend points ``CUDA_HOME`` at);
4. ``podman commit`` as ``localhost/kforge-build:<suite>-cu<XY>-<key>``;
5. for torch-ABI builds, a layer on top of that image (``...:<suite>-cu<XY>-cp<PY>-torch<V>-<key>``): the
   host's CPython of the plan's Python carried in at ``/opt/python/cpXY-cpXY`` (Debian's suite has only its
   own; :mod:`kforge.build.imagepython`), the plan's torch installed into it from PyPI (a CUDA build whose
   CUDA must be the image's), and the CUDA headers torch's headers include (cuBLAS, cuSPARSE, ...) linked
   from torch's ``nvidia`` packages into the toolkit.

The key is a hash of every input (recipe, suite, mirror, CUDA), so a changed recipe makes a new image
and an unchanged one is reused. Podman is configured through a ``containers.conf`` that kforge
writes into its cache (``CONTAINERS_CONF``): ``cgroupfs`` as cgroup manager, ``runc`` when present,
no default ulimits. These are what hosts without systemd (CI machines, containers) need; no system
file is edited.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from kforge.build import imagepython
from kforge.build.toolchain import provision_requirements
from kforge.errors import ToolchainError
from kforge.fsutil import atomic_write_text, sha256_file

#: Debian suites kforge knows how to provision, with their glibc (the manylinux tag their wheels get).
SUITES: Mapping[str, str] = {"bullseye": "2.31", "bookworm": "2.36"}
#: Debian's python3 per suite: the /opt/python entry the image offers.
SUITE_PYTHON: Mapping[str, str] = {"bullseye": "3.9", "bookworm": "3.11"}
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: cibuildwheel's official image (AlmaLinux 8), pulled from a registry: the default where one is reachable.
OFFICIAL_IMAGE = "manylinux_2_28"
#: Bump when the recipe's meaning changes without its text changing (it rarely does).
RECIPE_VERSION = "1"
DEBIAN_PACKAGES = ("gcc", "g++", "make", "python3", "python3-venv", "python3-pip", "ca-certificates", "patchelf")
CONTAINERS_CONF = """\
# Written by kforge (kforge.build.image): podman settings for hosts without systemd.
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
{runtime}
"""

Runner = Callable[..., subprocess.CompletedProcess]
#: What a torch-ABI build without isolation needs besides torch, installed with it in a torch layer.
TORCH_BUILD_TOOLS = ("setuptools>=64", "wheel", "ninja", "packaging")
#: Debian packages of a torch layer: upstream setup.py files call git (FlashMLA: `git submodule update`).
TORCH_LAYER_PACKAGES = ("git",)


@dataclass(frozen=True)
class CarriedPython:
    """The host's CPython a torch layer carries in (:mod:`kforge.build.imagepython`)."""

    minor: str  # "3.12"
    identity: str  # its version and binaries, hashed: part of the image's key
    host_prefix: str  # where it lives on the host (rewritten in its build configuration)
    loader: str  # the soname of its dynamic loader (ld-linux-x86-64.so.2)
    staged: str = ""  # the staged copy on this host (not part of the key)

    @property
    def tag(self) -> str:
        return "cp" + self.minor.replace(".", "")


@dataclass(frozen=True)
class ImageSpec:
    """What a build image is made of; :attr:`key` names it."""

    suite: str
    cuda: str  # "13.0": nvcc from PyPI (nvidia-cuda-nvcc==13.0.*)
    mirror: str = DEFAULT_MIRROR
    ca_sha256: str | None = None  # the host's CA bundle, carried in for pip (TLS-intercepting proxies)
    torch: str | None = None  # a torch layer: this torch from PyPI, in the carried Python below
    carried: CarriedPython | None = None  # the host's CPython for the torch layer

    @property
    def python(self) -> str:
        return SUITE_PYTHON[self.suite]

    @property
    def pythons(self) -> tuple[str, ...]:
        """Every Python at /opt/python: the suite's, and the carried one of a torch layer."""
        extra = (self.carried.minor,) if self.carried and self.carried.minor != self.python else ()
        return (self.python, *extra)

    @property
    def base(self) -> ImageSpec:
        """The image a torch layer is made from (itself when it is no layer)."""
        return replace(self, torch=None, carried=None)

    @property
    def glibc(self) -> str:
        return SUITES[self.suite]

    @property
    def platform_tag(self) -> str:
        """The manylinux tag a wheel built in this image can reach: ``manylinux_2_31``."""
        return "manylinux_" + self.glibc.replace(".", "_")

    def provision_script(self) -> str:
        mm = self.cuda
        major = mm.split(".")[0]
        tag = "cp" + self.python.replace(".", "")
        reqs = " ".join(f"'{r}'" for r in provision_requirements(mm))
        return "\n".join([
            "set -euxo pipefail",
            "export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore",
            "apt-get update -qq",
            "apt-get install -y -qq --no-install-recommends " + " ".join(DEBIAN_PACKAGES),
            "rm -rf /var/lib/apt/lists/*",
            *([  # pip in the image trusts what the host's pip trusts (a proxy's CA, say)
                "mkdir -p /etc/kforge && cp /run/kforge-host-ca.crt /etc/kforge/ca.crt",
                "printf '[global]\\ncert = /etc/kforge/ca.crt\\n' > /etc/pip.conf",
            ] if self.ca_sha256 else []),
            # cibuildwheel's layout: /opt/python/<tag>-<tag>/bin/{python,pip}
            f"python3 -m venv /opt/python/{tag}-{tag}",
            f"/opt/python/{tag}-{tag}/bin/python -m pip install -q -U pip build",  # cibuildwheel's default frontend
            # nvcc from PyPI, laid out as a toolkit at /usr/local/cuda-X.Y (lib64 -> lib for nvcc.profile)
            f"/opt/python/{tag}-{tag}/bin/python -m pip install -q --only-binary=:all: --target /opt/cuda-{mm} {reqs}",
            f"ln -s lib /opt/cuda-{mm}/nvidia/cu{major}/lib64",
            # CMake's FindCUDAToolkit looks for the unversioned libcudart.so; the wheels ship only .so.N
            f"cd /opt/cuda-{mm}/nvidia/cu{major}/lib && for f in lib*.so.*; do "
            '[ -e "${f%%.so.*}.so" ] || ln -s "$f" "${f%%.so.*}.so"; done && cd /',
            f"ln -s /opt/cuda-{mm}/nvidia/cu{major} /usr/local/cuda-{mm}",
            f"/usr/local/cuda-{mm}/bin/nvcc --version",
            "ldd --version | sed -n 1p",  # sed reads to the end: no SIGPIPE under pipefail
        ]) + "\n"

    def torch_script(self) -> str:
        """The torch layer's provisioning: the carried Python, then torch from PyPI and its CUDA headers."""
        if not (self.torch and self.carried):
            raise ValueError("torch_script() of an image without a torch layer")
        c, mm = self.carried, self.cuda
        py = f"/opt/python/{c.tag}-{c.tag}/bin/python"
        check = ("import torch, sys; v = torch.version.cuda or 'none'; print('torch', torch.__version__, 'CUDA', v); "
                 f"sys.exit(0 if v.split('.')[:2] == '{mm}'.split('.') else 'torch {self.torch} from PyPI is built for "
                 f"CUDA ' + v + ', the image has nvcc {mm}')")
        site = f"$({py} -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
        return "\n".join([
            "set -euxo pipefail",
            "export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore",
            "apt-get update -qq",
            "apt-get install -y -qq --no-install-recommends " + " ".join(TORCH_LAYER_PACKAGES),
            "rm -rf /var/lib/apt/lists/*",
            *imagepython.install_script(c.minor, c.host_prefix, c.loader),
            f"{py} -m pip install -q -U pip build",
            # torch's own index is unreachable where only PyPI is: PyPI's torch is a CUDA build (2.11: CUDA 13.0)
            f"{py} -m pip install -q 'torch=={self.torch}' " + " ".join(f"'{t}'" for t in TORCH_BUILD_TOOLS),
            f'{py} -c "{check}"',
            # ATen's CUDA headers include cuBLAS/cuSPARSE/cuSOLVER/cuRAND/NVTX headers, which the nvcc wheels lack
            f"SITE={site}; for d in \"$SITE\"/nvidia/cu{mm.split('.')[0]}/include/*; do "
            f'n=$(basename "$d"); [ -e /usr/local/cuda-{mm}/include/"$n" ] || ln -s "$d" /usr/local/cuda-{mm}/include/"$n"; done',
        ]) + "\n"

    @property
    def key(self) -> str:
        blob = json.dumps({"recipe": RECIPE_VERSION, "suite": self.suite, "mirror": self.mirror, "cuda": self.cuda,
                           "ca": self.ca_sha256,
                           "packages": DEBIAN_PACKAGES, "script": self.provision_script()}, sort_keys=True)
        if self.torch and self.carried:
            layer = json.dumps({"base": blob, "torch": self.torch, "python": self.carried.identity,
                                "script": self.torch_script()}, sort_keys=True)
            return hashlib.sha256(layer.encode()).hexdigest()[:12]
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def ref(self) -> str:
        head = f"localhost/kforge-build:{self.suite}-cu{self.cuda.replace('.', '')}"
        if self.torch and self.carried:
            return f"{head}-{self.carried.tag}-torch{self.torch}-{self.key}"
        return f"{head}-{self.key}"

    @property
    def base_ref(self) -> str:
        """The bare debootstrapped root: depends on the suite and mirror only, so recipe changes reuse it."""
        blob = json.dumps({"recipe": RECIPE_VERSION, "suite": self.suite, "mirror": self.mirror}, sort_keys=True)
        return f"localhost/kforge-base:{self.suite}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def host_ca_bundle(environ: Mapping[str, str]) -> Path | None:
    """The CA bundle the host's pip uses (PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE), if one is set and exists."""
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if environ.get(var) and Path(environ[var]).is_file():
            return Path(environ[var])
    return None


def parse_image_name(name: str, cuda: str, *, ca_bundle: Path | None = None) -> ImageSpec:
    """``kforge:bullseye`` -> the spec of kforge's own bullseye image for ``cuda``."""
    suite = name.partition(":")[2] or "bullseye"
    if suite not in SUITES:
        raise ToolchainError(f"kforge cannot make a build image of Debian '{suite}'",
                             why="kforge's image recipe is written for " + ", ".join(SUITES),
                             fix="use kforge:bullseye (manylinux_2_31) or kforge:bookworm, or an image of your own")
    major = cuda.split(".")[0]
    if not major.isdigit() or int(major) < 13:
        raise ToolchainError(f"kforge's build images take nvcc from PyPI, which has a full nvcc only from CUDA 13.0; asked for {cuda}",
                             fix="build with --cuda 13.0, or use an image that has your CUDA toolkit installed")
    return ImageSpec(suite=suite, cuda=cuda, ca_sha256=sha256_file(ca_bundle) if ca_bundle else None)


def is_kforge_image(name: str) -> bool:
    """``kforge`` / ``kforge:<suite>``: an image kforge makes itself (anything else is pulled or local)."""
    return name == "kforge" or name.startswith("kforge:")


def image_platform_tag(name: str) -> str | None:
    """The manylinux tag (without machine) a kforge image's wheels reach; None for other images."""
    if not is_kforge_image(name):
        return None
    suite = name.partition(":")[2] or "bullseye"
    if suite not in SUITES:
        parse_image_name(name, "13.0")  # raises the error that names the known suites
    return "manylinux_" + SUITES[suite].replace(".", "_")


def podman_env(cache_dir: Path, environ: Mapping[str, str], *, runtime: str | None = None) -> dict[str, str]:
    """``environ`` plus ``CONTAINERS_CONF`` pointing at kforge's podman settings (unless the user set one)."""
    env = dict(environ)
    if env.get("CONTAINERS_CONF"):
        return env
    conf = Path(cache_dir) / "podman" / "containers.conf"
    if runtime is None:
        runtime = "runc" if shutil.which("runc", path=env.get("PATH")) else ""
    text = CONTAINERS_CONF.format(runtime=f'runtime = "{runtime}"' if runtime else "")
    if not conf.is_file() or conf.read_text() != text:
        atomic_write_text(conf, text)
    env["CONTAINERS_CONF"] = str(conf)
    return env


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:])


def _check(proc: subprocess.CompletedProcess, what: str, fix: str) -> None:
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed with exit code {proc.returncode}",
                             why=_tail((proc.stderr or "") + "\n" + (proc.stdout or "")), fix=fix)


def image_exists(ref: str, env: Mapping[str, str], *, run: Runner = subprocess.run) -> bool:
    return run(["podman", "image", "exists", ref], env=dict(env), capture_output=True, text=True).returncode == 0


def build_image(spec: ImageSpec, cache_dir: Path, environ: Mapping[str, str], *, run: Runner = subprocess.run,
                log: Callable[[str], None] = print, ca_bundle: Path | None = None) -> str:
    """Make ``spec``'s image unless podman already has it (a torch layer: its base first); return its reference."""
    for tool in ("podman", "debootstrap"):
        if not shutil.which(tool, path=environ.get("PATH")):
            raise ToolchainError(f"{tool} is not installed, and kforge's build image needs it",
                                 fix="apt-get install podman runc debootstrap (Debian/Ubuntu), or point --image at an image you have")
    env = podman_env(cache_dir, environ)
    if image_exists(spec.ref, env, run=run):
        log(f"image {spec.ref} exists (inputs unchanged)")
        return spec.ref
    if spec.torch and spec.carried:
        base_ref = build_image(spec.base, cache_dir, environ, run=run, log=log, ca_bundle=ca_bundle)
        c = spec.carried
        log(f"provisioning {spec.ref}: CPython {c.minor} from this host at /opt/python/{c.tag}-{c.tag}, "
            f"torch {spec.torch} from PyPI")
        mounts = ["--volume", f"{c.staged}:/run/kforge-python:ro"]
        _provision(spec, base_ref, spec.torch_script(), mounts, cache_dir, env, run=run, ca_bundle=ca_bundle,
                   what=f"the torch {spec.torch} layer of the {spec.suite} image")
        log(f"image {spec.ref} ready")
        return spec.ref
    root = Path(cache_dir) / "images" / spec.base_ref.rpartition(":")[2]
    rootfs = root / "rootfs"
    if not image_exists(spec.base_ref, env, run=run):
        if rootfs.exists():
            shutil.rmtree(rootfs)  # a half-made root from an interrupted run
        root.mkdir(parents=True, exist_ok=True)
        log(f"debootstrap {spec.suite} from {spec.mirror}")
        _check(run(["debootstrap", "--variant=minbase", spec.suite, str(rootfs), spec.mirror], env=env,
                   capture_output=True, text=True),
               f"debootstrap of Debian {spec.suite}", f"check that {spec.mirror} is reachable, or set another mirror")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = run(["podman", "import", "-", spec.base_ref], stdin=tar.stdout, env=env, capture_output=True, text=True)
        tar.wait()
        _check(imported, f"podman import of the {spec.suite} root", "run `podman info` to see what podman needs here")
        shutil.rmtree(rootfs, ignore_errors=True)
    log(f"provisioning {spec.ref}: compilers, /opt/python/cp{spec.python.replace('.', '')}, nvcc {spec.cuda} from PyPI")
    _provision(spec, spec.base_ref, spec.provision_script(), [], cache_dir, env, run=run, ca_bundle=ca_bundle,
               what=f"provisioning the {spec.suite} image")
    log(f"image {spec.ref} ready")
    return spec.ref


def _provision(spec: ImageSpec, from_ref: str, script: str, mounts: list[str], cache_dir: Path,
               env: Mapping[str, str], *, run: Runner, ca_bundle: Path | None, what: str) -> None:
    """Run ``script`` in a container of ``from_ref`` (host network, pip's cache mounted), commit it as ``spec.ref``."""
    name = f"kforge-provision-{spec.key}"
    run(["podman", "rm", "-f", name], env=dict(env), capture_output=True, text=True)
    try:
        pip_cache = Path(cache_dir) / "pip"  # downloads (nvcc ~100 MB, torch's several GB) survive a rebuild
        pip_cache.mkdir(parents=True, exist_ok=True)
        mounts = [*mounts, "--volume", f"{pip_cache}:/root/.cache/pip"]
        if spec.ca_sha256 and ca_bundle:
            mounts += ["--volume", f"{ca_bundle}:/run/kforge-host-ca.crt:ro"]
        _check(run(["podman", "run", "--network=host", *mounts, f"--name={name}", from_ref, "bash", "-c", script],
                   env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
               what, "read the output above; the image needs Debian's and PyPI's package servers")
        labels = {"kforge.suite": spec.suite, "kforge.cuda": spec.cuda, "kforge.python": " ".join(spec.pythons),
                  "kforge.platform_tag": spec.platform_tag, "kforge.key": spec.key}
        if spec.torch:
            labels["kforge.torch"] = spec.torch
        changes: list[str] = []
        for k, v in labels.items():
            changes += ["--change", f"LABEL {k}={v}"]
        _check(run(["podman", "commit", *changes, name, spec.ref], env=dict(env), capture_output=True, text=True),
               "podman commit of the provisioned image", "run `podman info` to see what podman needs here")
    finally:
        run(["podman", "rm", "-f", name], env=dict(env), capture_output=True, text=True)


def image_pythons(ref: str, env: Mapping[str, str], *, run: Runner = subprocess.run) -> tuple[str, ...]:
    """The Pythons a kforge image offers (its ``kforge.python`` label); () for other images."""
    proc = run(["podman", "image", "inspect", ref, "--format", "{{index .Labels \"kforge.python\"}}"],
               env=dict(env), capture_output=True, text=True)
    value = (proc.stdout or "").strip() if proc.returncode == 0 else ""
    return tuple(value.split()) if value and value != "<no value>" else ()


def carry_python(minor: str, cache_dir: Path, environ: Mapping[str, str], *, run: Runner = subprocess.run) -> CarriedPython:
    """Find this host's CPython ``minor`` and stage it for a torch layer (:mod:`kforge.build.imagepython`)."""
    py = imagepython.find_host_python(minor, environ, run=run)
    staged = imagepython.stage_host_python(py, cache_dir, environ, run=run)
    info = json.loads((staged / "python.json").read_text())
    return CarriedPython(minor=py.minor, identity=staged.name.rpartition("-")[2], host_prefix=info["host_prefix"],
                         loader=info["loader"], staged=str(staged))


def ensure_image(name: str, cuda: str, cache_dir: Path, environ: Mapping[str, str], *, torch: str | None = None,
                 python: str | None = None, run: Runner = subprocess.run, **kw) -> str:
    """Make (or reuse) the kforge image ``name`` for ``cuda``, carrying the host's CA bundle in for pip.

    With ``torch`` (and the ``python`` it is for), the image gets a torch layer: that CPython from this
    host and that torch from PyPI, for torch-ABI builds.
    """
    ca = host_ca_bundle(environ)
    spec = parse_image_name(name, cuda, ca_bundle=ca)
    if torch:
        if not python:
            raise ValueError("a torch layer needs the Python it is for")
        spec = replace(spec, torch=torch, carried=carry_python(python, cache_dir, environ, run=run))
    return build_image(spec, cache_dir, environ, ca_bundle=ca, run=run, **kw)

"""Local build images: a Debian root made with debootstrap, provisioned for cibuildwheel, run by podman.

Container registries may be unreachable (build farms, this project's machines), so kforge can make
its own manylinux-style build image from Debian packages alone:

1. ``debootstrap --variant=minbase <suite>`` into a cache folder (``bullseye`` = glibc 2.31, so its
   wheels are ``manylinux_2_31``);
2. ``podman import`` of that root as ``localhost/kforge-base:<suite>-<key>``;
3. one provisioning container (host network) that installs the compilers, makes the
   ``/opt/python/cpXY-cpXY`` layout cibuildwheel expects, and installs nvcc from PyPI under
   ``/usr/local/cuda-<X.Y>`` (the path the cibuildwheel backend points ``CUDA_HOME`` at);
4. ``podman commit`` as ``localhost/kforge-build:<suite>-cu<XY>-<key>``.

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
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class ImageSpec:
    """What a build image is made of; :attr:`key` names it."""

    suite: str
    cuda: str  # "13.0": nvcc from PyPI (nvidia-cuda-nvcc==13.0.*)
    mirror: str = DEFAULT_MIRROR
    ca_sha256: str | None = None  # the host's CA bundle, carried in for pip (TLS-intercepting proxies)

    @property
    def python(self) -> str:
        return SUITE_PYTHON[self.suite]

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

    @property
    def key(self) -> str:
        blob = json.dumps({"recipe": RECIPE_VERSION, "suite": self.suite, "mirror": self.mirror, "cuda": self.cuda,
                           "ca": self.ca_sha256,
                           "packages": DEBIAN_PACKAGES, "script": self.provision_script()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def ref(self) -> str:
        return f"localhost/kforge-build:{self.suite}-cu{self.cuda.replace('.', '')}-{self.key}"

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
    """Make ``spec``'s image unless podman already has it; return its reference."""
    for tool in ("podman", "debootstrap"):
        if not shutil.which(tool, path=environ.get("PATH")):
            raise ToolchainError(f"{tool} is not installed, and kforge's build image needs it",
                                 fix="apt-get install podman runc debootstrap (Debian/Ubuntu), or point --image at an image you have")
    env = podman_env(cache_dir, environ)
    if image_exists(spec.ref, env, run=run):
        log(f"image {spec.ref} exists (inputs unchanged)")
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
    name = f"kforge-provision-{spec.key}"
    run(["podman", "rm", "-f", name], env=env, capture_output=True, text=True)
    log(f"provisioning {spec.ref}: compilers, /opt/python/cp{spec.python.replace('.', '')}, nvcc {spec.cuda} from PyPI")
    try:
        pip_cache = Path(cache_dir) / "pip"  # downloads (nvcc is ~100 MB) survive a rebuild of the image
        pip_cache.mkdir(parents=True, exist_ok=True)
        mounts = ["--volume", f"{pip_cache}:/root/.cache/pip"]
        if spec.ca_sha256 and ca_bundle:
            mounts += ["--volume", f"{ca_bundle}:/run/kforge-host-ca.crt:ro"]
        _check(run(["podman", "run", "--network=host", *mounts, f"--name={name}", spec.base_ref, "bash", "-c",
                    spec.provision_script()], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
               f"provisioning the {spec.suite} image", "read the output above; the image needs Debian's and PyPI's package servers")
        labels = {"kforge.suite": spec.suite, "kforge.cuda": spec.cuda, "kforge.python": spec.python,
                  "kforge.platform_tag": spec.platform_tag, "kforge.key": spec.key}
        changes: list[str] = []
        for k, v in labels.items():
            changes += ["--change", f"LABEL {k}={v}"]
        _check(run(["podman", "commit", *changes, name, spec.ref], env=env, capture_output=True, text=True),
               "podman commit of the provisioned image", "run `podman info` to see what podman needs here")
    finally:
        run(["podman", "rm", "-f", name], env=env, capture_output=True, text=True)
    log(f"image {spec.ref} ready")
    return spec.ref


def image_pythons(ref: str, env: Mapping[str, str], *, run: Runner = subprocess.run) -> tuple[str, ...]:
    """The Pythons a kforge image offers (its ``kforge.python`` label); () for other images."""
    proc = run(["podman", "image", "inspect", ref, "--format", "{{index .Labels \"kforge.python\"}}"],
               env=dict(env), capture_output=True, text=True)
    value = (proc.stdout or "").strip() if proc.returncode == 0 else ""
    return (value,) if value and value != "<no value>" else ()


def ensure_image(name: str, cuda: str, cache_dir: Path, environ: Mapping[str, str], **kw) -> str:
    """Make (or reuse) the kforge image ``name`` for ``cuda``, carrying the host's CA bundle in for pip."""
    ca = host_ca_bundle(environ)
    return build_image(parse_image_name(name, cuda, ca_bundle=ca), cache_dir, environ, ca_bundle=ca, **kw)

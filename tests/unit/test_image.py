"""kforge.build.image: the image spec (inputs -> key), the provisioning recipe, podman settings, reuse of a made image."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kforge.build import image
from kforge.errors import ToolchainError


def test_bullseye_spec_reaches_manylinux_2_31_and_offers_cpython_3_9():
    spec = image.parse_image_name("kforge:bullseye", "13.0")
    assert spec.platform_tag == "manylinux_2_31" and spec.python == "3.9"
    assert spec.ref.startswith("localhost/kforge-build:bullseye-cu130-")
    script = spec.provision_script()
    assert "python3 -m venv /opt/python/cp39-cp39" in script  # cibuildwheel's layout
    assert "'nvidia-cuda-nvcc==13.0.*'" in script and "ln -s /opt/cuda-13.0/nvidia/cu13 /usr/local/cuda-13.0" in script
    assert "/etc/pip.conf" not in script  # no CA bundle given: none carried in


def test_the_key_follows_every_input():
    a = image.parse_image_name("kforge:bullseye", "13.0")
    assert a.key == image.parse_image_name("kforge", "13.0").key  # bullseye is the default suite
    assert a.key != image.parse_image_name("kforge:bookworm", "13.0").key
    assert a.key != image.parse_image_name("kforge:bullseye", "13.1").key
    assert a.key != image.ImageSpec("bullseye", "13.0", mirror="http://mirror.example/debian").key
    assert a.key != image.ImageSpec("bullseye", "13.0", ca_sha256="ab" * 32).key
    # The bare root depends on suite and mirror only: a recipe change reuses the debootstrap.
    assert a.base_ref == image.ImageSpec("bullseye", "13.1", ca_sha256="cd" * 32).base_ref


def test_a_host_ca_bundle_is_carried_into_the_image(tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert image.host_ca_bundle({"PIP_CERT": str(ca)}) == ca
    assert image.host_ca_bundle({"PIP_CERT": str(tmp_path / "missing"), "SSL_CERT_FILE": str(ca)}) == ca
    assert image.host_ca_bundle({}) is None
    spec = image.parse_image_name("kforge:bullseye", "13.0", ca_bundle=ca)
    assert "cert = /etc/kforge/ca.crt" in spec.provision_script()


@pytest.mark.parametrize("name,cuda,words", [
    ("kforge:jessie", "13.0", ["jessie", "bullseye"]),
    ("kforge:bullseye", "12.8", ["13.0", "12.8"]),
])
def test_images_kforge_cannot_make_are_clear_errors(name, cuda, words):
    with pytest.raises(ToolchainError) as err:
        image.parse_image_name(name, cuda)
    assert all(w in str(err.value) for w in words)


def test_platform_tag_of_images():
    assert image.image_platform_tag("kforge:bullseye") == "manylinux_2_31"
    assert image.image_platform_tag("kforge:bookworm") == "manylinux_2_36"
    assert image.image_platform_tag("manylinux_2_28") is None  # not ours: no promise
    assert image.image_platform_tag("quay.io/me/my-image:1") is None


def test_podman_settings_are_written_once_and_a_users_own_win(tmp_path):
    env = image.podman_env(tmp_path, {"PATH": "/usr/bin"}, runtime="runc")
    conf = Path(env["CONTAINERS_CONF"])
    text = conf.read_text()
    assert 'cgroup_manager = "cgroupfs"' in text and "default_ulimits = []" in text and 'runtime = "runc"' in text
    assert image.podman_env(tmp_path, {"CONTAINERS_CONF": "/mine.conf"})["CONTAINERS_CONF"] == "/mine.conf"


class FakePodman:
    """Records the commands; ``exists`` says which image references podman already has."""

    def __init__(self, exists=()):
        self.exists = set(exists)
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        code = 0
        if argv[:3] == ["podman", "image", "exists"]:
            code = 0 if argv[3] in self.exists else 1
        return subprocess.CompletedProcess(argv, code, stdout="", stderr="")


def test_an_image_with_the_same_inputs_is_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(image.shutil, "which", lambda tool, path=None: f"/usr/bin/{tool}")
    spec = image.parse_image_name("kforge:bullseye", "13.0")
    fake = FakePodman(exists={spec.ref})
    assert image.build_image(spec, tmp_path, {"PATH": "/usr/bin"}, run=fake, log=lambda _: None) == spec.ref
    assert [c[:2] for c in fake.calls] == [["podman", "image"]]  # looked, made nothing


def test_a_missing_image_is_provisioned_from_the_existing_base_and_committed_with_labels(tmp_path, monkeypatch):
    monkeypatch.setattr(image.shutil, "which", lambda tool, path=None: f"/usr/bin/{tool}")
    spec = image.parse_image_name("kforge:bullseye", "13.0")
    fake = FakePodman(exists={spec.base_ref})
    image.build_image(spec, tmp_path, {"PATH": "/usr/bin"}, run=fake, log=lambda _: None)
    verbs = [c[1] for c in fake.calls if c[0] == "podman"]
    assert "import" not in verbs and "run" in verbs and "commit" in verbs  # the base was reused
    commit = next(c for c in fake.calls if c[1] == "commit")
    assert "LABEL kforge.python=3.9" in commit and commit[-1] == spec.ref
    assert fake.calls[-1][:3] == ["podman", "rm", "-f"]  # the provisioning container never stays behind


def test_missing_tools_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(image.shutil, "which", lambda tool, path=None: None)
    with pytest.raises(ToolchainError) as err:
        image.build_image(image.parse_image_name("kforge", "13.0"), tmp_path, {}, run=FakePodman(), log=lambda _: None)
    assert "podman" in str(err.value) and "apt-get install podman" in str(err.value)


def _torch_spec(torch="2.11.0"):
    carried = image.CarriedPython(minor="3.12", identity="abc123def456", host_prefix="/root/.pyenv/versions/3.12.1",
                                  loader="ld-linux-x86-64.so.2", staged="/cache/images/python/cp312-abc123def456")
    from dataclasses import replace
    return replace(image.parse_image_name("kforge:bullseye", "13.0"), torch=torch, carried=carried)


def test_a_torch_layer_is_its_own_image_on_top_of_the_cuda_image():
    spec = _torch_spec()
    base = image.parse_image_name("kforge:bullseye", "13.0")
    assert spec.base == base and spec.base.ref == base.ref  # the CUDA image is reused as it is
    assert spec.ref.startswith("localhost/kforge-build:bullseye-cu130-cp312-torch2.11.0-") and spec.ref != base.ref
    assert spec.pythons == ("3.9", "3.12") and base.pythons == ("3.9",)
    assert spec.platform_tag == "manylinux_2_31"  # the layer changes nothing about the tag
    # every input of the layer moves the key: torch, the carried interpreter
    assert _torch_spec("2.9.1").key != spec.key
    from dataclasses import replace
    assert replace(spec, carried=replace(spec.carried, identity="0" * 12)).key != spec.key


def test_the_torch_layer_installs_pypis_torch_into_the_carried_python_and_checks_its_cuda():
    script = _torch_spec().torch_script()
    assert "cp -a /run/kforge-python/prefix/. /opt/python/cp312-cp312/" in script
    assert "patchelf --set-interpreter /opt/python/cp312-cp312/lib/kforge-runtime/ld-linux-x86-64.so.2" in script
    assert "/opt/python/cp312-cp312/bin/python -m pip install -q 'torch==2.11.0'" in script
    assert "--index-url" not in script  # PyPI: torch's own index is not reachable everywhere
    assert "'13.0'.split('.')" in script  # torch's CUDA must be the image's nvcc
    assert "/nvidia/cu13/include/*" in script and "/usr/local/cuda-13.0/include/" in script  # cuBLAS & co headers
    with pytest.raises(ValueError):
        image.parse_image_name("kforge:bullseye", "13.0").torch_script()


def test_a_torch_layer_is_made_from_the_cuda_image_with_the_staged_python_mounted(tmp_path, monkeypatch):
    monkeypatch.setattr(image.shutil, "which", lambda tool, path=None: f"/usr/bin/{tool}")
    spec = _torch_spec()
    fake = FakePodman(exists={spec.base.ref})
    assert image.build_image(spec, tmp_path, {"PATH": "/usr/bin"}, run=fake, log=lambda _: None) == spec.ref
    run = next(c for c in fake.calls if c[1] == "run")
    assert spec.base.ref in run and "/cache/images/python/cp312-abc123def456:/run/kforge-python:ro" in run
    commit = next(c for c in fake.calls if c[1] == "commit")
    assert "LABEL kforge.python=3.9 3.12" in commit and "LABEL kforge.torch=2.11.0" in commit


def test_image_pythons_reads_every_python_of_the_label():
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, "3.9 3.12\n", "")
    assert image.image_pythons("ref", {}, run=run) == ("3.9", "3.12")

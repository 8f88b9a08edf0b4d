"""Per-CUDA indexes with real pip over file:// (--index-url <wheelhouse>/cu130/simple picks the CUDA 13.0 wheel), and
the static PEP 691 JSON pages read by real pip when served with their content type."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from kforge_testkit import fake_wheel

from kforge.wheels import simpleindex, wheelhouse
from kforge.wheels.wheelhouse import Manifest

pytestmark = pytest.mark.integration


def _pip_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HOME=str(tmp))
    return env


def test_pip_takes_the_wheel_of_the_index_it_is_given(tmp_path):
    root = tmp_path / "wheelhouse"
    for label, variant in (("cu128torch2.9", "cu128-torch2.9-cp312"), ("cu130torch2.11", "cu130-torch2.11-cp312")):
        wheel = fake_wheel(tmp_path / label, "kforge_idx_probe", f"1.0+{label}", {"kforge_idx_probe/__init__.py": ""})
        wheelhouse.publish(root, "probe", wheel, Manifest(target="probe-sm90", variant=variant))
    assert (root / "cu130" / "simple" / "kforge-idx-probe" / "index.v1_json").is_file()
    got = {}
    for tag in ("cu128", "cu130"):
        out = tmp_path / f"dl-{tag}"
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(out),
                               "--index-url", (root / tag / "simple").as_uri(), "kforge-idx-probe"],
                              env=_pip_env(tmp_path), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        got[tag] = sorted(p.name for p in out.iterdir())
    assert got == {"cu128": ["kforge_idx_probe-1.0+cu128torch2.9-py3-none-any.whl"],
                   "cu130": ["kforge_idx_probe-1.0+cu130torch2.11-py3-none-any.whl"]}
    # the all-wheels index offers both (pip picks the higher local label)
    html = (root / "simple" / "kforge-idx-probe" / "index.html").read_text()
    assert "cu128torch2.9" in html and "cu130torch2.11" in html


class _JsonOnly(http.server.SimpleHTTPRequestHandler):
    """Serves the static index.v1_json of a folder with the PEP 691 content type, never the HTML: what a web
    server configured for kforge's static JSON pages does. Wheels are served as files."""

    def do_GET(self) -> None:  # noqa: N802
        path = Path(self.translate_path(self.path))
        if path.is_dir():
            page = path / simpleindex.JSON_PAGE
            if "application/vnd.pypi.simple.v1+json" not in self.headers.get("Accept", "") or not page.is_file():
                self.send_error(406)
                return
            body = page.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", simpleindex.JSON_CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


def test_pip_reads_the_static_json_pages_served_with_their_content_type(tmp_path):
    root = tmp_path / "wheelhouse"
    wheel = fake_wheel(tmp_path / "w", "kforge_json_probe", "2.0+cu130torch2.11", {"kforge_json_probe/__init__.py": ""})
    wheelhouse.publish(root, "probe", wheel, Manifest(target="probe-sm90", variant="cu130-torch2.11-cp312"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_JsonOnly, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/cu130/simple/"
        out = tmp_path / "dl"
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(out), "--index-url", url,
                               "kforge-json-probe"], env=_pip_env(tmp_path), capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [p.name for p in out.iterdir()] == [wheel.name]

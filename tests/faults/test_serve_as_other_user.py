"""A wheelhouse published under umask 077, served by `python -m http.server` running as another user
(`nobody`), installs with pip: published files are 0644 and folders 0755 whatever the umask."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kforge_wheelfixtures import make_wheel, manifest

from kforge.wheels import wheelhouse


def _as_nobody() -> list[str]:
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    if shutil.which("setpriv"):
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    if shutil.which("runuser"):
        return ["runuser", "-u", "nobody", "--"]
    pytest.skip("neither setpriv nor runuser is installed")


def _python_for(prefix: list[str]) -> str:
    """An interpreter `nobody` may run (a venv's python can sit under root's 0700 home)."""
    for candidate in (os.path.realpath(sys.executable), shutil.which("python3", path="/usr/bin:/bin"),
                      "/usr/local/bin/python3"):
        if candidate and subprocess.run([*prefix, candidate, "-c", "import http.server"], capture_output=True,
                                        timeout=60).returncode == 0:
            return candidate
    pytest.skip("no Python interpreter that the user nobody may run")


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A folder under /tmp that other users may enter (pytest's tmp_path sits under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="kforge-serve-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_pip_installs_from_a_wheelhouse_served_by_another_user(public_dir: Path, tmp_path: Path) -> None:
    prefix = _as_nobody()
    python = _python_for(prefix)
    root = public_dir / "wheelhouse"
    report = tmp_path / "report.json"
    report.write_text("{}")
    old = os.umask(0o077)  # the umask that made 0600 files before
    try:
        pub = wheelhouse.publish(root, "tiny", make_wheel(tmp_path / "d", version="4.2.0", body="SERVED = 1\n"),
                                 manifest(), attachments=(report,))
    finally:
        os.umask(old)
    server = subprocess.Popen([*prefix, python, "-u", "-m", "http.server", "--bind", "127.0.0.1", "0",
                               "--directory", str(root)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        port = int(re.search(r"port (\d+)", line).group(1))  # type: ignore[union-attr]
        owner = subprocess.run(["ps", "-o", "user=", "-p", str(server.pid)], capture_output=True, text=True).stdout
        assert owner.strip() in ("nobody", ""), owner  # (ps may be missing; setpriv/runuser set it)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
        target = tmp_path / "site"
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target),
                              "--index-url", f"http://127.0.0.1:{port}/simple/", "kforge-tiny==4.2.0"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert (target / "kforge_tiny" / "__init__.py").read_text() == "SERVED = 1\n"
        # the control: a 0600 file (what an older kforge wrote) is not served to anyone
        os.chmod(pub.wheel, 0o600)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/tiny/{pub.filename}", timeout=30)
        assert refused.value.code in (403, 404)
    finally:
        server.terminate()
        server.wait(timeout=10)

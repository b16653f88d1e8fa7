"""A real Airlock server for the SDK's tests, with real sandboxes.

By default the session starts scripts/test-server.ts (nativeRoutes over a LocalSandboxApi on
127.0.0.1, behind a bearer key made for the run) with the repo's tsx, and stops it at the end (it
kills its sandboxes when its stdin closes). AIRLOCK_TEST_SERVER_URL + AIRLOCK_TEST_SERVER_KEY point
the tests at a server that is already running instead (e.g. `airlock serve`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
sys.path.insert(0, str(PYTHON_DIR))

from airlock_sandbox import NotFoundError, Sandbox  # noqa: E402

#: Upload cap of scripts/test-server.ts (TEST_SERVER_LIMITS.maxUploadBytes).
MAX_UPLOAD_BYTES = 8 * 1024 * 1024


def _can_run_sandboxes() -> bool:
    return os.geteuid() == 0 and any(
        os.path.exists(p) for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap")
    )


def _start_launcher() -> "tuple[subprocess.Popen[bytes], Dict[str, str], Path]":
    tsx = REPO / "node_modules" / ".bin" / "tsx"
    if not tsx.exists():
        pytest.fail(f"{tsx} is missing: run scripts/setup.sh (npm ci) first")
    log = Path(tempfile.mkstemp(prefix="airlock-test-server-", suffix=".log")[1])
    env = dict(os.environ)
    proc = subprocess.Popen(
        [str(tsx), str(REPO / "scripts" / "test-server.ts")],
        cwd=str(REPO),
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
    )
    # The first line is {"url","key"}; a launcher that dies first ends the read with b"".
    first: Dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: first.setdefault("line", proc.stdout.readline()))
    reader.start()
    reader.join(120)
    line = first.get("line", b"")
    if not line:
        proc.kill()
        proc.wait()
        pytest.fail(f"scripts/test-server.ts did not start:\n{log.read_text(errors='replace')[-4000:]}")
    cfg = json.loads(line)
    return proc, {"api_url": cfg["url"], "api_key": cfg["key"]}, log


@pytest.fixture(scope="session")
def api() -> Iterator[Dict[str, str]]:
    """api_url / api_key of a live server; at the end, no sandbox of the run may be left on it."""
    url, key = os.environ.get("AIRLOCK_TEST_SERVER_URL"), os.environ.get("AIRLOCK_TEST_SERVER_KEY")
    if url:
        yield {"api_url": url, "api_key": key or ""}
        return
    if not _can_run_sandboxes():
        pytest.skip("needs root and bubblewrap (run scripts/setup.sh)")
    proc, cfg, log = _start_launcher()
    try:
        yield cfg
        left = [s.sandbox_id for s in Sandbox.list(**cfg)]
        assert left == [], f"sandboxes left behind by the tests: {left}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        text = log.read_text(errors="replace")
        log.unlink()
        assert code == 0, f"test server exited with {code}:\n{text[-4000:]}"


@pytest.fixture(scope="module")
def shared(api: Dict[str, str]) -> Iterator[Sandbox]:
    """One sandbox for a module's tests that do not care about its life cycle."""
    with Sandbox.create(ttl_seconds=600, metadata={"suite": "python"}, **api) as sbx:
        yield sbx


@pytest.fixture()
def sbx(api: Dict[str, str]) -> Iterator[Sandbox]:
    """A sandbox of its own for one test (killed after it, unless the test did)."""
    s = Sandbox.create(ttl_seconds=300, metadata={"suite": "python"}, **api)
    try:
        yield s
    finally:
        try:
            s.kill()
        except NotFoundError:
            pass


@pytest.fixture()
def tmpdir_path() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="airlock-py-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)

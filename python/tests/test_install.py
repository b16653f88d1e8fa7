"""The package installs offline with pip (no index, no build download) and stays Python 3.9 syntax."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from conftest import PYTHON_DIR


def test_pip_installs_it_offline_into_a_target_dir(tmpdir_path: Path):
    target = tmpdir_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # --isolated: no pip config or PIP_* env (no local mirror); --no-index: no package index at all.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--no-index", "--no-cache-dir",
         "--disable-pip-version-check", "--target", str(target), str(PYTHON_DIR)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = subprocess.run(
        [sys.executable, "-c",
         "import airlock_sandbox as a, importlib.metadata as m; "
         "print(a.__file__); print(a.__version__, m.version('airlock-sandbox')); "
         "from airlock_sandbox import Sandbox, AirlockError, NotFoundError"],
        capture_output=True, text=True, cwd=str(tmpdir_path), env={**env, "PYTHONPATH": str(target)},
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    where, versions = check.stdout.splitlines()
    assert where.startswith(str(target))
    ours, installed = versions.split()
    assert ours == installed
    # Only the package and its metadata: no tests, no build backend.
    assert sorted(p.name for p in target.iterdir()) == [
        "airlock_sandbox", f"airlock_sandbox-{ours}.dist-info"
    ]
    # And the build left nothing in the source tree.
    assert not (PYTHON_DIR / "build").exists()


def test_the_sources_parse_as_python_3_9():
    files = list((PYTHON_DIR / "airlock_sandbox").glob("*.py")) + list((PYTHON_DIR / "_backend").glob("*.py"))
    assert files
    for f in files:
        ast.parse(f.read_text(encoding="utf-8"), filename=str(f), feature_version=(3, 9))

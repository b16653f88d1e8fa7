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


def _backend():
    import importlib.util

    path = PYTHON_DIR / "_backend" / "airlock_build.py"
    spec = importlib.util.spec_from_file_location("airlock_build", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_wheel_records_every_file_with_its_hash(tmpdir_path: Path):
    import base64
    import hashlib
    import zipfile

    name = _backend().build_wheel(str(tmpdir_path))
    assert name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(tmpdir_path / name) as z:
        files = set(z.namelist())
        record_name = next(f for f in files if f.endswith("/RECORD"))
        record = [line.split(",") for line in z.read(record_name).decode().splitlines()]
        recorded = {path for path, _, _ in record}
        assert recorded == files
        for path, digest, size in record:
            if path.endswith("/RECORD"):
                continue
            data = z.read(path)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={want}", len(data)), path
    assert "airlock_sandbox/__init__.py" in files and "airlock_sandbox/py.typed" in files
    assert not any(f.startswith("tests/") or "_backend" in f for f in files)


def test_the_sdist_builds_again_from_itself(tmpdir_path: Path):
    import tarfile

    name = _backend().build_sdist(str(tmpdir_path))
    with tarfile.open(tmpdir_path / name) as t:
        t.extractall(tmpdir_path / "src")
    root = tmpdir_path / "src" / name[: -len(".tar.gz")]
    assert (root / "PKG-INFO").read_text().startswith("Metadata-Version: 2.1\nName: airlock-sandbox\n")
    target = tmpdir_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "install", "--no-index", "--no-cache-dir",
         "--disable-pip-version-check", "--target", str(target), str(root)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "airlock_sandbox" / "sandbox.py").exists()


def test_an_editable_wheel_points_at_the_source_dir(tmpdir_path: Path):
    import zipfile

    name = _backend().build_editable(str(tmpdir_path))
    with zipfile.ZipFile(tmpdir_path / name) as z:
        assert z.read("airlock_sandbox.pth").decode().strip() == str(PYTHON_DIR)

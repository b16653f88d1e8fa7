"""A PEP 517 build backend in the standard library only, so that ``pip install ./python`` works
offline.

Why not setuptools: pip builds a project that has a pyproject.toml in an isolated environment and
first downloads the backend named in ``requires`` into it; the host's setuptools is not visible
there. With ``requires = []`` and this in-tree backend, pip needs nothing it does not have. The
package is pure Python (one dir of .py files), so a wheel is a zip of those files plus metadata.
Metadata comes from pyproject.toml's [project] table (string values only; TOML needs no parser
for that here, and tomllib is not in Python 3.9/3.10).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "airlock_sandbox"


def _project() -> Dict[str, str]:
    """The string fields of pyproject.toml's [project] table."""
    fields: Dict[str, str] = {}
    section = None
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            header = re.fullmatch(r"\[([^\]]+)\]", line)
            if header:
                section = header.group(1).strip()
            elif section == "project":
                m = re.fullmatch(r'([A-Za-z][\w-]*)\s*=\s*"([^"\\]*)"', line)
                if m:
                    fields[m.group(1)] = m.group(2)
    for key in ("name", "version"):
        if key not in fields:
            raise RuntimeError(f"pyproject.toml [project] has no {key}")
    return fields


def _metadata(p: Dict[str, str]) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    for key, header in (("description", "Summary"), ("requires-python", "Requires-Python")):
        if key in p:
            lines.append(f"{header}: {p[key]}")
    lines.append("License: Apache-2.0")
    return ("\n".join(lines) + "\n").encode("utf-8")


def _sources() -> List[Tuple[str, str]]:
    """(path in the archive, path on disk) of every file of the package."""
    out = []
    pkg = os.path.join(_ROOT, _PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":
            out.append((f"{_PACKAGE}/{name}", os.path.join(pkg, name)))
    return out


def _dist_name(p: Dict[str, str]) -> str:
    return re.sub(r"[-_.]+", "_", p["name"]).lower()


def _wheel(wheel_directory: str, files: List[Tuple[str, bytes]]) -> str:
    p = _project()
    dist = f"{_dist_name(p)}-{p['version']}"
    info = f"{dist}.dist-info"
    files = files + [
        (f"{info}/METADATA", _metadata(p)),
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: airlock_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        ),
    ]
    record = io.StringIO()
    for arc, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{arc},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    files.append((f"{info}/RECORD", record.getvalue().encode("utf-8")))
    basename = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, basename), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return basename


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---- PEP 517 / PEP 660 hooks ----------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[dict] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    return _wheel(wheel_directory, [(arc, _read(path)) for arc, path in _sources()])


def build_editable(
    wheel_directory: str,
    config_settings: Optional[dict] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    # A .pth line puts this source dir on sys.path: edits take effect without a reinstall.
    return _wheel(wheel_directory, [(f"{_PACKAGE}.pth", (_ROOT + "\n").encode("utf-8"))])


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    p = _project()
    dist = f"{_dist_name(p)}-{p['version']}"
    members = [(arc, path) for arc, path in _sources()]
    for extra in ("pyproject.toml", "README.md", "_backend/airlock_build.py"):
        if os.path.exists(os.path.join(_ROOT, extra)):
            members.append((extra, os.path.join(_ROOT, extra)))
    basename = f"{dist}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, basename), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for arc, data in [("PKG-INFO", _metadata(p))] + [(a, _read(f)) for a, f in members]:
            ti = tarfile.TarInfo(f"{dist}/{arc}")
            ti.size = len(data)
            ti.mode = 0o644
            t.addfile(ti, io.BytesIO(data))
    return basename

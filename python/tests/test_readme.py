"""Every python block of python/README.md runs as written against the real server."""

from __future__ import annotations

import re

from conftest import PYTHON_DIR

from airlock_sandbox import Sandbox


def test_the_readme_example_runs(api, monkeypatch):
    text = (PYTHON_DIR / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    monkeypatch.setenv("AIRLOCK_API_URL", api["api_url"])
    monkeypatch.setenv("AIRLOCK_API_KEY", api["api_key"])
    for block in blocks:
        exec(compile(block, "python/README.md", "exec"), {})
    # The with block killed its sandbox (a server may still list it, as killed).
    assert [s for s in Sandbox.list(metadata={"job": "readme"}, **api) if s.state == "running"] == []

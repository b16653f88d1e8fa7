"""Templates on an Airlock server: build one (with a progress callback), list, get, delete.

    from airlock_sandbox import Sandbox, Template

    info = Template.build(
        "py-tools",
        files={"requirements.txt": "requests\n"},
        steps=["python3 -m venv /workspace/venv"],
        on_progress=lambda ev: print(ev["type"]),
    )
    with Sandbox.create(template="py-tools") as sbx:
        ...

A template belongs to the API key's tenant: another tenant's is NotFoundError. Files travel as
their contents (the server never reads a path of its own host); each step runs in a sandbox with
its own network policy (none unless the step says so).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ._transport import Transport, segment
from .errors import CONNECTION_FAILED, INVALID_RESPONSE, AirlockError, error_for
from .models import _req, _time

#: Called with each event of a build, in order (``start``, ``files``, ``step-started``,
#: ``step-output`` (with ``output``: the decoded bytes), ``step-finished`` (``durationMs``),
#: ``layer``, ``done``).
ProgressCallback = Callable[[Dict[str, Any]], None]

Step = Union[str, Sequence[str], Mapping[str, Any]]


@dataclass(frozen=True)
class TemplateInfo:
    """A built template: create sandboxes from it with ``Sandbox.create(template=info.name)``."""

    name: str
    digest: str
    created_at: datetime
    size_bytes: int

    @classmethod
    def from_json(cls, obj: Any) -> "TemplateInfo":
        what = "template"
        return cls(
            name=_req(obj, "name", str, what),
            digest=_req(obj, "digest", str, what),
            created_at=_time(_req(obj, "createdAt", str, what), what),  # type: ignore[arg-type]
            size_bytes=int(_req(obj, "sizeBytes", (int, float), what)),
        )


def _step(step: Step) -> Dict[str, Any]:
    if isinstance(step, str):
        return {"run": step}
    if isinstance(step, Mapping):
        return dict(step)
    return {"run": list(step)}


class Template:
    """Build, list, get and delete the templates of your tenant (class methods only)."""

    @classmethod
    def build(
        cls,
        name: str,
        *,
        base: Optional[str] = None,
        files: Optional[Union[Mapping[str, str], Sequence[Mapping[str, str]]]] = None,
        steps: Optional[Sequence[Step]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        backend: Optional[str] = None,
        on_progress: Optional[ProgressCallback] = None,
        queue_timeout_seconds: Optional[float] = None,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> TemplateInfo:
        """Build ``name`` on the server and wait for it; raises the build's AirlockError (a failed
        step is ``TEMPLATE_BUILD_FAILED`` with ``field`` ``steps.<i>``). ``files``: a mapping of
        path → text, or a list of ``{"path", "content"}``. ``steps``: shell strings, argv lists, or
        dicts ``{"run", "network", "env", "timeoutMs", "workdir"}``. A callback that raises ends
        the build (the server cancels it and leaves nothing)."""
        body: Dict[str, Any] = {"name": name}
        if base is not None:
            body["base"] = base
        if files is not None:
            body["files"] = (
                [{"path": p, "content": c} for p, c in files.items()]
                if isinstance(files, Mapping)
                else [dict(f) for f in files]
            )
        if steps is not None:
            body["steps"] = [_step(s) for s in steps]
        if limits is not None:
            body["limits"] = dict(limits)
        if backend is not None:
            body["backend"] = backend
        if queue_timeout_seconds is not None:
            body["queueTimeoutMs"] = int(queue_timeout_seconds * 1000)
        t = Transport(api_url, api_key)
        # No read timeout: a step may run for long without output.
        resp = t.open(
            "POST",
            "/v1/templates",
            json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            timeout=None,
        )
        try:
            for ev in resp.lines():
                kind = ev["type"]
                if kind == "error":
                    code, message, fld = ev.get("code"), ev.get("message"), ev.get("field")
                    raise error_for(
                        code if isinstance(code, str) else "INTERNAL",
                        message if isinstance(message, str) else "template build failed",
                        field=fld if isinstance(fld, str) else None,
                    )
                if kind == "step-output":
                    try:
                        ev["output"] = base64.b64decode(str(ev.get("data", "")), validate=True)
                    except (binascii.Error, ValueError) as e:
                        raise AirlockError(INVALID_RESPONSE, "template build: bad base64 output") from e
                if on_progress is not None:
                    on_progress(ev)
                if kind == "done":
                    return TemplateInfo.from_json(ev.get("template"))
            raise error_for(CONNECTION_FAILED, "template build: the stream ended before the build did")
        finally:
            resp.close()

    @classmethod
    def list(cls, *, api_url: Optional[str] = None, api_key: Optional[str] = None) -> List[TemplateInfo]:
        """Your templates."""
        data = Transport(api_url, api_key).json("GET", "/v1/templates")
        if not isinstance(data, list):
            raise AirlockError(INVALID_RESPONSE, "template list: expected an array")
        return [TemplateInfo.from_json(t) for t in data]

    @classmethod
    def get(cls, name: str, *, api_url: Optional[str] = None, api_key: Optional[str] = None) -> TemplateInfo:
        """One of your templates (NotFoundError otherwise)."""
        path = f"/v1/templates/{segment(name, 'name')}"
        return TemplateInfo.from_json(Transport(api_url, api_key).json("GET", path))

    @classmethod
    def delete(cls, name: str, *, api_url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Delete one of yours (ConflictError while a sandbox runs on it)."""
        Transport(api_url, api_key).json("DELETE", f"/v1/templates/{segment(name, 'name')}")

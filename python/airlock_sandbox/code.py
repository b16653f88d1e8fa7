"""Code execution: ``sbx.run_code`` and stateful code contexts (the server's /code routes).

The server runs a static analysis of the code first; a run it denies never starts and raises
:class:`~airlock_sandbox.errors.CodeDeniedError` with the ``findings``. Output and results stream
to the callbacks while the code runs; the :class:`Execution` holds all of them (bounded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from .errors import CONNECTION_FAILED, INVALID_RESPONSE, error_for
from ._transport import Transport, segment

#: The languages ``run_code`` accepts.
LANGUAGES = ("python", "javascript", "typescript", "bash")


@dataclass(frozen=True)
class Result:
    """One rich result: the value of the last expression (``is_main_result``) or something displayed."""

    is_main_result: bool
    text: Optional[str] = None
    json: Any = None
    png: Optional[str] = None  #: base64
    svg: Optional[str] = None
    html: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Result":
        return cls(
            is_main_result=bool(d.get("isMainResult")),
            text=d.get("text"),
            json=d.get("json"),
            png=d.get("png"),
            svg=d.get("svg"),
            html=d.get("html"),
        )


@dataclass(frozen=True)
class ExecutionError:
    """The code's own error: its type name, message and traceback."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class Execution:
    """What one run gave back."""

    results: List[Result]
    stdout: str
    stderr: str
    error: Optional[ExecutionError]
    #: What the static analysis found (warn findings of a run it allowed), each a dict.
    findings: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> Optional[str]:
        """The text of the main result, if there is one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Execution":
        err = d.get("error")
        return cls(
            results=[Result.from_json(r) for r in d.get("results", [])],
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            error=ExecutionError(str(err["name"]), str(err["value"]), str(err["traceback"]))
            if isinstance(err, dict)
            else None,
            findings=list(d.get("findings", [])),
        )


@dataclass(frozen=True)
class CodeContext:
    """A stateful context: variables, imports and functions persist across its runs."""

    id: str
    language: str


def run_code(
    t: Transport,
    sandbox_id: str,
    code: str,
    language: Optional[str],
    context: "Optional[CodeContext | str]",
    timeout_seconds: Optional[float],
    envs: Optional[Dict[str, str]],
    policy: Optional[Dict[str, Any]],
    on_stdout: Optional[Callable[[str], None]],
    on_stderr: Optional[Callable[[str], None]],
    on_result: Optional[Callable[[Result], None]],
) -> Execution:
    body: Dict[str, Any] = {"code": code}
    if language is not None:
        body["language"] = language
    if context is not None:
        body["context"] = context.id if isinstance(context, CodeContext) else context
    if timeout_seconds is not None:
        body["timeoutMs"] = int(round(timeout_seconds * 1000))
    if envs is not None:
        body["envs"] = envs
    if policy is not None:
        body["policy"] = policy
    resp = t.open(
        "POST",
        f"/v1/sandboxes/{segment(sandbox_id, 'sandbox_id')}/code",
        json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        # A run may be quiet for as long as it runs (default 60 s on the server).
        timeout=None if timeout_seconds is None else timeout_seconds + 30,
    )
    events = resp.lines()
    try:
        for ev in events:
            kind = ev.get("type")
            if kind == "stdout" and on_stdout is not None:
                on_stdout(str(ev.get("text", "")))
            elif kind == "stderr" and on_stderr is not None:
                on_stderr(str(ev.get("text", "")))
            elif kind == "result" and on_result is not None:
                on_result(Result.from_json(ev.get("result") or {}))
            elif kind == "end":
                execution = ev.get("execution")
                if not isinstance(execution, dict):
                    raise error_for(INVALID_RESPONSE, "the server sent an end event without its execution")
                return Execution.from_json(execution)
            elif kind == "error":
                code_, message = ev.get("code"), ev.get("message")
                raise error_for(
                    code_ if isinstance(code_, str) else "INTERNAL",
                    message if isinstance(message, str) else "run_code failed",
                )
        raise error_for(CONNECTION_FAILED, "run_code: the stream ended before the run did")
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()

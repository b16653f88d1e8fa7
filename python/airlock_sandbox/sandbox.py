"""The Sandbox: create one on an Airlock server, run commands in it, move files, kill it."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Type, Union, overload

from .code import CodeContext, Execution, Result, run_code

from .commands import (
    Cmd,
    OutputCallback,
    Process,
    Processes,
    _ms,
    consume,
    exec_request,
    stream_timeout,
)
from .errors import INVALID_RESPONSE, AirlockError, NotFoundError
from .files import Files
from .models import CommandResult, ProcessInfo, SandboxInfo, SnapshotInfo
from ._transport import Stream, Transport, segment

class Sandbox:
    """A sandbox on an Airlock server.

    Make one with :meth:`create` (or reach an existing one with :meth:`connect`). As a context
    manager it is killed when the ``with`` block ends, also when the block raises. The server is
    ``api_url``/``api_key``, else the ``AIRLOCK_API_URL``/``AIRLOCK_API_KEY`` environment variables.
    """

    def __init__(self, transport: Transport, info: SandboxInfo) -> None:
        self._t = transport
        self._info = info
        self.sandbox_id = info.sandbox_id
        self.files = Files(transport, info.sandbox_id)
        self.processes = Processes(transport, info.sandbox_id)

    # ---- life cycle -------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        ttl_seconds: Optional[float] = 300,
        *,
        metadata: Optional[Dict[str, str]] = None,
        env: Optional[Dict[str, str]] = None,
        backend: Optional[str] = None,
        snapshot: Optional[str] = None,
        memory_bytes: Optional[int] = None,
        cpus: Optional[float] = None,
        pids: Optional[int] = None,
        disk_bytes: Optional[int] = None,
        network: Optional[Dict[str, Any]] = None,
        secrets: Optional[Sequence[Dict[str, Any]]] = None,
        public_ports: Optional[bool] = None,
        queue_timeout_seconds: Optional[float] = None,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
        code_policy: Optional[Dict[str, Any]] = None,
    ) -> "Sandbox":
        """Start a sandbox; it is killed after ``ttl_seconds`` unless extended (None: the server's
        default). ``snapshot`` forks a snapshot instead of a template. ``secrets`` are literal
        ``{"name", "value", "hosts"}`` values, swapped in only for traffic to those hosts."""
        t = Transport(api_url, api_key, request_timeout)
        body: Dict[str, Any] = {}
        if template is not None:
            body["template"] = template
        if snapshot is not None:
            body["snapshot"] = snapshot
        if ttl_seconds is not None:
            body["ttlMs"] = _ms(ttl_seconds, "ttl_seconds")
        if backend is not None:
            body["backend"] = backend
        limits = {
            k: v
            for k, v in (
                ("memoryBytes", memory_bytes),
                ("cpus", cpus),
                ("pids", pids),
                ("diskBytes", disk_bytes),
            )
            if v is not None
        }
        if limits:
            body["limits"] = limits
        for key, value in (
            ("env", env),
            ("metadata", metadata),
            ("network", network),
            ("publicPorts", public_ports),
            ("codePolicy", code_policy),
        ):
            if value is not None:
                body[key] = value
        if secrets is not None:
            body["secrets"] = [dict(s) for s in secrets]
        if queue_timeout_seconds is not None:
            body["queueTimeoutMs"] = _ms(queue_timeout_seconds, "queue_timeout_seconds")
        # A create may first wait in the server's queue (default 5 s) before it starts.
        timeout = t.timeout + (5.0 if queue_timeout_seconds is None else queue_timeout_seconds)
        return cls(t, SandboxInfo.from_json(t.json("POST", "/v1/sandboxes", body, timeout=timeout)))

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "Sandbox":
        """A handle on an existing sandbox (NotFoundError if there is none, or it is not yours)."""
        t = Transport(api_url, api_key, request_timeout)
        path = f"/v1/sandboxes/{segment(sandbox_id, 'sandbox_id')}"
        return cls(t, SandboxInfo.from_json(t.json("GET", path)))

    @classmethod
    def list(
        cls,
        metadata: Optional[Dict[str, str]] = None,
        *,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> List[SandboxInfo]:
        """Your sandboxes; with ``metadata``, only those whose metadata has every one of these pairs."""
        t = Transport(api_url, api_key, request_timeout)
        query = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
        data = t.json("GET", "/v1/sandboxes", query=query)
        if not isinstance(data, list):
            raise AirlockError(INVALID_RESPONSE, "sandbox list: expected an array")
        return [SandboxInfo.from_json(s) for s in data]

    @classmethod
    def list_snapshots(
        cls, *, api_url: Optional[str] = None, api_key: Optional[str] = None
    ) -> List[SnapshotInfo]:
        data = Transport(api_url, api_key).json("GET", "/v1/snapshots")
        if not isinstance(data, list):
            raise AirlockError(INVALID_RESPONSE, "snapshot list: expected an array")
        return [SnapshotInfo.from_json(s) for s in data]

    @classmethod
    def delete_snapshot(
        cls, snapshot_id: str, *, api_url: Optional[str] = None, api_key: Optional[str] = None
    ) -> None:
        Transport(api_url, api_key).json("DELETE", f"/v1/snapshots/{segment(snapshot_id, 'snapshot_id')}")

    @property
    def id(self) -> str:
        return self.sandbox_id

    @property
    def api_url(self) -> str:
        return self._t.api_url

    def _path(self, tail: str = "") -> str:
        return f"/v1/sandboxes/{segment(self.sandbox_id, 'sandbox_id')}{tail}"

    def get_info(self) -> SandboxInfo:
        """The sandbox as the server sees it now (state, deadline, metadata)."""
        self._info = SandboxInfo.from_json(self._t.json("GET", self._path()))
        return self._info

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as last seen (see get_info())."""
        return self._info

    def is_running(self) -> bool:
        try:
            return self.get_info().state == "running"
        except NotFoundError:
            return False

    def set_timeout(self, seconds: float) -> SandboxInfo:
        """Kill the sandbox ``seconds`` from now (instead of at its current deadline)."""
        body = {"ttlMs": _ms(seconds, "seconds")}
        self._info = SandboxInfo.from_json(self._t.json("POST", self._path("/timeout"), body))
        return self._info

    def set_network_policy(self, network: Dict[str, Any]) -> Dict[str, Any]:
        """Replace the sandbox's network policy now (same shape as ``network`` at create).

        New connections and DNS answers follow it at once; open connections it denies are
        closed. Returns the policy in force. A sandbox created without ``network`` refuses
        (InvalidArgumentError): create it with a network policy to change it later.
        """
        return dict(self._t.json("PUT", self._path("/network"), network))

    def pause(self) -> SandboxInfo:
        self._info = SandboxInfo.from_json(self._t.json("POST", self._path("/pause")))
        return self._info

    def resume(self) -> SandboxInfo:
        self._info = SandboxInfo.from_json(self._t.json("POST", self._path("/resume")))
        return self._info

    def kill(self) -> None:
        """Kill the sandbox and everything in it."""
        self._t.json("DELETE", self._path())

    def snapshot(self) -> SnapshotInfo:
        """Snapshot the sandbox's filesystem; fork it with ``Sandbox.create(snapshot=...)``."""
        return SnapshotInfo.from_json(self._t.json("POST", self._path("/snapshot")))

    def egress_events(self) -> Stream[Dict[str, Any]]:
        """The sandbox's egress events (each a dict, as the server sends it), live, until closed."""
        resp = self._t.open("GET", self._path("/egress"), timeout=None)
        return Stream(resp, resp.lines())

    # ---- commands ---------------------------------------------------------------------------

    @overload
    def exec(
        self,
        cmd: Cmd,
        *,
        background: "Literal[False]" = False,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        stdin: Optional[str] = None,
        max_output_bytes: Optional[int] = None,
    ) -> CommandResult: ...

    @overload
    def exec(
        self,
        cmd: Cmd,
        *,
        background: "Literal[True]",
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        stdin: Optional[str] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Process: ...

    def exec(
        self,
        cmd: Cmd,
        *,
        background: bool = False,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        stdin: Optional[str] = None,
        max_output_bytes: Optional[int] = None,
    ) -> Union[CommandResult, Process]:
        """Run ``cmd`` (an argv list, or a string for /bin/sh -c) and wait for it.

        Output reaches ``on_stdout``/``on_stderr`` as it comes; the result holds all of it and the
        exit code (a non-zero exit is a result, not an error). If a callback raises, or the call is
        interrupted, the connection is closed and the server kills the command. With
        ``background=True`` it returns a :class:`Process` at once.
        """
        body = exec_request(cmd, cwd, env, timeout_seconds, stdin, max_output_bytes)
        if background:
            info = ProcessInfo.from_json(self._t.json("POST", self._path("/processes"), body))
            return Process(self._t, self.sandbox_id, info, on_stdout, on_stderr)
        resp = self._t.open(
            "POST",
            self._path("/exec"),
            json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            timeout=stream_timeout(timeout_seconds),
        )
        return consume(resp.lines(), on_stdout, on_stderr, f"exec in {self.sandbox_id}")

    # ---- code -------------------------------------------------------------------------------

    def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        context: "Optional[Union[CodeContext, str]]" = None,
        *,
        timeout_seconds: Optional[float] = None,
        envs: Optional[Dict[str, str]] = None,
        policy: Optional[Dict[str, Any]] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
        on_result: Optional[Callable[[Result], None]] = None,
    ) -> Execution:
        """Run code in the sandbox (``python`` by default; ``javascript``, ``typescript``, ``bash``).

        The last expression's value is the main result; the code's own exception is
        ``execution.error`` (not raised). In a ``context`` (from :meth:`create_code_context`) state
        persists across runs. A run the server's static analysis denies raises
        :class:`CodeDeniedError` and never starts. A timeout kills the context's state.
        """
        return run_code(
            self._t,
            self.sandbox_id,
            code,
            language,
            context,
            timeout_seconds,
            envs,
            policy,
            on_stdout,
            on_stderr,
            on_result,
        )

    def create_code_context(
        self,
        language: str = "python",
        *,
        cwd: Optional[str] = None,
        envs: Optional[Dict[str, str]] = None,
    ) -> CodeContext:
        """A stateful code context: variables, imports and functions persist across its runs."""
        body: Dict[str, Any] = {"language": language}
        if cwd is not None:
            body["cwd"] = cwd
        if envs is not None:
            body["envs"] = envs
        d = self._t.json("POST", self._path("/code/contexts"), body)
        return CodeContext(id=str(d["id"]), language=str(d["language"]))

    def list_code_contexts(self) -> List[CodeContext]:
        """The sandbox's open code contexts."""
        return [
            CodeContext(id=str(d["id"]), language=str(d["language"]))
            for d in self._t.json("GET", self._path("/code/contexts"))
        ]

    def close_code_context(self, context: "Union[CodeContext, str]") -> None:
        """Close a context: its state is gone."""
        cid = context.id if isinstance(context, CodeContext) else context
        self._t.json("DELETE", self._path(f"/code/contexts/{segment(cid, 'context')}"))

    # ---- context manager --------------------------------------------------------------------

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.kill()
        except NotFoundError:
            pass  # killed in the block, or expired: gone either way
        except AirlockError as e:
            if exc is None:
                raise
            # The block's own error matters more; keep this one beside it.
            if hasattr(exc, "add_note"):
                exc.add_note(f"and killing sandbox {self.sandbox_id} failed: {e}")

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r}, api_url={self._t.api_url!r})"

"""Commands in a sandbox: foreground exec streamed as NDJSON events, and background processes."""

from __future__ import annotations

import base64
import binascii
import codecs
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

from .errors import CONNECTION_FAILED, INVALID_RESPONSE, AirlockError, error_for
from .models import CommandResult, ProcessInfo
from ._transport import Transport, segment

#: A command: an argv list, or one string run with /bin/sh -c.
Cmd = Union[str, Sequence[str]]
#: Called with each piece of output as it arrives (UTF-8 text; a character split across pieces
#: is delivered whole).
OutputCallback = Callable[[str], Any]

#: How much longer than a command's own timeout a quiet stream is waited for before giving up.
_STREAM_GRACE_SECONDS = 30.0


def exec_request(
    cmd: Cmd,
    cwd: Optional[str],
    env: Optional[Dict[str, str]],
    timeout_seconds: Optional[float],
    stdin: Optional[str],
    max_output_bytes: Optional[int],
) -> Dict[str, Any]:
    """The ExecRequest body; the server validates every field and names the bad one."""
    body: Dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else list(cmd)}
    if cwd is not None:
        body["cwd"] = cwd
    if env is not None:
        body["env"] = dict(env)
    if timeout_seconds is not None:
        body["timeoutMs"] = _ms(timeout_seconds, "timeout_seconds")
    if stdin is not None:
        body["stdin"] = stdin
    if max_output_bytes is not None:
        body["maxOutputBytes"] = max_output_bytes
    return body


def stream_timeout(timeout_seconds: Optional[float]) -> Optional[float]:
    """The socket read timeout of a command's stream: a command may be quiet for as long as it runs."""
    return None if timeout_seconds is None else timeout_seconds + _STREAM_GRACE_SECONDS


def _ms(seconds: float, field: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise error_for("INVALID_ARGUMENT", f"{field} must be a number of seconds", field=field)
    return int(round(seconds * 1000))


class _Output:
    """One output stream: the bytes so far, and the callback fed whole UTF-8 characters."""

    def __init__(self, callback: Optional[OutputCallback]) -> None:
        self.callback = callback
        self.chunks: List[bytes] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.chunks.append(data)
        if self.callback is not None:
            text = self._decoder.decode(data)
            if text:
                self.callback(text)

    def finish(self) -> bytes:
        if self.callback is not None:
            text = self._decoder.decode(b"", final=True)
            if text:
                self.callback(text)
        return b"".join(self.chunks)


def consume(
    events: Iterator[Dict[str, Any]],
    on_stdout: Optional[OutputCallback],
    on_stderr: Optional[OutputCallback],
    what: str,
) -> CommandResult:
    """Read an ExecEvent stream to its exit event; output goes to the callbacks in arrival order.

    The stream is closed on return and on any error (a callback that raises included), which tells
    the server the client left.
    """
    out, err = _Output(on_stdout), _Output(on_stderr)
    pid: Optional[str] = None
    try:
        for ev in events:
            kind = ev["type"]
            if kind == "start":
                pid = ev.get("pid") if isinstance(ev.get("pid"), str) else None
            elif kind in ("stdout", "stderr"):
                (out if kind == "stdout" else err).feed(_b64(ev.get("data"), what))
            elif kind == "exit":
                code = ev.get("exitCode")
                signal, killed_by = ev.get("signal"), ev.get("killedBy")
                duration = ev.get("durationMs")
                stdout, stderr = out.finish(), err.finish()
                return CommandResult(
                    exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                    stdout_bytes=stdout,
                    stderr_bytes=stderr,
                    signal=signal if isinstance(signal, str) else None,
                    killed_by=killed_by if isinstance(killed_by, str) else None,
                    duration_ms=float(duration) if isinstance(duration, (int, float)) else 0.0,
                    pid=pid,
                )
            elif kind == "error":
                code, message = ev.get("code"), ev.get("message")
                raise error_for(
                    code if isinstance(code, str) else "INTERNAL",
                    message if isinstance(message, str) else f"{what} failed",
                )
            # Any other type is from a newer server: skipped.
        raise error_for(CONNECTION_FAILED, f"{what}: the stream ended before the command exited")
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def _b64(data: Any, what: str) -> bytes:
    if not isinstance(data, str):
        raise AirlockError(INVALID_RESPONSE, f"{what}: an output event has no data")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise AirlockError(INVALID_RESPONSE, f"{what}: output is not base64") from e


class Process:
    """A background process in a sandbox: wait for it, feed its stdin, kill it.

    ``wait()`` returns its whole output (kept by the server from the start) and exit. Callbacks given
    when it was started get its output live on a thread of their own, and ``wait()`` joins it.
    """

    def __init__(
        self,
        transport: Transport,
        sandbox_id: str,
        info: ProcessInfo,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id
        self.pid = info.pid
        self.cmd = info.cmd
        self._result: Optional[CommandResult] = None
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        if on_stdout is not None or on_stderr is not None:
            self._thread = threading.Thread(
                target=self._follow, args=(on_stdout, on_stderr), daemon=True
            )
            self._thread.start()

    def _path(self, tail: str = "") -> str:
        return (
            f"/v1/sandboxes/{segment(self.sandbox_id, 'sandbox_id')}"
            f"/processes/{segment(self.pid, 'pid')}{tail}"
        )

    def _follow(self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]) -> None:
        try:
            self._result = self._stream(on_stdout, on_stderr)
        except BaseException as e:  # handed to wait()
            self._error = e

    def _stream(
        self, on_stdout: Optional[OutputCallback], on_stderr: Optional[OutputCallback]
    ) -> CommandResult:
        resp = self._t.open("GET", self._path("/stream"), timeout=None)
        return consume(resp.lines(), on_stdout, on_stderr, f"process {self.pid}")

    def wait(
        self,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> CommandResult:
        """Block until the process exits; its whole output and exit status."""
        if self._thread is not None:
            if on_stdout is not None or on_stderr is not None:
                raise error_for(
                    "INVALID_ARGUMENT",
                    "this process already streams to the callbacks it was started with",
                    field="on_stdout",
                )
            self._thread.join()
            if self._error is not None:
                raise self._error
            assert self._result is not None
            return self._result
        return self._stream(on_stdout, on_stderr)

    def kill(self) -> None:
        """Kill the process (SIGKILL)."""
        self._t.json("DELETE", self._path())

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Write to the process's stdin."""
        resp = self._t.open(
            "POST",
            self._path("/stdin"),
            data,
            headers={"Content-Type": "application/octet-stream"},
            timeout=self._t.timeout,
        )
        resp.read()
        resp.close()

    def close_stdin(self) -> None:
        """Close the process's stdin (it reads end-of-file)."""
        self._t.json("DELETE", self._path("/stdin"))

    def info(self) -> ProcessInfo:
        """The process as the server sees it now."""
        for p in Processes(self._t, self.sandbox_id).list():
            if p.pid == self.pid:
                return p
        raise error_for("PROCESS_NOT_FOUND", f"process {self.pid} is gone", status=404)

    def __repr__(self) -> str:
        return f"Process(sandbox_id={self.sandbox_id!r}, pid={self.pid!r}, cmd={self.cmd!r})"


class Processes:
    """``sbx.processes``: the sandbox's background processes."""

    def __init__(self, transport: Transport, sandbox_id: str) -> None:
        self._t = transport
        self._id = sandbox_id

    def list(self) -> List[ProcessInfo]:
        data = self._t.json("GET", f"/v1/sandboxes/{segment(self._id, 'sandbox_id')}/processes")
        if not isinstance(data, list):
            raise AirlockError(INVALID_RESPONSE, "process list: expected an array")
        return [ProcessInfo.from_json(p) for p in data]

    def connect(
        self,
        pid: str,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> Process:
        """A handle on a running (or finished) process, e.g. one another client started."""
        info = next((p for p in self.list() if p.pid == pid), None)
        if info is None:
            raise error_for(
                "PROCESS_NOT_FOUND", f"no process {pid!r} in sandbox {self._id}", status=404
            )
        return Process(self._t, self._id, info, on_stdout, on_stderr)

    def kill(self, pid: str) -> None:
        Process(self._t, self._id, ProcessInfo(pid, [], True, None)).kill()

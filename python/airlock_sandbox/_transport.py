"""HTTP to an Airlock server with the standard library only (http.client): JSON calls, NDJSON
streams and raw byte bodies, each error answer raised as its AirlockError subclass.

One connection per call: calls are thread-safe, and closing a stream closes its socket, which the
server takes as the client leaving (it kills a foreground exec, closes a watcher).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
from typing import Any, BinaryIO, Dict, Generic, Iterable, Iterator, Mapping, Optional, TypeVar, Union
from urllib.parse import quote, urlencode, urlsplit

from .errors import CONNECTION_FAILED, INVALID_RESPONSE, AirlockError, error_for

__version__ = "0.1.0"

#: Default per-call socket timeout (seconds) for calls that are not streams.
DEFAULT_TIMEOUT_SECONDS = 60.0
#: An error body larger than this is cut (the message is for people, not for parsing).
_MAX_ERROR_BODY = 64 * 1024
#: A JSON response larger than this is refused (a list of many sandboxes stays far below it).
_MAX_JSON_BODY = 64 * 1024 * 1024
#: One NDJSON line (an event with a base64 chunk of output) is refused past this.
_MAX_LINE = 16 * 1024 * 1024

Body = Union[bytes, bytearray, memoryview, str, BinaryIO, Iterable[bytes], None]


def segment(value: str, what: str) -> str:
    """``value`` as one URL path segment; refuses what could address another route."""
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise error_for(
            "INVALID_ARGUMENT",
            f"{what} must be a non-empty id, got {value!r}",
            field=what,
        )
    return quote(value, safe="")


class Transport:
    """Where the server is and how to authenticate; every request of one client goes through it."""

    def __init__(
        self,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        url = api_url if api_url is not None else os.environ.get("AIRLOCK_API_URL")
        if not url:
            raise error_for(
                "INVALID_ARGUMENT",
                "no server: pass api_url=... or set AIRLOCK_API_URL (e.g. http://127.0.0.1:PORT)",
                field="api_url",
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise error_for(
                "INVALID_ARGUMENT",
                f"api_url must be an http:// or https:// URL with a host, got {url!r}",
                field="api_url",
            )
        if parts.query or parts.fragment:
            raise error_for(
                "INVALID_ARGUMENT",
                f"api_url must not carry a query or fragment, got {url!r}",
                field="api_url",
            )
        self.api_url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("AIRLOCK_API_KEY")
        self.api_key = key or None
        self.timeout = DEFAULT_TIMEOUT_SECONDS if timeout is None else timeout

    # ---- requests ---------------------------------------------------------------------------

    def json(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """A JSON call: the decoded response, or None for 204. ``timeout``: seconds a socket read
        may wait (default: this transport's)."""
        payload = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        resp = self.open(method, path, payload, query, headers, timeout or self.timeout)
        try:
            if resp.status == 204:
                resp.read()
                return None
            raw = resp.read(_MAX_JSON_BODY + 1)
            if len(raw) > _MAX_JSON_BODY:
                raise AirlockError(INVALID_RESPONSE, f"{method} {path}: response too large")
            return _decode_json(raw, f"{method} {path}")
        finally:
            resp.close()

    def open(
        self,
        method: str,
        path: str,
        body: Body = None,
        query: Optional[Mapping[str, str]] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> "Response":
        """Send a request and return its open response once the status is a success.

        ``timeout`` bounds each socket read (None: wait as long as the server streams nothing).
        Error statuses are raised as AirlockError subclasses.
        """
        target = self._prefix + path
        if query:
            target += "?" + urlencode(query, quote_via=quote)
        all_headers = {"User-Agent": f"airlock-sandbox-python/{__version__}", "Accept": "*/*"}
        if self.api_key:
            all_headers["Authorization"] = f"Bearer {self.api_key}"
        all_headers.update(headers or {})
        if isinstance(body, str):
            body = body.encode("utf-8")
        conn = self._connection(timeout)
        sent_error: Optional[BaseException] = None
        try:
            try:
                conn.request(method, target, body=body, headers=all_headers)
            except (BrokenPipeError, ConnectionResetError) as e:
                # The server may have answered early (e.g. 413 on an upload over its cap) and closed;
                # its answer is still readable and says more than the broken pipe does.
                sent_error = e
            resp = conn.getresponse()
        except AirlockError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            cause = sent_error or e
            raise error_for(
                CONNECTION_FAILED, f"{method} {self.api_url}{path}: {cause}"
            ) from cause
        if resp.status >= 400:
            try:
                raise _error_from(resp, method, path)
            finally:
                resp.close()
                conn.close()
        if sent_error is not None:
            conn.close()
            raise error_for(
                CONNECTION_FAILED, f"{method} {self.api_url}{path}: {sent_error}"
            ) from sent_error
        return Response(conn, resp, f"{method} {path}")

    def _connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)


class Response:
    """An open response: read it as bytes, as chunks or as NDJSON lines; close() ends it early."""

    def __init__(
        self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, what: str
    ) -> None:
        self._conn = conn
        self._resp = resp
        self.what = what
        self.status = resp.status
        self.headers = resp.headers

    def read(self, amt: Optional[int] = None) -> bytes:
        try:
            return self._resp.read(amt)
        except (OSError, http.client.HTTPException) as e:
            raise error_for(CONNECTION_FAILED, f"{self.what}: {e}") from e

    def chunks(self, size: int = 64 * 1024) -> Iterator[bytes]:
        """The body in chunks of at most ``size`` bytes; closes the response at the end."""
        try:
            while True:
                chunk = self.read1(size)
                if not chunk:
                    return
                yield chunk
        finally:
            self.close()

    def read1(self, size: int) -> bytes:
        try:
            return self._resp.read1(size)
        except (OSError, http.client.HTTPException) as e:
            raise error_for(CONNECTION_FAILED, f"{self.what}: {e}") from e

    def lines(self) -> Iterator[Dict[str, Any]]:
        """The body as NDJSON objects; closes the response at the end (or when dropped early)."""
        try:
            while True:
                try:
                    line = self._resp.readline(_MAX_LINE + 1)
                except (OSError, http.client.HTTPException) as e:
                    raise error_for(CONNECTION_FAILED, f"{self.what}: stream broke off: {e}") from e
                if not line:
                    return
                if len(line) > _MAX_LINE:
                    raise AirlockError(INVALID_RESPONSE, f"{self.what}: stream line too long")
                if not line.strip():
                    continue
                value = _decode_json(line, self.what)
                if not isinstance(value, dict) or not isinstance(value.get("type"), str):
                    raise AirlockError(
                        INVALID_RESPONSE, f"{self.what}: stream line is not an event: {line[:200]!r}"
                    )
                yield value
        finally:
            self.close()

    def close(self) -> None:
        self._resp.close()
        self._conn.close()

    def abort(self) -> None:
        """End the response from any thread: a read blocked on it returns (end of stream or an
        error) and the server sees the client leave."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode_json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise AirlockError(
            INVALID_RESPONSE, f"{what}: response is not JSON: {raw[:200]!r}"
        ) from e


def _error_from(resp: http.client.HTTPResponse, method: str, path: str) -> AirlockError:
    """The AirlockError an error answer stands for ({error:{code,message,field?}}, else its status)."""
    try:
        raw = resp.read(_MAX_ERROR_BODY)
    except (OSError, http.client.HTTPException):
        raw = b""
    retry_after = _retry_after(resp.headers.get("Retry-After"))
    try:
        err = json.loads(raw.decode("utf-8"))["error"]
        code, message = err["code"], err["message"]
        field = err.get("field")
        if isinstance(code, str) and isinstance(message, str):
            e = error_for(
                code,
                message,
                field if isinstance(field, str) else None,
                resp.status,
                retry_after,
            )
            findings = err.get("findings")
            if code == "CODE_DENIED" and isinstance(findings, list):
                e.findings = findings  # type: ignore[attr-defined]
            return e
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        pass
    text = raw.decode("utf-8", "replace").strip()[:500]
    return error_for(
        f"HTTP_{resp.status}",
        f"{method} {path} answered {resp.status} {resp.reason}" + (f": {text}" if text else ""),
        None,
        resp.status,
        retry_after,
    )


def _retry_after(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


T = TypeVar("T")


class Stream(Generic[T]):
    """A live stream from the server (file chunks, watch events, egress events): iterate it;
    ``close()`` (or leaving a ``with`` block) ends it from any thread, and an iteration in progress
    then ends as the stream does. The server sees the client leave and stops what feeds it."""

    def __init__(self, resp: Response, items: Iterator[T]) -> None:
        self._resp = resp
        self._items = items
        self._closed = False

    def __iter__(self) -> "Stream[T]":
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        try:
            return next(self._items)
        except AirlockError as e:
            if self._closed and e.code == CONNECTION_FAILED:
                raise StopIteration from None  # close() cut the stream: a normal end
            raise

    def close(self) -> None:
        self._closed = True
        self._resp.abort()
        try:
            self._items.close()  # type: ignore[attr-defined]
        except ValueError:
            return  # another thread is inside next(): it sees the cut stream and closes it
        self._resp.close()

    def __enter__(self) -> "Stream[T]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""``sbx.files``: the sandbox's filesystem. Uploads and downloads stream (no whole-file buffering
unless you ask for the content as one value)."""

from __future__ import annotations

import json
from typing import Any, BinaryIO, Iterable, List, Optional, Union

from .errors import INVALID_RESPONSE, AirlockError, NotFoundError, error_for
from .models import FileEntry, FsEvent
from ._transport import Response, Stream, Transport, segment

#: What ``files.write`` takes: text (written as UTF-8), bytes, a binary file object, or an
#: iterable of byte chunks (the last two are streamed).
WriteData = Union[str, bytes, bytearray, memoryview, BinaryIO, Iterable[bytes]]


class Files:
    def __init__(self, transport: Transport, sandbox_id: str) -> None:
        self._t = transport
        self._id = sandbox_id

    def _url(self, tail: str = "") -> str:
        return f"/v1/sandboxes/{segment(self._id, 'sandbox_id')}/files{tail}"

    def read(self, path: str, format: str = "text") -> Any:
        """The file's content: ``format`` "text" (str, UTF-8), "bytes", or "stream" (a Stream of
        byte chunks: read it to the end or close() it)."""
        if format not in ("text", "bytes", "stream"):
            raise error_for("INVALID_ARGUMENT", 'format must be "text", "bytes" or "stream"', field="format")
        resp = self._t.open("GET", self._url(), query={"path": path})
        if format == "stream":
            return Stream(resp, resp.chunks())
        with resp:
            data = resp.read()
        return data.decode("utf-8") if format == "text" else data

    def write(self, path: str, data: WriteData) -> FileEntry:
        """Create or replace the file (its parent dirs are made); the entry written."""
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        resp = self._t.open(
            "PUT",
            self._url(),
            data,  # type: ignore[arg-type]
            query={"path": path},
            headers={"Content-Type": "application/octet-stream"},
            timeout=self._t.timeout,
        )
        return FileEntry.from_json(_json(resp))

    def list(self, path: str) -> List[FileEntry]:
        """The entries of a dir."""
        data = self._t.json("GET", self._url("/list"), query={"path": path})
        if not isinstance(data, list):
            raise AirlockError(INVALID_RESPONSE, "file list: expected an array")
        return [FileEntry.from_json(e) for e in data]

    def stat(self, path: str) -> FileEntry:
        return FileEntry.from_json(self._t.json("GET", self._url("/stat"), query={"path": path}))

    def exists(self, path: str) -> bool:
        """True if something is at ``path`` (an unknown sandbox still raises)."""
        try:
            self.stat(path)
            return True
        except NotFoundError as e:
            if e.code == "FILE_NOT_FOUND":
                return False
            raise

    def remove(self, path: str) -> None:
        """Remove a file, or a dir with everything in it."""
        self._t.json("DELETE", self._url(), query={"path": path})

    def make_dir(self, path: str) -> FileEntry:
        """Make the dir (and its parents)."""
        return FileEntry.from_json(self._t.json("POST", self._url("/mkdir"), query={"path": path}))

    def watch(self, path: str, timeout: Optional[float] = None) -> "Stream[FsEvent]":
        """Changes under ``path`` as they happen: iterate the handle; close() (or ``with``) ends it.

        Changes made after watch() returns are reported. ``timeout`` (seconds): how long one wait
        for the next event may take before ApiConnectionError (None: no limit)."""
        resp = self._t.open("GET", self._url("/watch"), query={"path": path}, timeout=timeout)
        return Stream(resp, (_fs_event(ev) for ev in resp.lines()))


def _json(resp: Response) -> Any:
    with resp:
        raw = resp.read()
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise AirlockError(INVALID_RESPONSE, f"{resp.what}: response is not JSON") from e


def _fs_event(ev: Any) -> FsEvent:
    path = ev.get("path")
    if not isinstance(path, str):
        raise AirlockError(INVALID_RESPONSE, "watch: an event has no path")
    return FsEvent(type=ev["type"], path=path)

"""What the server answers, as plain dataclasses (snake_case fields, seconds and datetimes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional

from .errors import INVALID_RESPONSE, AirlockError

_UTC = timezone.utc


def _req(obj: Any, key: str, kind: type, what: str) -> Any:
    if not isinstance(obj, dict):
        raise AirlockError(INVALID_RESPONSE, f"{what}: expected an object, got {obj!r:.200}")
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise AirlockError(INVALID_RESPONSE, f"{what}: field {key!r} is missing or malformed")
    return value


def _time(value: Optional[str], what: str) -> Optional[datetime]:
    if value is None:
        return None
    try:
        # datetime.fromisoformat before 3.11 does not take the "Z" that JSON dates carry.
        return datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except (TypeError, ValueError) as e:
        raise AirlockError(INVALID_RESPONSE, f"{what}: {value!r} is not an ISO date") from e


def _str_map(value: Any, what: str) -> Dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise AirlockError(INVALID_RESPONSE, f"{what}: metadata is not a string map")
    return dict(value)


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the server sees it. ``state`` is running, paused, killed, expired or lost."""

    sandbox_id: str
    state: str
    backend: str
    created_at: datetime
    #: None: the sandbox has no TTL.
    expires_at: Optional[datetime]
    metadata: Dict[str, str] = field(default_factory=dict)
    template: Optional[str] = None
    #: Why the sandbox is ``lost`` (its supervisor died; it was killed and reaped).
    reason: Optional[str] = None

    @classmethod
    def from_json(cls, obj: Any) -> "SandboxInfo":
        what = "sandbox"
        expires = obj.get("expiresAt") if isinstance(obj, dict) else None
        template = obj.get("template") if isinstance(obj, dict) else None
        reason = obj.get("reason") if isinstance(obj, dict) else None
        return cls(
            sandbox_id=_req(obj, "id", str, what),
            state=_req(obj, "state", str, what),
            backend=_req(obj, "backend", str, what),
            created_at=_time(_req(obj, "createdAt", str, what), what),  # type: ignore[arg-type]
            expires_at=_time(expires if isinstance(expires, str) else None, what),
            metadata=_str_map(obj.get("metadata", {}), what),
            template=template if isinstance(template, str) else None,
            reason=reason if isinstance(reason, str) else None,
        )


@dataclass(frozen=True)
class CommandResult:
    """A finished command: its exit and all its output (``stdout``/``stderr`` as UTF-8 text,
    undecodable bytes replaced; the exact bytes in ``stdout_bytes``/``stderr_bytes``)."""

    #: None when a signal ended it (see ``signal``).
    exit_code: Optional[int]
    stdout_bytes: bytes
    stderr_bytes: bytes
    signal: Optional[str] = None
    #: What Airlock killed it for, if it did (e.g. timeout, output limit).
    killed_by: Optional[str] = None
    duration_ms: float = 0.0
    pid: Optional[str] = None

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class ProcessInfo:
    """A background process of a sandbox."""

    pid: str
    cmd: List[str]
    running: bool
    exit_code: Optional[int]

    @classmethod
    def from_json(cls, obj: Any) -> "ProcessInfo":
        what = "process"
        cmd = _req(obj, "cmd", list, what)
        exit_code = obj.get("exitCode")
        return cls(
            pid=_req(obj, "pid", str, what),
            cmd=[str(c) for c in cmd],
            running=_req(obj, "running", bool, what),
            exit_code=exit_code if isinstance(exit_code, int) else None,
        )


@dataclass(frozen=True)
class FileEntry:
    """A file, dir or symlink in a sandbox. ``type`` is file, dir, symlink or other."""

    name: str
    path: str
    type: str
    size: int
    mode: int
    modified_at: datetime

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_json(cls, obj: Any) -> "FileEntry":
        what = "file entry"
        mtime = _req(obj, "mtimeMs", (int, float), what)
        return cls(
            name=_req(obj, "name", str, what),
            path=_req(obj, "path", str, what),
            type=_req(obj, "type", str, what),
            size=int(_req(obj, "size", (int, float), what)),
            mode=int(_req(obj, "mode", (int, float), what)),
            modified_at=datetime.fromtimestamp(mtime / 1000, tz=_UTC),
        )


@dataclass(frozen=True)
class FsEvent:
    """A change under a watched dir: ``type`` is create, write, remove, rename or chmod."""

    type: str
    path: str


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot: create a sandbox from it with ``Sandbox.create(snapshot=info.snapshot_id)``."""

    snapshot_id: str
    backend: str
    created_at: datetime
    size_bytes: int
    parent: Optional[str]

    @classmethod
    def from_json(cls, obj: Any) -> "SnapshotInfo":
        what = "snapshot"
        parent = obj.get("parent") if isinstance(obj, dict) else None
        return cls(
            snapshot_id=_req(obj, "id", str, what),
            backend=_req(obj, "backend", str, what),
            created_at=_time(_req(obj, "createdAt", str, what), what),  # type: ignore[arg-type]
            size_bytes=int(_req(obj, "sizeBytes", (int, float), what)),
            parent=parent if isinstance(parent, str) else None,
        )


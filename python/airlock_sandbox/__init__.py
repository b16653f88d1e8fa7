"""Python SDK for an Airlock sandbox server (standard library only).

    from airlock_sandbox import Sandbox

    with Sandbox.create(ttl_seconds=300) as sbx:      # AIRLOCK_API_URL / AIRLOCK_API_KEY
        r = sbx.exec("echo hi")
        print(r.exit_code, r.stdout)
"""

from .code import CodeContext, Execution, ExecutionError, Result
from .commands import Process, Processes
from .errors import (
    AirlockError,
    ApiConnectionError,
    AuthenticationError,
    CodeDeniedError,
    ConflictError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    SandboxGoneError,
    UnavailableError,
)
from .files import Files
from .models import CommandResult, FileEntry, FsEvent, ProcessInfo, SandboxInfo, SnapshotInfo
from .sandbox import Sandbox
from .templates import Template, TemplateInfo
from ._transport import Stream, __version__

__all__ = [
    "AirlockError",
    "ApiConnectionError",
    "AuthenticationError",
    "CodeContext",
    "CodeDeniedError",
    "Execution",
    "ExecutionError",
    "Result",
    "CommandResult",
    "ConflictError",
    "FileEntry",
    "Files",
    "FsEvent",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Process",
    "ProcessInfo",
    "Processes",
    "RateLimitError",
    "Sandbox",
    "SandboxGoneError",
    "SandboxInfo",
    "SnapshotInfo",
    "Stream",
    "Template",
    "TemplateInfo",
    "UnavailableError",
    "__version__",
]

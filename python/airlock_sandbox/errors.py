"""One exception hierarchy for every failure, carrying the server's stable error code.

Every error the server answers is ``{"error": {"code", "message", "field"?}}``; the SDK raises the
subclass of :class:`AirlockError` that matches the code (or, for a code this SDK does not know yet,
the HTTP status), so callers branch on the class or on ``e.code``, never on message text.
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class AirlockError(Exception):
    """An error from an Airlock server (or from this SDK) with a stable string ``code``.

    ``field`` names the offending request field for bad-input errors; ``status`` is the HTTP status
    the server answered (``None`` for errors raised before or without a response).
    """

    def __init__(
        self,
        code: str,
        message: str,
        field: Optional[str] = None,
        status: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.status = status

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"field={self.field!r}, status={self.status!r})"
        )


class InvalidArgumentError(AirlockError):
    """The request was malformed: ``field`` names what to fix (HTTP 400)."""


class AuthenticationError(AirlockError):
    """Missing or wrong API key (HTTP 401)."""


class PermissionDeniedError(AirlockError):
    """The server refused the request (HTTP 403)."""


class NotFoundError(AirlockError):
    """No such sandbox, file, snapshot or template (HTTP 404), or another tenant's."""


class SandboxGoneError(NotFoundError):
    """The sandbox existed but is gone (killed, expired or lost) (HTTP 410)."""


class ConflictError(AirlockError):
    """The sandbox or snapshot is in a state that forbids the call, e.g. paused (HTTP 409)."""


class PayloadTooLargeError(AirlockError):
    """A body, upload or file exceeds the server's cap (HTTP 413)."""


class RateLimitError(AirlockError):
    """A quota or the host is full (HTTP 429); ``retry_after`` is in seconds, when the server said."""

    def __init__(
        self,
        code: str,
        message: str,
        field: Optional[str] = None,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(code, message, field, status)
        self.retry_after = retry_after


class UnavailableError(AirlockError):
    """The server cannot serve this now: a backend or capacity is missing (HTTP 503)."""


class InternalError(AirlockError):
    """The server failed (HTTP 5xx)."""


class CodeDeniedError(AirlockError):
    """The server's static analysis denied the code before it ran (HTTP 422): nothing ran.

    ``findings`` lists what it found (each a dict with ``rule``, ``severity``, ``reason``, ``line``,
    ``column``, ``snippet`` and ``action``); the denying ones have action ``deny``.
    """

    findings: "list" = []


class ApiConnectionError(AirlockError):
    """The server could not be reached, or a response or stream broke off (code ``CONNECTION_FAILED``)."""


#: Client-side code for a transport failure (no server answer, or a stream cut short).
CONNECTION_FAILED = "CONNECTION_FAILED"
#: Client-side code for a response that does not follow the API (a bug or a proxy in the way).
INVALID_RESPONSE = "INVALID_RESPONSE"

_BY_CODE: Dict[str, Type[AirlockError]] = {
    "INVALID_SPEC": InvalidArgumentError,
    "INVALID_ARGUMENT": InvalidArgumentError,
    "UNAUTHORIZED": AuthenticationError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "SANDBOX_NOT_FOUND": NotFoundError,
    "FILE_NOT_FOUND": NotFoundError,
    "SNAPSHOT_NOT_FOUND": NotFoundError,
    "TEMPLATE_NOT_FOUND": NotFoundError,
    "PROCESS_NOT_FOUND": NotFoundError,
    "SANDBOX_GONE": SandboxGoneError,
    "SANDBOX_PAUSED": ConflictError,
    "SNAPSHOT_IN_USE": ConflictError,
    "FILE_TOO_LARGE": PayloadTooLargeError,
    "REQUEST_TOO_LARGE": PayloadTooLargeError,
    "BACKEND_UNAVAILABLE": UnavailableError,
    "CAPACITY_EXHAUSTED": UnavailableError,
    "CODE_DENIED": CodeDeniedError,
    "CODE_CONTEXT_NOT_FOUND": NotFoundError,
    "INTERNAL": InternalError,
    CONNECTION_FAILED: ApiConnectionError,
}

_BY_STATUS: Dict[int, Type[AirlockError]] = {
    400: InvalidArgumentError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    410: SandboxGoneError,
    413: PayloadTooLargeError,
    429: RateLimitError,
    503: UnavailableError,
}


def error_for(
    code: str,
    message: str,
    field: Optional[str] = None,
    status: Optional[int] = None,
    retry_after: Optional[float] = None,
) -> AirlockError:
    """The exception for a server error: by its code, else (a code newer than this SDK) its status."""
    cls = _BY_CODE.get(code)
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status, InternalError if status >= 500 else AirlockError)
    if cls is None:
        cls = AirlockError
    if status == 429 or cls is RateLimitError:
        return RateLimitError(code, message, field, status, retry_after)
    return cls(code, message, field, status)

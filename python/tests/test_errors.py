"""Errors: every failure is an AirlockError subclass with the server's code (and field for bad
input); ids cannot address another route; malformed or cut-off answers are typed too."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from typing import Iterator

import pytest

from airlock_sandbox import (
    AirlockError,
    ApiConnectionError,
    ConflictError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    Sandbox,
)
from airlock_sandbox._transport import Transport
from airlock_sandbox.errors import error_for

UNKNOWN = "sbx-0000000000000000"


def test_an_unknown_sandbox_is_not_found_for_every_call(api):
    ghost = Sandbox(Transport(**api), _info(UNKNOWN))
    calls = [
        lambda: Sandbox.connect(UNKNOWN, **api),
        ghost.get_info,
        ghost.kill,
        lambda: ghost.set_timeout(60),
        ghost.pause,
        lambda: ghost.exec("true"),
        lambda: ghost.exec("true", background=True),
        ghost.processes.list,
        lambda: ghost.files.read("/workspace/x"),
        lambda: ghost.files.write("/workspace/x", b"data"),
        lambda: ghost.files.list("/workspace"),
        lambda: ghost.files.exists("/workspace"),
        ghost.snapshot,
    ]
    for call in calls:
        with pytest.raises(NotFoundError) as e:
            call()
        assert (e.value.code, e.value.status) == ("SANDBOX_NOT_FOUND", 404), call


def _info(sandbox_id: str):
    from airlock_sandbox import SandboxInfo
    from datetime import datetime, timezone

    return SandboxInfo(sandbox_id, "running", "namespaces", datetime.now(timezone.utc), None)


@pytest.mark.parametrize("bad", ["", ".", ".."])
def test_an_id_that_is_not_one_segment_is_refused_before_any_request(bad):
    # No server at all: the refusal happens in the SDK, so it cannot reach another route.
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.connect(bad, api_url="http://127.0.0.1:9")
    assert e.value.field == "sandbox_id"


def test_an_id_with_a_slash_stays_one_segment(api, shared):
    # Not /v1/sandboxes/<real id>/... : the slash is encoded, so this is an unknown id.
    with pytest.raises(NotFoundError):
        Sandbox.connect(f"{shared.sandbox_id}/processes", **api)
    with pytest.raises(NotFoundError):
        Sandbox.connect(f"../sandboxes/{shared.sandbox_id}", **api)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"ttl_seconds": 0.5}, "ttlMs"),
        ({"backend": "docker"}, "backend"),
        ({"memory_bytes": -1}, "limits.memoryBytes"),
        ({"secrets": [{"name": "BAD NAME", "value": "v", "hosts": ["api.example.com"]}]}, "secrets.0.name"),
        # A secret from the server's own environment is not something a client may ask for.
        (
            {"secrets": [{"name": "S", "value": {"env": "HOME"}, "hosts": ["api.example.com"]}]},
            "secrets.0.value",
        ),
        ({"queue_timeout_seconds": 3600}, "queueTimeoutMs"),
    ],
)
def test_bad_create_input_names_the_field(api, kwargs, field):
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create(**kwargs, **api)
    assert e.value.code == "INVALID_SPEC"
    assert e.value.field == field
    assert e.value.status == 400


def test_ttl_given_as_something_else_than_seconds_is_refused_in_the_sdk(api):
    for bad in ("300", True, None.__class__):
        with pytest.raises(InvalidArgumentError) as e:
            Sandbox.create(ttl_seconds=bad, **api)  # type: ignore[arg-type]
        assert e.value.field == "ttl_seconds"


def test_a_json_body_over_the_cap_is_refused(api):
    # scripts/test-server.ts caps JSON bodies at 256 KiB.
    with pytest.raises(PayloadTooLargeError) as e:
        Sandbox.create(env={"BIG": "x" * (300 * 1024)}, **api)
    assert (e.value.code, e.value.status) == ("REQUEST_TOO_LARGE", 413)


def test_an_unknown_process_is_not_found(shared):
    with pytest.raises(NotFoundError) as e:
        shared.processes.kill("999999")
    assert e.value.code == "PROCESS_NOT_FOUND"
    with pytest.raises(NotFoundError) as e:
        shared.processes.connect("999999")
    assert e.value.code == "PROCESS_NOT_FOUND"


def test_an_unknown_template_is_not_found(api):
    with pytest.raises(NotFoundError) as e:
        Sandbox.create(template="no-such-template", **api)
    assert e.value.code == "TEMPLATE_NOT_FOUND"


def test_private_network_needs_the_operator(api):
    with pytest.raises(PermissionDeniedError) as e:
        Sandbox.create(network={"allowPrivate": ["10.0.0.0/8"]}, **api)
    assert e.value.field == "network.allowPrivate"


def test_nothing_is_left_by_failed_creates(api):
    before = {s.sandbox_id for s in Sandbox.list(**api)}
    for _ in range(3):
        with pytest.raises(InvalidArgumentError):
            Sandbox.create(ttl_seconds=0.1, **api)
    assert {s.sandbox_id for s in Sandbox.list(**api)} == before


def test_an_unreachable_server_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
    with pytest.raises(ApiConnectionError) as e:
        Sandbox.list(api_url=f"http://127.0.0.1:{port}")
    assert e.value.code == "CONNECTION_FAILED"


def test_codes_map_to_classes_and_new_codes_fall_back_on_the_status():
    assert type(error_for("SANDBOX_PAUSED", "m", status=409)) is ConflictError
    assert type(error_for("QUOTA_EXCEEDED", "m", status=429, retry_after=2.0)) is RateLimitError
    assert error_for("QUOTA_EXCEEDED", "m", status=429, retry_after=2.0).retry_after == 2.0
    assert type(error_for("SOMETHING_NEW", "m", status=404)) is NotFoundError
    assert type(error_for("SOMETHING_NEW", "m", status=502)) is InternalError
    assert type(error_for("SOMETHING_NEW", "m", status=418)) is AirlockError
    e = error_for("INVALID_SPEC", "bad ttl", field="ttlMs", status=400)
    assert str(e) == "INVALID_SPEC: bad ttl (field ttlMs)"


# ---- a misbehaving server: the SDK's own defences (the real server cannot produce these) --------


class _Bad(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path.endswith("/exec"):
            # A stream that breaks off before its exit event.
            body = json.dumps({"type": "stdout", "data": "aGk="}).encode() + b"\n"
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            body = b"<html>Bad Gateway</html>"
            self.send_response(502)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_GET(self) -> None:
        body = b'{"not": "a list"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def bad_server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Bad)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_non_json_error_answer_is_typed_by_its_status(bad_server):
    with pytest.raises(InternalError) as e:
        Sandbox.create(api_url=bad_server)
    assert e.value.status == 502 and e.value.code == "HTTP_502"
    assert "Bad Gateway" in e.value.message


def test_a_malformed_answer_is_an_invalid_response(bad_server):
    with pytest.raises(AirlockError) as e:
        Sandbox.list(api_url=bad_server)
    assert e.value.code == "INVALID_RESPONSE"


def test_a_stream_cut_before_exit_is_a_connection_error(bad_server):
    ghost = Sandbox(Transport(api_url=bad_server), _info("sbx-x"))
    seen = []
    with pytest.raises(ApiConnectionError):
        ghost.exec("true", on_stdout=seen.append)
    assert seen == ["hi"]

"""Sandbox life cycle through the SDK against a real server: create, info, list, connect, timeout,
pause/resume, snapshot and fork, kill, and the context manager."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from airlock_sandbox import (
    AuthenticationError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    SandboxInfo,
)


def test_create_reports_the_sandbox_as_running_with_its_deadline_and_metadata(api):
    before = datetime.now(timezone.utc)
    with Sandbox.create(ttl_seconds=120, metadata={"owner": "py", "k": "v w"}, **api) as sbx:
        info = sbx.info
        assert isinstance(info, SandboxInfo)
        assert info.sandbox_id == sbx.sandbox_id == sbx.id
        assert info.state == "running"
        assert info.backend == "namespaces"
        assert info.metadata == {"owner": "py", "k": "v w"}
        assert info.expires_at is not None
        # The deadline is the TTL after creation (not some default).
        assert abs(info.expires_at - info.created_at - timedelta(seconds=120)) < timedelta(seconds=2)
        assert info.created_at > before - timedelta(seconds=5)  # the server's clock is this host's
        assert sbx.get_info() == info
        assert sbx.is_running()


def test_connect_reaches_the_same_sandbox_and_its_files(api):
    with Sandbox.create(**api) as sbx:
        sbx.files.write("/workspace/mark", "from the first handle")
        other = Sandbox.connect(sbx.sandbox_id, **api)
        assert other.sandbox_id == sbx.sandbox_id
        assert other.files.read("/workspace/mark") == "from the first handle"
        assert other.exec("cat /workspace/mark").stdout == "from the first handle"


def test_list_filters_by_every_metadata_pair(api):
    tag = uuid.uuid4().hex
    with Sandbox.create(metadata={"run": tag, "role": "a"}, **api) as a, Sandbox.create(
        metadata={"run": tag, "role": "b"}, **api
    ) as b:
        ids = {s.sandbox_id for s in Sandbox.list(metadata={"run": tag}, **api)}
        assert ids == {a.sandbox_id, b.sandbox_id}
        only_b = Sandbox.list(metadata={"run": tag, "role": "b"}, **api)
        assert [s.sandbox_id for s in only_b] == [b.sandbox_id]
        assert Sandbox.list(metadata={"run": tag, "role": "c"}, **api) == []
        # A value with characters that mean something in a query string is matched exactly.
        assert Sandbox.list(metadata={"run": tag + "&role=a"}, **api) == []
        everything = {s.sandbox_id for s in Sandbox.list(**api)}
        assert {a.sandbox_id, b.sandbox_id} <= everything


def test_set_timeout_moves_the_deadline(sbx):
    first = sbx.info.expires_at
    assert first is not None
    later = sbx.set_timeout(3000)
    assert later.expires_at is not None and later.expires_at > first + timedelta(seconds=2000)
    sooner = sbx.set_timeout(30)
    assert sooner.expires_at is not None and sooner.expires_at < first
    assert sbx.get_info().expires_at == sooner.expires_at


def test_kill_ends_the_sandbox_for_every_handle(api):
    sbx = Sandbox.create(**api)
    other = Sandbox.connect(sbx.sandbox_id, **api)
    sbx.kill()
    assert not sbx.is_running()
    # The library forgets a killed sandbox (SANDBOX_NOT_FOUND); `airlock serve` remembers it
    # (SANDBOX_GONE, a NotFoundError too, and GET shows it as killed).
    gone = ("SANDBOX_NOT_FOUND", "SANDBOX_GONE")
    with pytest.raises(NotFoundError) as e:
        other.exec("true")
    assert e.value.code in gone
    with pytest.raises(NotFoundError) as e:
        sbx.kill()
    assert e.value.code in gone
    try:
        assert Sandbox.connect(sbx.sandbox_id, **api).info.state == "killed"
    except NotFoundError as e:
        assert e.code in gone
    running = {s.sandbox_id for s in Sandbox.list(**api) if s.state == "running"}
    assert sbx.sandbox_id not in running


def test_context_manager_kills_the_sandbox_when_the_body_raises(api):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with Sandbox.create(**api) as sbx:
            sbx_id = sbx.sandbox_id
            sbx.exec("true")
            raise Boom()
    assert not _running(sbx_id, api)


def _running(sandbox_id, api) -> bool:
    """Unknown to the server, or known (`airlock serve` keeps killed ones) but not running."""
    try:
        return Sandbox.connect(sandbox_id, **api).info.state == "running"
    except NotFoundError:
        return False


def test_context_manager_tolerates_a_sandbox_killed_inside_it(api):
    with Sandbox.create(**api) as sbx:
        sbx.kill()
    assert not sbx.is_running()


def test_env_variables_name_the_server_and_key(api, monkeypatch):
    monkeypatch.setenv("AIRLOCK_API_URL", api["api_url"])
    monkeypatch.setenv("AIRLOCK_API_KEY", api["api_key"])
    with Sandbox.create() as sbx:
        assert sbx.api_url == api["api_url"]
        assert sbx.sandbox_id in {s.sandbox_id for s in Sandbox.list()}
        assert Sandbox.connect(sbx.sandbox_id).exec("echo env").stdout == "env\n"


def test_no_server_configured_says_how_to_set_one(monkeypatch):
    monkeypatch.delenv("AIRLOCK_API_URL", raising=False)
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create()
    assert e.value.field == "api_url" and "AIRLOCK_API_URL" in e.value.message
    with pytest.raises(InvalidArgumentError):
        Sandbox.list(api_url="ftp://example.com")


def test_a_wrong_or_missing_key_is_refused(api, monkeypatch):
    monkeypatch.delenv("AIRLOCK_API_KEY", raising=False)
    for key in ("not-the-key", ""):
        with pytest.raises(AuthenticationError) as e:
            Sandbox.create(api_url=api["api_url"], api_key=key)
        assert e.value.code == "UNAUTHORIZED" and e.value.status == 401


def test_pause_refuses_exec_until_resume(sbx):
    sbx.files.write("/workspace/kept", "state")
    assert sbx.pause().state == "paused"
    assert sbx.get_info().state == "paused"
    with pytest.raises(ConflictError) as e:
        sbx.exec("true")
    assert e.value.code == "SANDBOX_PAUSED"
    assert sbx.resume().state == "running"
    assert sbx.exec("cat /workspace/kept").stdout == "state"


def test_snapshot_then_create_from_it_forks_the_files(api, sbx):
    sbx.files.write("/workspace/from-parent.txt", "parent data")
    snap = sbx.snapshot()
    assert snap.snapshot_id in {s.snapshot_id for s in Sandbox.list_snapshots(**api)}
    try:
        with Sandbox.create(snapshot=snap.snapshot_id, **api) as fork:
            assert fork.sandbox_id != sbx.sandbox_id
            assert fork.files.read("/workspace/from-parent.txt") == "parent data"
            fork.files.write("/workspace/from-parent.txt", "changed in the fork")
            assert sbx.files.read("/workspace/from-parent.txt") == "parent data"
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id, **api)
    assert snap.snapshot_id not in {s.snapshot_id for s in Sandbox.list_snapshots(**api)}
    with pytest.raises(NotFoundError) as e:
        Sandbox.delete_snapshot(snap.snapshot_id, **api)
    assert e.value.code == "SNAPSHOT_NOT_FOUND"


def test_the_egress_event_stream_opens_and_closes(api, sbx):
    with sbx.egress_events() as events:
        assert events is not None
    assert list(events) == []
    ghost = Sandbox.connect(sbx.sandbox_id, **api)
    sbx.kill()
    with pytest.raises(NotFoundError):
        ghost.egress_events()


def test_limits_and_a_literal_secret_reach_the_sandbox_as_a_sentinel(api):
    """The secret's value never enters the sandbox: it sees a sentinel, swapped for the value only
    in traffic to the secret's hosts (no traffic is sent here)."""
    with Sandbox.create(
        memory_bytes=256 * 1024 * 1024,
        cpus=1,
        pids=64,
        network={"allow": ["api.example.com"]},
        secrets=[{"name": "TOKEN", "value": "s3cr3t-value", "hosts": ["api.example.com"]}],
        **api,
    ) as sbx:
        seen = sbx.exec(["printenv", "TOKEN"]).stdout.strip()
        assert seen and "s3cr3t-value" not in seen
        assert sbx.exec("grep -rs s3cr3t-value /proc/self/environ /workspace /tmp").exit_code == 1


def test_create_with_env_sets_it_for_commands(api):
    with Sandbox.create(env={"GREETING": "hello $USER; `id`"}, **api) as sbx:
        assert sbx.exec(["printenv", "GREETING"]).stdout == "hello $USER; `id`\n"

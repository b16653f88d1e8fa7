"""What only `airlock serve` does (tenants, quotas), through the SDK. These run when the suite is
pointed at a running server (AIRLOCK_TEST_SERVER_URL/_KEY) with keys of two more tenants:
AIRLOCK_TEST_SERVER_OTHER_KEY (another tenant) and AIRLOCK_TEST_SERVER_ONE_KEY (a tenant whose quota
is one live sandbox). The launcher the suite starts by default has no tenants."""

from __future__ import annotations

import os

import pytest

from airlock_sandbox import NotFoundError, RateLimitError, Sandbox
from airlock_sandbox._transport import Transport

OTHER = os.environ.get("AIRLOCK_TEST_SERVER_OTHER_KEY")
ONE = os.environ.get("AIRLOCK_TEST_SERVER_ONE_KEY")


@pytest.mark.skipif(
    not OTHER, reason="needs AIRLOCK_TEST_SERVER_OTHER_KEY (a second tenant of airlock serve)"
)
def test_another_tenants_sandbox_answers_exactly_like_an_unknown_one(api, shared):
    other = {"api_url": api["api_url"], "api_key": OTHER}
    unknown = "sbx-0123456789abcdef"
    for sandbox_id in (shared.sandbox_id, unknown):
        with pytest.raises(NotFoundError) as e:
            Sandbox.connect(sandbox_id, **other)
        assert (e.value.code, e.value.status) == ("SANDBOX_NOT_FOUND", 404)
    with pytest.raises(NotFoundError) as mine:
        Sandbox.connect(shared.sandbox_id, **other)
    with pytest.raises(NotFoundError) as none:
        Sandbox.connect(unknown, **other)
    # The message names the id asked for and nothing else about it (no oracle).
    assert mine.value.message.replace(shared.sandbox_id, "ID") == none.value.message.replace(
        unknown, "ID"
    )
    assert shared.sandbox_id not in {s.sandbox_id for s in Sandbox.list(**other)}
    ghost = Sandbox(Transport(**other), shared.info)
    for call in (lambda: ghost.exec("true"), lambda: ghost.files.read("/workspace/x"), ghost.kill):
        with pytest.raises(NotFoundError):
            call()
    assert shared.exec("echo still mine").stdout == "still mine\n"


@pytest.mark.skipif(not ONE, reason="needs AIRLOCK_TEST_SERVER_ONE_KEY (a tenant with maxSandboxes: 1)")
def test_a_create_over_the_quota_waits_then_is_a_rate_limit_error(api):
    one = {"api_url": api["api_url"], "api_key": ONE}
    with Sandbox.create(**one):
        with pytest.raises(RateLimitError) as e:
            Sandbox.create(queue_timeout_seconds=0.2, **one)
        assert e.value.status == 429
        assert e.value.retry_after is not None and e.value.retry_after >= 0
    # The quota frees with the kill.
    with Sandbox.create(**one) as again:
        assert again.exec("true").ok

"""set_network_policy: a live sandbox's policy changes on the server; bad input is a typed error.

Only the sandbox's own DNS responder (127.0.0.1:53 inside its netns) is asked: no traffic leaves.
"""

from __future__ import annotations

from typing import Dict

import pytest

from airlock_sandbox import InvalidArgumentError, Sandbox

RESOLVE = 'a=$(getent hosts example.com) && echo "${a%% *}" || echo none'


def test_set_network_policy_changes_what_the_sandbox_may_reach(api: Dict[str, str]):
    with Sandbox.create(ttl_seconds=300, network={"allow": []}, **api) as sbx:
        assert sbx.exec(RESOLVE).stdout.strip() == "none"
        now = sbx.set_network_policy({"allow": ["example.com"]})
        assert now == {"allow": ["example.com"], "deny": [], "transparent": True, "allowPrivate": []}
        assert sbx.exec(RESOLVE).stdout.strip().startswith("198.1")
        sbx.set_network_policy({"allow": []})
        assert sbx.exec(RESOLVE).stdout.strip() == "none"
        with pytest.raises(InvalidArgumentError):
            sbx.set_network_policy({"allow": ["*"]})


def test_a_sandbox_without_network_refuses_with_what_to_do(sbx: Sandbox):
    with pytest.raises(InvalidArgumentError) as e:
        sbx.set_network_policy({"allow": ["example.com"]})
    assert "create it with a network policy" in str(e.value)

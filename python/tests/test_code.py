"""run_code and code contexts through the SDK: results, streaming, state, errors, timeouts."""

from __future__ import annotations

import base64
from typing import List

import pytest

from airlock_sandbox import CodeContext, Execution, InvalidArgumentError, NotFoundError, Result


def test_run_code_returns_the_last_value_stdout_and_streams(shared):
    seen: List[str] = []
    results: List[Result] = []
    ex = shared.run_code(
        'print("hi")\ndisplay([1, 2])\n6 * 7', on_stdout=seen.append, on_result=results.append
    )
    assert isinstance(ex, Execution)
    assert (ex.stdout, ex.stderr, ex.error, ex.text) == ("hi\n", "", None, "42")
    assert "".join(seen) == "hi\n"
    assert [r.is_main_result for r in results] == [False, True]
    assert [r.text for r in ex.results] == ["[1, 2]", "42"]


def test_the_codes_own_error_is_the_execution_error(shared):
    ex = shared.run_code("{}['missing']")
    assert ex.error is not None
    assert ex.error.name == "KeyError"
    assert "missing" in ex.error.traceback


def test_contexts_keep_state_and_are_independent(shared):
    a = shared.create_code_context("javascript")
    b = shared.create_code_context(language="bash", cwd="/tmp")
    assert isinstance(a, CodeContext) and a.language == "javascript"
    shared.run_code("globalThis.n = 5", context=a)
    assert shared.run_code("n * 2", context=a).text == "10"
    assert shared.run_code("pwd; X=1", context=b).stdout == "/tmp\n"
    assert shared.run_code("echo ${X}", context=b).stdout == "1\n"
    assert {c.id for c in shared.list_code_contexts()} >= {a.id, b.id}
    with pytest.raises(InvalidArgumentError):
        shared.run_code("1", language="python", context=a)
    shared.close_code_context(a)
    shared.close_code_context(b.id)
    with pytest.raises(NotFoundError) as e:
        shared.run_code("n", context=a)
    assert e.value.code == "CODE_CONTEXT_NOT_FOUND"


def test_matplotlib_figure_is_a_png_and_a_timeout_loses_state(shared):
    ex = shared.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])", timeout_seconds=120)
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    ctx = shared.create_code_context()
    shared.run_code("kept = 1", context=ctx)
    slow = shared.run_code("import time\ntime.sleep(600)", context=ctx, timeout_seconds=1)
    assert slow.error is not None and slow.error.name == "TimeoutError"
    assert shared.run_code("kept", context=ctx).error.name == "NameError"


def test_a_denied_run_raises_code_denied_with_findings(shared):
    from airlock_sandbox import CodeDeniedError

    code = 'import base64\nexec(base64.b64decode("cHJpbnQoMSk="))'
    with pytest.raises(CodeDeniedError) as caught:
        shared.run_code(code, policy={"rules": {"obfuscated-exec": "deny"}})
    assert caught.value.status == 422
    assert any(f["rule"] == "obfuscated-exec" for f in caught.value.findings)

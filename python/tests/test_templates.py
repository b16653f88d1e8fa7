"""Templates through the SDK against a real server: Template.build with a progress callback (events
in order, step output decoded), a sandbox created from it, list/get/delete, and a failing step or a
bad definition raised as typed errors naming the field."""

from __future__ import annotations

import time
import uuid

import pytest

from airlock_sandbox import (
    AirlockError,
    InvalidArgumentError,
    NotFoundError,
    Sandbox,
    Template,
    TemplateInfo,
)


def test_build_reports_progress_in_order_and_sandboxes_start_from_it(api):
    name = f"py-{uuid.uuid4().hex[:8]}"
    events = []
    info = Template.build(
        name,
        files={"greeting.txt": f"hello {name}\n"},
        steps=["cat /workspace/greeting.txt", ["sh", "-c", "cp /workspace/greeting.txt /workspace/copy.txt"]],
        on_progress=events.append,
        **api,
    )
    try:
        assert isinstance(info, TemplateInfo)
        assert info.name == name
        assert info.digest.startswith("sha256:")
        kinds = [e["type"] for e in events if e["type"] != "step-output"]
        assert kinds == [
            "start",
            "files",
            "step-started",
            "step-finished",
            "step-started",
            "step-finished",
            "layer",
            "done",
        ]
        out = b"".join(e["output"] for e in events if e["type"] == "step-output" and e["index"] == 0)
        assert out == f"hello {name}\n".encode()
        finished = [e for e in events if e["type"] == "step-finished"]
        assert [(e["index"], e["exitCode"]) for e in finished] == [(0, 0), (1, 0)]
        assert all(e["durationMs"] >= 0 for e in finished)

        assert name in [t.name for t in Template.list(**api)]
        assert Template.get(name, **api).digest == info.digest
        with Sandbox.create(template=name, ttl_seconds=120, **api) as sbx:
            assert sbx.exec("cat /workspace/copy.txt").stdout == f"hello {name}\n"
    finally:
        Template.delete(name, **api)
    with pytest.raises(NotFoundError):
        Template.get(name, **api)


def test_a_failing_step_raises_naming_the_step_and_keeps_nothing(api):
    name = f"py-bad-{uuid.uuid4().hex[:8]}"
    with pytest.raises(AirlockError) as e:
        Template.build(name, steps=["true", "echo broken >&2; exit 4"], **api)
    assert e.value.code == "TEMPLATE_BUILD_FAILED"
    assert e.value.field == "steps.1"
    assert "broken" in str(e.value)
    with pytest.raises(NotFoundError):
        Template.get(name, **api)


def test_bad_definitions_are_invalid_argument_errors_naming_the_field(api):
    with pytest.raises(InvalidArgumentError) as e:
        Template.build("py-x", files=[{"path": "a", "from": "/etc/shadow"}], **api)
    assert e.value.field == "files.0.from"
    with pytest.raises(InvalidArgumentError) as e:
        Template.build("py-x", files={"/etc/passwd": "x"}, **api)
    assert e.value.field == "files.0.path"
    with pytest.raises(InvalidArgumentError) as e:
        Template.build("Not A Name", **api)
    assert e.value.field == "name"


def test_a_progress_callback_that_raises_ends_the_build(api):
    name = f"py-cb-{uuid.uuid4().hex[:8]}"

    def stop(ev):
        if ev["type"] == "step-started":
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError):
        Template.build(name, steps=["sleep 600"], on_progress=stop, **api)
    # The server cancels the build once it sees the client gone: its build sandbox (labelled with
    # the template's name) goes, well before the step's 600 s.
    deadline = time.monotonic() + 60
    while Sandbox.list({"airlock.template": name}, **api):
        assert time.monotonic() < deadline, "the cancelled build's sandbox is still there"
        time.sleep(0.1)
    with pytest.raises(NotFoundError):
        Template.get(name, **api)

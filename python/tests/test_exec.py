"""Commands through the SDK: results, streaming (order, callbacks before exit, UTF-8 split across
chunks), stdin, timeouts, background processes, and a client that leaves mid-stream."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest

from airlock_sandbox import CommandResult, InvalidArgumentError, NotFoundError, Process, Sandbox


def _until(check, what: str, within: float = 30.0) -> None:
    """Poll ``check`` until true (a condition to wait for, not a timing assertion)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.1)


def test_exec_returns_exit_code_stdout_and_stderr_apart(shared):
    r = shared.exec("echo out; echo err >&2; exit 7")
    assert isinstance(r, CommandResult)
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert not r.ok
    assert shared.exec("true").ok


def test_an_argv_list_is_not_run_by_a_shell(shared):
    r = shared.exec(["printf", "%s|", "$HOME", "a b", "; echo injected", "`id`"])
    assert r.stdout == "$HOME|a b|; echo injected|`id`|"


def test_cwd_env_and_stdin(shared):
    shared.files.make_dir("/workspace/sub dir")
    r = shared.exec("pwd; printf '%s' \"$X\"; cat", cwd="/workspace/sub dir", env={"X": "é'\""}, stdin="in\n")
    assert r.stdout == "/workspace/sub dir\né'\"in\n"


def test_streaming_delivers_output_in_order_and_before_the_command_ends(shared):
    """The command waits for a file the on_stdout callback writes: only a live stream lets it
    finish with 'saw go' (a buffered one would deliver 'ready' after it gave up)."""
    shared.files.remove("/tmp/go") if shared.files.exists("/tmp/go") else None
    got: List[str] = []

    def on_stdout(text: str) -> None:
        got.append(text)
        if "ready" in "".join(got) and not shared.files.exists("/tmp/go"):
            shared.files.write("/tmp/go", "")

    script = (
        "seq 1 300; echo ready; "
        "i=0; while [ ! -e /tmp/go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
        "[ -e /tmp/go ] && echo 'saw go'"
    )
    r = shared.exec(script, on_stdout=on_stdout)
    assert r.exit_code == 0, r.stderr
    expected = "".join(f"{i}\n" for i in range(1, 301)) + "ready\nsaw go\n"
    assert "".join(got) == expected == r.stdout


def test_stderr_streams_to_its_own_callback(shared):
    out: List[str] = []
    err: List[str] = []
    r = shared.exec(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; done", on_stdout=out.append, on_stderr=err.append
    )
    assert "".join(out) == "o1\no2\no3\n" == r.stdout
    assert "".join(err) == "e1\ne2\ne3\n" == r.stderr


def test_a_character_split_across_chunks_reaches_the_callback_whole(shared):
    pieces: List[str] = []
    # The euro sign's three bytes leave in two writes, a pause apart (likely two chunks).
    r = shared.exec(["sh", "-c", "printf '\\342\\202'; sleep 0.3; printf '\\254!'"], on_stdout=pieces.append)
    assert r.stdout_bytes == "€!".encode()
    assert "".join(pieces) == "€!"
    assert all("\ufffd" not in p for p in pieces)


def test_output_that_is_not_utf8_is_kept_exactly(shared):
    r = shared.exec(["sh", "-c", "printf '\\377\\376\\000\\200'"])
    assert r.stdout_bytes == b"\xff\xfe\x00\x80"
    assert r.stdout == "\ufffd\ufffd\x00\ufffd"


def test_max_output_bytes_caps_what_is_kept(shared):
    r = shared.exec("yes | head -c 100000", max_output_bytes=1000)
    assert 0 < len(r.stdout_bytes) <= 1000
    assert set(r.stdout_bytes) <= set(b"y\n")


def test_python_in_the_sandbox(shared):
    r = shared.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a", "b c"])
    assert r.stdout == "['a', 'b c']\n"


def test_a_timeout_kills_the_command(shared):
    r = shared.exec("echo started; sleep 60", timeout_seconds=1)
    assert r.stdout == "started\n"
    assert r.exit_code != 0
    assert r.killed_by is not None


def test_a_callback_that_raises_leaves_and_the_server_kills_the_command(shared):
    """The looping command holds a lock while it lives (each exec has its own pid namespace, so
    the lock, not a pid, tells whether it still runs): once the client leaves, the lock frees."""
    shared.exec("rm -f /tmp/looper.lock /tmp/looper.started")

    class Stop(Exception):
        pass

    def on_stdout(text: str) -> None:
        raise Stop()

    with pytest.raises(Stop):
        shared.exec(
            "exec flock /tmp/looper.lock sh -c "
            "'touch /tmp/looper.started; while true; do echo tick; sleep 0.2; done'",
            on_stdout=on_stdout,
        )
    assert shared.files.exists("/tmp/looper.started")
    _until(
        lambda: shared.exec("flock -n /tmp/looper.lock true").exit_code == 0,
        "the abandoned command is killed (its lock is free)",
    )


def test_background_process_runs_until_killed(shared):
    p = shared.exec("sleep 300", background=True)
    assert isinstance(p, Process)
    listed = {i.pid: i for i in shared.processes.list()}
    assert listed[p.pid].running
    assert listed[p.pid].cmd[-1] == "sleep 300"
    p.kill()
    r = p.wait()
    assert r.exit_code != 0 and r.signal == "SIGKILL"
    assert not p.info().running


def test_background_output_is_kept_for_a_later_wait(shared):
    p = shared.exec("echo a; echo b >&2; exit 3", background=True)
    r = p.wait()
    assert (r.exit_code, r.stdout, r.stderr) == (3, "a\n", "b\n")
    # A second wait (or another client) sees the same kept output.
    assert shared.processes.connect(p.pid).wait().stdout == "a\n"


def test_background_callbacks_stream_on_their_own_thread(shared):
    lines: List[str] = []
    p = shared.exec("for i in 1 2 3; do echo $i; done", background=True, on_stdout=lines.append)
    r = p.wait()
    assert "".join(lines) == "1\n2\n3\n" == r.stdout
    with pytest.raises(InvalidArgumentError):
        p.wait(on_stdout=print)


def test_stdin_of_a_background_process_takes_text_and_bytes_then_eof(shared):
    p = shared.exec("cat", background=True)
    p.send_stdin("line\n")
    p.send_stdin(b"\x00\xff\n")
    p.close_stdin()
    r = p.wait()
    assert r.exit_code == 0
    assert r.stdout_bytes == b"line\n\x00\xff\n"


def test_stdin_of_a_finished_process_is_refused_with_its_field(shared):
    p = shared.exec("true", background=True)
    assert p.wait().ok
    with pytest.raises(InvalidArgumentError) as e:
        p.send_stdin("too late")
    assert e.value.field == "pid"


def test_a_background_callback_that_raises_surfaces_in_wait(shared):
    class Bad(Exception):
        pass

    def on_stdout(text: str) -> None:
        raise Bad()

    p = shared.exec("echo x; sleep 300", background=True, on_stdout=on_stdout)
    try:
        with pytest.raises(Bad):
            p.wait()
    finally:
        p.kill()


def test_another_handle_connects_to_a_running_process(api, shared):
    p = shared.exec("read x; echo got:$x", background=True)
    other = Sandbox.connect(shared.sandbox_id, **api).processes.connect(p.pid)
    other.send_stdin("hello\n")
    assert other.wait().stdout == "got:hello\n"
    with pytest.raises(NotFoundError):
        shared.processes.connect("no-such-pid")


def test_concurrent_execs_do_not_mix_their_output(shared):
    results = {}

    def run(n: int) -> None:
        results[n] = shared.exec(f"for i in $(seq 1 50); do echo {n}-$i; done")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(4):
        assert results[n].stdout == "".join(f"{n}-{i}\n" for i in range(1, 51))


def test_bad_exec_input_names_the_field(shared):
    with pytest.raises(InvalidArgumentError) as e:
        shared.exec([])
    assert e.value.field == "cmd" and e.value.status == 400
    with pytest.raises(InvalidArgumentError) as e:
        shared.exec("true", timeout_seconds=-1)
    assert e.value.field == "timeoutMs"
    with pytest.raises(InvalidArgumentError) as e:
        shared.exec("true", timeout_seconds="soon")  # type: ignore[arg-type]
    assert e.value.field == "timeout_seconds"

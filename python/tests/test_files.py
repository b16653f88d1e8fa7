"""Files through the SDK: text and binary round trips, streamed uploads and downloads, names that
need encoding, list/stat/exists/remove/make_dir, the upload cap, and watch."""

from __future__ import annotations

import io
import os
import threading

import pytest

from conftest import MAX_UPLOAD_BYTES

from airlock_sandbox import FileEntry, InvalidArgumentError, NotFoundError, PayloadTooLargeError


def test_text_round_trip(shared):
    entry = shared.files.write("/workspace/hello.txt", "héllo\nwörld")
    assert isinstance(entry, FileEntry)
    assert (entry.name, entry.path, entry.type) == ("hello.txt", "/workspace/hello.txt", "file")
    assert entry.size == len("héllo\nwörld".encode())
    assert shared.files.read("/workspace/hello.txt") == "héllo\nwörld"


def test_every_byte_value_round_trips(shared):
    data = bytes(range(256)) * 4
    shared.files.write("/workspace/bytes.bin", data)
    assert shared.files.read("/workspace/bytes.bin", format="bytes") == data
    # The sandbox sees the same bytes the SDK sent.
    assert shared.exec("sha256sum /workspace/bytes.bin").stdout.split()[0] == __import__(
        "hashlib"
    ).sha256(data).hexdigest()


def test_a_large_file_streams_both_ways(shared):
    data = os.urandom(3 * 1024 * 1024 + 17)
    entry = shared.files.write("/workspace/big.bin", io.BytesIO(data))
    assert entry.size == len(data)
    chunks = list(shared.files.read("/workspace/big.bin", format="stream"))
    assert b"".join(chunks) == data
    assert len(chunks) > 1


def test_a_download_stream_closed_early_or_never_read_lets_go(shared):
    shared.files.write("/workspace/some.bin", os.urandom(1024 * 1024))
    with shared.files.read("/workspace/some.bin", format="stream") as s:
        first = next(s)
        assert first
    assert list(s) == []
    unread = shared.files.read("/workspace/some.bin", format="stream")
    unread.close()
    assert list(unread) == []
    # The server is none the worse for the abandoned downloads.
    assert shared.exec("echo fine").stdout == "fine\n"


def test_write_takes_an_iterable_of_chunks(shared):
    shared.files.write("/workspace/parts.txt", (p.encode() for p in ["a", "b", "", "c" * 1000]))
    assert shared.files.read("/workspace/parts.txt") == "ab" + "c" * 1000


def test_write_makes_parent_dirs_and_replaces(shared):
    shared.files.write("/workspace/deep/er/f.txt", "one")
    shared.files.write("/workspace/deep/er/f.txt", "two")
    assert shared.files.read("/workspace/deep/er/f.txt") == "two"


@pytest.mark.parametrize(
    "name",
    ["a b.txt", "ünï cödé.txt", "q?x=1&y=2#frag", "per%20cent+plus", "semi;colon,comma", "日本.txt"],
)
def test_names_that_need_encoding_round_trip(shared, name):
    shared.files.make_dir("/workspace/names")
    path = f"/workspace/names/{name}"
    shared.files.write(path, name)
    assert shared.files.read(path) == name
    assert name in [e.name for e in shared.files.list("/workspace/names")]
    assert shared.files.stat(path).path == path


def test_list_stat_exists_remove_and_make_dir(shared):
    shared.files.make_dir("/workspace/tree/sub")
    shared.files.write("/workspace/tree/f.txt", "12345")
    entries = {e.name: e for e in shared.files.list("/workspace/tree")}
    assert set(entries) == {"sub", "f.txt"}
    assert entries["sub"].is_dir and entries["f.txt"].type == "file"
    assert shared.files.stat("/workspace/tree/f.txt").size == 5
    assert shared.files.exists("/workspace/tree/f.txt")
    assert not shared.files.exists("/workspace/tree/nothing")
    shared.files.remove("/workspace/tree/f.txt")
    assert not shared.files.exists("/workspace/tree/f.txt")
    with pytest.raises(NotFoundError) as e:
        shared.files.read("/workspace/tree/f.txt")
    assert e.value.code == "FILE_NOT_FOUND" and e.value.status == 404
    shared.files.remove("/workspace/tree")
    assert not shared.files.exists("/workspace/tree/sub")


def test_a_missing_path_is_file_not_found_for_every_call(shared):
    for call in (
        lambda: shared.files.read("/workspace/missing"),
        lambda: shared.files.stat("/workspace/missing"),
        lambda: shared.files.list("/workspace/missing"),
        lambda: shared.files.watch("/workspace/missing"),
    ):
        with pytest.raises(NotFoundError) as e:
            call()
        assert (e.value.code, e.value.field) == ("FILE_NOT_FOUND", "path")


def test_an_upload_over_the_cap_is_refused_and_leaves_no_file(shared):
    with pytest.raises(PayloadTooLargeError) as e:
        shared.files.write("/workspace/too-big.bin", io.BytesIO(b"x" * (MAX_UPLOAD_BYTES + 1)))
    assert (e.value.code, e.value.status) == ("REQUEST_TOO_LARGE", 413)
    assert not shared.files.exists("/workspace/too-big.bin")
    # The sandbox still works after the refused upload.
    assert shared.exec("echo fine").stdout == "fine\n"


def test_an_empty_path_is_refused_with_its_field(shared):
    with pytest.raises(InvalidArgumentError) as e:
        shared.files.read("")
    assert e.value.field == "path"
    with pytest.raises(InvalidArgumentError):
        shared.files.read("/workspace/x", format="yaml")


def test_watch_reports_changes_made_after_it_starts(shared):
    shared.files.make_dir("/workspace/watched")
    with shared.files.watch("/workspace/watched", timeout=60) as w:
        shared.files.write("/workspace/watched/new.txt", "x")
        ev = next(w)
        assert ev.path.endswith("/new.txt") or ev.path == "new.txt"
        assert ev.type in ("create", "write")


def test_closing_a_watch_from_another_thread_ends_the_iteration(shared):
    shared.files.make_dir("/workspace/watched2")
    w = shared.files.watch("/workspace/watched2")
    done = threading.Event()
    seen = []

    def consume() -> None:
        try:
            for ev in w:
                seen.append(ev)
        finally:
            done.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    w.close()
    assert done.wait(30), "iteration did not end after close()"
    assert seen == []
    assert list(w) == []

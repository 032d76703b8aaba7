"""Reading a local source file: exactly its bytes, whatever its size said, and never more than the limit."""
from __future__ import annotations

import os
import threading

import pytest

from shard_utils.media import reads
from shard_utils.media.reads import Unusable, read_source


@pytest.mark.parametrize("size", [0, 1, 33_000, 3 * 2**20 + 7])
def test_a_file_is_read_whole(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "f.jpg"
    path.write_bytes(data)
    assert read_source(str(path), max_bytes=2**24) == data


@pytest.mark.parametrize("expected", [0, 10, 5000, 2**20])
def test_bytes_are_read_to_the_end_whatever_size_was_expected(tmp_path, expected):
    """The size from fstat is only where the first read stops: a file that grew or shrank since is read to its end."""
    data = os.urandom(200_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert reads._read_up_to(fd, 2**24, expected) == data
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [1, 33_000, 3 * 2**20 + 7])
def test_a_file_of_the_size_fstat_gave_is_read_in_one_read(tmp_path, monkeypatch, size):
    """The first read asks for one byte more than the size: getting the size back is the end, with no probe after."""
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    asked = []

    def read(fd: int, n: int) -> bytes:
        asked.append(n)
        return real_read(fd, n)

    real_read = os.read
    monkeypatch.setattr(os, "read", read)
    assert read_source(str(path), max_bytes=2**24) == data and asked == [size + 1]


def test_the_limit_holds_however_much_there_is(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert len(reads._read_up_to(fd, 70_001, 10)) == 70_001
    finally:
        os.close(fd)


def test_a_stream_that_returns_short_reads_is_read_to_its_end():
    """A pipe hands out what is written so far: short reads are not the end."""
    data = os.urandom(300_000)
    r, w = os.pipe()

    def feed():
        for i in range(0, len(data), 7_000):
            os.write(w, data[i:i + 7_000])
        os.close(w)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        assert reads._read_up_to(r, 2**24, 0) == data
    finally:
        writer.join(timeout=10)
        os.close(r)


def test_a_file_over_the_limit_is_too_large(tmp_path):
    path = tmp_path / "big.jpg"
    path.write_bytes(b"\0" * (2**20 + 1))
    found = read_source(str(path), max_bytes=2**20)
    assert isinstance(found, Unusable) and found.reason == "too_large"

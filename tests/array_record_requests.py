"""Requests array-record's reader sends to Cloud Storage: to open an ArrayRecord shard, and per random read.

The tests count them through `FaultProxy` (tests/test_array_record_gcs.py); run as a script, this measures how
many requests opening a shard takes as its record count grows (the footer holds about 10 bytes per record, and
the reader's first request asks for the last 1 MiB):

    python tests/array_record_requests.py --records 1000,80000,100000,200000 --record-bytes 8
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from gcs_fixtures import FaultProxy, running_emulator, storage_host  # noqa: E402

from shard_utils.format import array_record  # noqa: E402

ARRAY_RECORD = ".array_record"


def shard_gets(proxy: FaultProxy, since: int = 0) -> list[tuple[str, str | None]]:
    """(object name, Range header) of each GET of an ArrayRecord object the proxy received from request `since` on."""
    out = []
    for (method, path), byte_range in list(zip(proxy.requests, proxy.ranges, strict=False))[since:]:
        name = urllib.parse.unquote(urllib.parse.urlsplit(path).path).rpartition("/o/")[2]
        if method == "GET" and name.endswith(ARRAY_RECORD):
            out.append((name, byte_range))
    return out


def measure(uri: str, proxy: FaultProxy, num_records: int, reads: int = 8) -> dict[str, float]:
    """Requests to open one gs:// shard (as Grain opens it) and to read `reads` records at random positions."""
    from array_record.python.array_record_module import ArrayRecordReader

    start = len(proxy.requests)
    reader = ArrayRecordReader(uri, "readahead_buffer_size:0", file_reader_buffer_size=32768)  # Grain's options
    try:
        if reader.num_records() != num_records:
            raise RuntimeError(f"{uri}: {reader.num_records()} records, expected {num_records}")
        opened = len(shard_gets(proxy, start))
        before = len(proxy.requests)
        for position in random.Random(0).sample(range(num_records), reads):
            reader.read([position])
        return {"open": opened, "per_read": len(shard_gets(proxy, before)) / reads}
    finally:
        reader.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="1000,80000,100000", help="record counts, comma-separated")
    parser.add_argument("--record-bytes", type=int, default=8, help="bytes of each (random) record")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work, running_emulator(Path(work)) as em:
        bucket = em.new_bucket("requests")
        print("records  file bytes  requests to open  requests per random read")
        for n in map(int, args.records.split(",")):
            local = Path(work) / f"shard-{n}{ARRAY_RECORD}"
            array_record.write_shard((os.urandom(args.record_bytes) for _ in range(n)), str(local))
            em.client.bucket(bucket).blob(local.name).upload_from_filename(str(local))
            with FaultProxy(em.url) as proxy, storage_host(proxy.url):
                found = measure(f"gs://{bucket}/{local.name}", proxy, n)
            print(f"{n:>7}  {local.stat().st_size:>10}  {found['open']:>16}  {found['per_read']:>24.2f}")


if __name__ == "__main__":
    main()

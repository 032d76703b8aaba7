"""A split's index written into the output: its header, the base index's blocks (an append), then the new shards'
index parts, in the order of the shards' places."""
from __future__ import annotations

import io
from collections.abc import Callable
from typing import BinaryIO, cast

from beam_jobs.publish.plan import IndexJob
from shard_utils import storage
from shard_utils.errors import PlanError
from shard_utils.format import index
from shard_utils.format.manifest import IndexFile
from shard_utils.media.reads import prefetched

__all__ = ["write_index_file"]


def write_index_file(job: IndexJob, folder: str) -> IndexFile:
    """`job.name` in folder: the index header, the base index's blocks (checked against its manifest entry),
    then the parts' blocks. The parts are read several at a time."""
    idx_schema = index.index_schema(job.extras)
    header = index.index_header(idx_schema)
    base = storage.join(folder, job.base.path) if job.base is not None else None
    if base is not None and (job.base_rows is not None or storage.read_range(base, 0, len(header)) != header):
        return _rewritten_index(job, folder, base, idx_schema)
    digest = storage.Digest()
    with storage.open_write(storage.join(folder, job.name)) as out:
        def put(data: bytes) -> None:
            out.write(data)
            digest.update(data)

        put(header)
        if base is not None and job.base is not None:
            _copy_base(base, job.base, header, put)
        for _, data in prefetched(job.parts, storage.read_bytes, lambda _: 0):
            put(index.without_header(cast(bytes, data), header))
    return IndexFile(job.name, job.rows + (job.base.num_rows if job.base else 0), digest.size, digest.crc32c,
                     digest.sha256)


def _copy_base(uri: str, entry: IndexFile, header: bytes, put: Callable[[bytes], None]) -> None:
    """The base index's blocks (after its header), its size and CRC32C checked against its manifest entry."""
    seen = storage.Digest()
    with storage.open_read(uri) as f:
        seen.update(f.read(len(header)))  # the header, checked by the caller
        while block := f.read(storage.READ_CHUNK_SIZE):
            seen.update(block)
            put(block)
    if (seen.size, seen.crc32c) != (entry.num_bytes, entry.crc32c):
        raise PlanError(f"{entry.path}: size {seen.size} / crc32c {seen.crc32c} differ from the manifest's "
                        f"{entry.num_bytes} / {entry.crc32c}; the index is damaged (run tpu-shards verify); nothing "
                        "was published")


def _rewritten_index(job: IndexJob, folder: str, base: str, idx_schema) -> IndexFile:
    """The base index's rows (the first `job.base_rows` of them, when given) decoded and written again, then the
    parts': for a base written by another version of the writer, or cut where the replaced generation starts."""
    from shard_utils.format.generations import DigestingReader

    digest = storage.Digest()
    header = index.index_header(idx_schema)

    def rows():
        keep = job.base.num_rows if job.base_rows is None else job.base_rows
        with storage.open_read(base) as raw:
            for i, row in enumerate(index.read_index(DigestingReader(raw, digest), max_rows=job.base.num_rows)):
                if i < keep:
                    yield row
        if (digest.size, digest.crc32c) != (job.base.num_bytes, job.base.crc32c):
            raise PlanError(f"{job.base.path}: size {digest.size} / crc32c {digest.crc32c} differ from the manifest's "
                            f"{job.base.num_bytes} / {job.base.crc32c}; the index is damaged; nothing was published")
        for part in job.parts:
            yield from index.read_index(io.BytesIO(header + index.without_header(storage.read_bytes(part), header)))

    with storage.open_write(storage.join(folder, job.name)) as out:
        written = index.write_index(cast(BinaryIO, out), rows(), idx_schema)
    return written.index_file(job.name)

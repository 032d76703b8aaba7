"""Public import path of `shard_utils.format.index`."""
from shard_utils.format.index import (
    DATA_CHECKSUM_MISMATCH,
    MAX_BLOCK_BYTES,
    MAX_RECORD_BYTES,
    MIN_FRAMED,
    NO_LABEL,
    IndexFormatError,
    IndexRow,
    IndexWritten,
    check_header,
    check_place,
    field_name,
    identity_problem,
    index_blocks,
    index_header,
    index_name,
    index_schema,
    read_index,
    read_places,
    record_identity,
    row_disagreement,
    row_from_meta,
    row_from_record,
    unframe,
    without_header,
    write_index,
)

__all__ = [
    "index_name", "MIN_FRAMED", "MAX_RECORD_BYTES", "MAX_BLOCK_BYTES", "NO_LABEL", "IndexFormatError", "field_name",
    "index_schema", "IndexRow", "row_from_record", "row_from_meta", "IndexWritten", "write_index", "index_header",
    "index_blocks", "without_header", "check_header", "read_index", "read_places", "check_place", "record_identity",
    "row_disagreement", "identity_problem", "DATA_CHECKSUM_MISMATCH", "unframe"
]

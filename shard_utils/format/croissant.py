"""A dataset's Croissant (MLCommons, version 1.0) description, `croissant.json`, derived from its manifest alone.

Plain JSON-LD, written without mlcroissant: the distribution (every shard, ArrayRecord twin and index with its
SHA-256 and size), one `cr:FileSet` of shards per split, the record set (one field per record feature, the label
referencing a record set of label names), Croissant's `cr:Split` record set, and the provenance (tool version,
counts, rejections) in the description. The manifest stays the contract: readers never read `croissant.json`,
and `verify` checks its files against the manifest (`file_problems`).
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from typing import Any

from shard_utils.format import json_text, schema
from shard_utils.format.filenames import CROISSANT_NAME
from shard_utils.format.manifest import MAX_MANIFEST_BYTES, IndexFile, Manifest, Shard
from shard_utils.format.shard_formats import ARRAY_RECORD, FORMATS

__all__ = [
    "CONFORMS_TO", "ENCODINGS", "SHARDS", "SPLIT_OF_SHARD", "MAX_CROISSANT_BYTES", "METADATA", "metadata",
    "dataset_name", "croissant", "croissant_bytes", "summary", "provenance", "described_files", "file_problems"
]

CONFORMS_TO = "http://mlcommons.org/croissant/1.0"
ENCODINGS = {**{f.name: f.mime_type for f in FORMATS.values()}, "index": "application/x-avro"}
SHARDS = "shards"  # the FileSet of every shard, the records' source
SPLIT_OF_SHARD = r"^(.+?)(?:-g\d{3,})?-\d{5}-of-\d{5}\.[a-z_]+$"  # a shard's file name -> its split
# A larger croissant.json is refused unparsed. A label takes up to 10 times the bytes here that it takes in the
# manifest (a record of id and name against a name), so any manifest under its cap has a description under this.
MAX_CROISSANT_BYTES = 10 * MAX_MANIFEST_BYTES
METADATA = ("name", "description", "license", "citation", "url")  # what a user may give (build options)
_DTYPES = {"int64": "sc:Integer", "float32": "sc:Float", "string": "sc:Text"}
_CONTEXT: dict[str, Any] = {  # Croissant 1.0's standard @context (mlcroissant warns about any other)
    "@language": "en", "@vocab": "https://schema.org/", "citeAs": "cr:citeAs", "column": "cr:column",
    "conformsTo": "dct:conformsTo", "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"}, "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/", "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"}, "extract": "cr:extract", "field": "cr:field",
    "fileProperty": "cr:fileProperty", "fileObject": "cr:fileObject", "fileSet": "cr:fileSet", "format": "cr:format",
    "includes": "cr:includes", "isLiveDataset": "cr:isLiveDataset", "jsonPath": "cr:jsonPath", "key": "cr:key",
    "md5": "cr:md5", "parentField": "cr:parentField", "path": "cr:path", "recordSet": "cr:recordSet",
    "references": "cr:references", "regex": "cr:regex", "repeated": "cr:repeated", "replace": "cr:replace",
    "samplingRate": "cr:samplingRate", "sc": "https://schema.org/", "separator": "cr:separator",
    "source": "cr:source", "subField": "cr:subField", "transform": "cr:transform"}


def metadata(m: Manifest) -> dict[str, str]:
    """The dataset's name, description, licence, citation and url as the build recorded them (empty: not given)."""
    given = m.options.get("metadata")
    given = given if isinstance(given, dict) else {}
    return {k: given[k] for k in METADATA if isinstance(given.get(k), str) and given[k]}


def dataset_name(m: Manifest) -> str:
    """The given --name, else the dataset folder's name."""
    return metadata(m).get("name") or posixpath.basename(m.location.rstrip("/")) or "dataset"


def croissant(m: Manifest, *, label_dicts: bool = True) -> dict[str, Any]:
    """The Croissant JSON-LD document describing the dataset whose manifest is `m` (`label_dicts` False: its label
    records as a `json_text.Records`, which `json_text.dumps` writes without making a dict per label)."""
    given = metadata(m)
    doc: dict[str, Any] = {
        "@context": _CONTEXT, "@type": "sc:Dataset", "conformsTo": CONFORMS_TO, "name": dataset_name(m),
        "description": given.get("description") or summary(m), "datePublished": m.created[:10] or None,
        "version": f"1.{len(m.generations or [None]) - 1}.0", "license": given.get("license"),
        "citeAs": given.get("citation"), "url": given.get("url"),
        "isAccessibleForFree": True, "keywords": ["tpu-shards", m.media, "classification"],
        "creativeWorkStatus": provenance(m),
        "distribution": list(_distribution(m)), "recordSet": _record_sets(m, label_dicts)}
    return {k: v for k, v in doc.items() if v is not None}


def croissant_bytes(m: Manifest) -> bytes:
    """`croissant.json`'s bytes."""
    return (json_text.dumps(croissant(m, label_dicts=False)) + "\n").encode("utf-8")


def summary(m: Manifest) -> str:
    """One sentence on what the dataset holds (the description when none was given)."""
    splits = ", ".join(f"{name} {split.num_records}" for name, split in m.splits.items())
    kind = "multi-label " if m.multi_label else ""
    return (f"{sum(s.num_records for s in m.splits.values())} {m.media} records for {kind}classification into "
            f"{len(m.labels)} labels ({splits}), in {' and '.join(m.formats)} shards written by tpu-shards.")


def provenance(m: Manifest) -> str:
    """How the dataset was made: tool version, date, input and the accounting (seen = records + rejected +
    skipped), with the rejection reasons."""
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(m.rejected.get("by_reason", {}).items()))
    written = sum(s.num_records for s in m.splits.values())
    appended = f"; {len(m.generations) - 1} appends" if m.generations and len(m.generations) > 1 else ""
    return (f"Built by tpu-shards {m.tool_version} on {m.created} from {m.input}{appended}: {m.files_seen} files "
            f"seen, {written} records, {m.rejected.get('count', 0)} rejected" + (f" ({reasons})" if reasons else "")
            + f", {m.skipped.get('count', 0)} skipped. The manifest (manifest.json) is the dataset's contract.")


def _file(entry: Shard | IndexFile, encoding: str) -> dict[str, Any]:
    return {"@type": "cr:FileObject", "@id": entry.path, "name": entry.path, "contentUrl": entry.path,
            "encodingFormat": encoding, "contentSize": f"{entry.num_bytes} B", "sha256": entry.sha256}


def described_files(m: Manifest) -> Iterator[tuple[Shard | IndexFile, str]]:
    """Every file the description names, with its encoding format: shards, ArrayRecord twins, indexes."""
    for split in m.splits.values():
        yield from ((s, ENCODINGS[m.shard_format]) for s in split.shards)
        yield from ((s, ENCODINGS[ARRAY_RECORD.name]) for s in split.array_record_shards or ())
        if split.index is not None:
            yield split.index, ENCODINGS["index"]


def _distribution(m: Manifest) -> Iterator[dict[str, Any]]:
    yield from (_file(entry, encoding) for entry, encoding in described_files(m))
    yield {"@type": "cr:FileSet", "@id": SHARDS, "name": SHARDS, "description": "Every shard of every split",
           "encodingFormat": ENCODINGS[m.shard_format], "includes": [s.path for split in m.splits.values()
                                                                   for s in split.shards]}
    for name, split in m.splits.items():
        yield {"@type": "cr:FileSet", "@id": _split_files(name), "name": _split_files(name),
               "description": f"The {split.num_records} records of split {name!r}, in {len(split.shards)} shards",
               "encodingFormat": ENCODINGS[m.shard_format], "includes": [s.path for s in split.shards]}


def _split_files(split: str) -> str:
    return f"{split}-shards"


def _record_sets(m: Manifest, label_dicts: bool) -> list[dict[str, Any]]:
    splits = {"@type": "cr:RecordSet", "@id": "splits", "name": "splits", "dataType": "cr:Split",
              "description": "The dataset's splits.", "key": {"@id": "splits/name"},
              "field": [_field("splits", "name", "sc:Text"), _field("splits", "num_records", "sc:Integer")],
              "data": [{"splits/name": n, "splits/num_records": s.num_records} for n, s in m.splits.items()]}
    out = [splits]
    if m.labels:
        labels = json_text.Records(("labels/id", "labels/name"),
                                   (range(m.label_offset, m.label_offset + len(m.labels)), m.labels))
        out.append({"@type": "cr:RecordSet", "@id": "labels", "name": "labels", "key": {"@id": "labels/id"},
                    "description": "The label names, by the id stored in each record"
                                   + (f" (name i is stored as i + {m.label_offset})" if m.label_offset else ""),
                    "field": [_field("labels", "id", "sc:Integer"), _field("labels", "name", "sc:Text")],
                    "data": labels.rows() if label_dicts else labels})
    out.append(_records(m))
    return out


def _field(record_set: str, name: str, data_type: str, **more: Any) -> dict[str, Any]:
    return {"@type": "cr:Field", "@id": f"{record_set}/{name}", "name": name, "dataType": data_type, **more}


def _records(m: Manifest) -> dict[str, Any]:
    """The records: one field per feature, read from the shards; the split field (Croissant's convention) names
    each record's split, from its shard's file name."""
    split = _field("records", "split", "sc:Text", references={"field": {"@id": "splits/name"}},
                   source={"fileSet": {"@id": SHARDS}, "extract": {"fileProperty": "filename"},
                           "transform": {"regex": SPLIT_OF_SHARD}})
    fields = [split] + [_feature_field(m, key, spec) for key, spec in m.features.items()]
    return {"@type": "cr:RecordSet", "@id": "records", "name": "records",
            "description": f"One record per {m.media} (a tf.train.Example); the label field references labels/id",
            "field": fields}


def _feature_field(m: Manifest, key: str, spec: dict[str, Any]) -> dict[str, Any]:
    name = key.replace("/", "_")
    data_type = "sc:ImageObject" if key in (schema.IMAGE_ENCODED, schema.VIDEO_ENCODED) else _DTYPES[spec["dtype"]]
    more: dict[str, Any] = {"source": {"fileSet": {"@id": SHARDS}, "extract": {"column": key}}}
    if spec.get("shape"):
        more["repeated"] = True
    if key == schema.LABEL and m.labels:
        more["references"] = {"field": {"@id": "labels/id"}}
    if m.embedding and key == m.embedding.get("key"):
        more["description"] = f"Embedding of shape {m.embedding.get('shape')} by {m.embedding.get('model', '?')}"
    return _field("records", name, data_type, **more)


def file_problems(data: bytes, m: Manifest) -> list[str]:
    """How a dataset's `croissant.json` differs from its manifest: not JSON, too large, or a file missing, extra,
    or with another SHA-256 or size. Empty when its distribution matches."""
    if len(data) > MAX_CROISSANT_BYTES:
        return [f"{CROISSANT_NAME}: {len(data)} bytes, more than {MAX_CROISSANT_BYTES}; not read"]
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return [f"{CROISSANT_NAME}: not JSON"]
    found = doc.get("distribution") if isinstance(doc, dict) else None
    if not isinstance(found, list):
        return [f"{CROISSANT_NAME}: no distribution list"]
    listed = {f.get("contentUrl"): f for f in found if isinstance(f, dict) and f.get("@type") == "cr:FileObject"}
    expected = {entry.path: _file(entry, encoding) for entry, encoding in described_files(m)}
    problems = [f"{CROISSANT_NAME}: does not list {path}" for path in expected if path not in listed]
    problems += [f"{CROISSANT_NAME}: lists {str(path)[:200]!r}, which the manifest does not name"
                 for path in listed if path not in expected]
    for path, entry in expected.items():
        mine = listed.get(path)
        if mine is not None and (mine.get("sha256"), mine.get("contentSize")) != (entry["sha256"],
                                                                                entry["contentSize"]):
            problems.append(f"{CROISSANT_NAME}: {path}: sha256 or size differs from the manifest")
    return problems

"""json_text.dumps writes json.dumps(indent=...)'s very text, fast in long lists."""
import json

import pytest

from shard_utils.format import json_text

CASES = [
    1, "a", None, 1.5, [], {}, [1, []], [[1, 2], [3, {"k": [4]}]], ({"t": (1, 2)},),
    {"a": {}, "b": [{}], "c": [{"x": 1}, {"x": 2}], "d": [{"x": 1}, {"y": 2}]},
    {1: 2, "z": [1.5, float("nan"), float("-inf"), True, None, 'é\n"}', -3]}, {"a": {1: [1, {"b": 2}]}},
    [{"labels/id": i, "labels/name": f'n"}},\n  {{{i}é\u2028'} for i in range(5)],  # names that look like separators
    [{"a": 1, "b": {"c": 1}}], [{"a": "}"}, {"{": 2}], [{1: 2}], [{"a": 1}, {}], [{"a": [1]}, {"a": 2}],
]


@pytest.mark.parametrize("indent", [2, 4])
@pytest.mark.parametrize("value", CASES, ids=range(len(CASES)))
def test_the_text_is_json_dumps_text(value, indent):
    assert json_text.dumps(value, indent) == json.dumps(value, indent=indent, ensure_ascii=False)


def test_long_label_lists_and_label_records_are_written_as_json_writes_them():
    labels = [f"zz{i:07d}" for i in range(10**5)]
    doc = {"labels": labels, "counts": dict.fromkeys(labels, 0),
           "data": [{"labels/id": i, "labels/name": n} for i, n in enumerate(labels)]}
    assert json_text.dumps(doc) == json.dumps(doc, indent=2, ensure_ascii=False)


@pytest.mark.parametrize("records", [
    json_text.Records(("labels/id", "labels/name"), (range(3, 6), ["a", 'b"}{', "é"])),
    json_text.Records(("x{}",), ([1.5, None],)), json_text.Records(("a",), ([],)),
], ids=["labels", "odd", "empty"])
def test_records_are_written_as_the_list_of_objects_they_stand_for(records):
    doc, rows = {"data": records, "k": [{"d": records}]}, records.rows()
    assert json_text.dumps(doc) == json.dumps({"data": rows, "k": [{"d": rows}]}, indent=2, ensure_ascii=False)

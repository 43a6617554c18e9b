"""Request bodies as strict JSON: what Python's json module would accept or crash on is a clear refusal."""

from __future__ import annotations

import base64
import json

import pytest

from duetime.api.strict_json import MAX_JSON_DEPTH, as_json, nesting_depth, read_json_body, unreadable_body


def test_a_strict_json_body_reads_as_python_json_does() -> None:
    text = '{"name": "x", "n": 1, "f": 2.5, "big": 123456789012345678901234567890, "l": [true, null]}'
    assert read_json_body(text) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "saying"),
    [
        ('{"n": NaN}', "NaN is not a JSON number"),
        ('{"n": Infinity}', "Infinity is not a JSON number"),
        ('{"n": -Infinity}', "-Infinity is not a JSON number"),
        ('{"n": 1e400}', "1e400 is too large for a 64-bit float"),
        ('{"n": 1' + "0" * 5000 + "}", "more than 4,300 digits"),
        ("{not json", "Expecting property name"),
        ('{"name": "x", "name": "y"}', "the name 'name' appears twice in one object"),
        ('{"task": {"env": {"A": "1", "A": "2"}}}', "the name 'A' appears twice"),
    ],
)
def test_what_is_not_strict_json_is_a_decode_error_saying_why(text: str, saying: str) -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        read_json_body(text)
    assert saying in str(refused.value)


def test_a_number_of_more_than_4300_digits_is_refused_without_pythons_hint() -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        read_json_body('{"n": -1' + "0" * 5000 + "}")
    assert refused.value.msg == "a number has more than 4,300 digits"


def test_a_number_of_4300_digits_still_reads() -> None:
    assert read_json_body('{"n": ' + "9" * 4300 + "}") == {"n": int("9" * 4300)}


def test_nesting_depth_counts_brackets_outside_strings_only() -> None:
    assert nesting_depth('{"a": [1, {"b": []}]}') == 4
    assert nesting_depth('{"a": "[[[[{{{{\\"[["}') == 1
    assert nesting_depth("") == 0


def test_a_body_nested_deeper_than_the_limit_is_unreadable_and_one_at_it_is_not() -> None:
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert unreadable_body({"body": at_limit}) is None
    assert unreadable_body({"body": "[" + at_limit + "]"}) == (
        f"the request body nests deeper than {MAX_JSON_DEPTH} levels"
    )


def test_a_base64_body_that_is_not_utf8_is_unreadable() -> None:
    event = {"body": base64.b64encode(b"\xff\xfe{").decode(), "isBase64Encoded": True}
    assert unreadable_body(event) == "the request body is not UTF-8 text"
    assert unreadable_body({"body": None}) is None


def test_a_body_is_read_as_json_whatever_its_declared_type_and_base64_is_decoded() -> None:
    event = {
        "headers": {"content-type": "application/x-www-form-urlencoded", "x-other": "1"},
        "body": base64.b64encode(b'{"a": 1}').decode(),
        "isBase64Encoded": True,
    }
    read = as_json(event)
    assert read["headers"] == {"content-type": "application/json", "x-other": "1"}
    assert (read["body"], read["isBase64Encoded"]) == ('{"a": 1}', False)
    # the caller's event is left as it was
    assert event["isBase64Encoded"] is True
    # a request without a body keeps its headers
    assert as_json({"headers": {"accept": "*/*"}, "body": None})["headers"] == {"accept": "*/*"}

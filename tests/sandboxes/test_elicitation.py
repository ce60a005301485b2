"""Reading an agent's elicitation form, and checking a person's answers against it."""

from __future__ import annotations

import pytest

from sandboxes.elicitation import (
    MAX_FIELDS,
    BadRequest,
    answerable,
    check_content,
    read_form,
    read_url,
)

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 5},
        "n": {"type": "integer", "minimum": 1, "maximum": 3},
        "ratio": {"type": "number"},
        "on": {"type": "boolean"},
        "pick": {"type": "string", "enum": ["a", "b"], "enumNames": ["A"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name"],
}


def test_it_reads_each_field_kind_and_keeps_unknown_ones_as_unsupported():
    fields = read_form(FORM)
    assert [(f["name"], f["type"]) for f in fields] == [
        ("name", "string"), ("n", "integer"), ("ratio", "number"), ("on", "boolean"),
        ("pick", "enum"), ("tags", "unsupported"),
    ]  # fmt: skip
    assert fields[4]["options"] == [{"value": "a", "title": "A"}, {"value": "b", "title": "b"}]
    assert fields[5]["unsupported"] == "array"
    assert answerable(fields)


@pytest.mark.parametrize(
    "schema, message",
    [
        ([], "requestedSchema must be an object"),
        ({"properties": []}, "requestedSchema.properties must be an object"),
        (
            {"properties": {f"f{i}": {"type": "string"} for i in range(MAX_FIELDS + 1)}},
            "the form has 101 fields; Craft shows forms of at most 100",
        ),
        (
            {"properties": {"x": {"type": "string", "enum": [str(i) for i in range(201)]}}},
            "a field offers 201 choices; Craft shows at most 200",
        ),
    ],
)
def test_it_refuses_forms_it_cannot_show(schema, message):
    with pytest.raises(BadRequest, match=message):
        read_form(schema)


@pytest.mark.parametrize(
    "content, message",
    [
        ({}, "'name' is required"),
        ({"name": "toolong"}, "'name' allows at most 5 characters"),
        ({"name": "x", "n": 1.5}, "'n' must be a whole number"),
        ({"name": "x", "n": True}, "'n' must be a whole number"),
        ({"name": "x", "n": 4}, "'n' must be at most 3"),
        ({"name": "x", "ratio": "1"}, "'ratio' must be a number"),
        ({"name": "x", "on": 1}, "'on' must be true or false"),
        ({"name": "x", "pick": "c"}, "'c' is not a choice of 'pick'"),
        ({"name": "x", "tags": ["a"]}, "the form has no field 'tags'"),
        ({"name": "x", "other": 1}, "the form has no field 'other'"),
        ([], "'content' must be an object"),
    ],
)
def test_it_refuses_answers_that_do_not_fit(content, message):
    with pytest.raises(ValueError, match=message):
        check_content(read_form(FORM), content)


def test_it_takes_answers_that_fit_and_leaves_out_unanswered_ones():
    content = {"name": "x", "n": 2.0, "ratio": 0.5, "on": False, "pick": "b", "tags": None}
    assert check_content(read_form(FORM), content) == {
        "name": "x", "n": 2, "ratio": 0.5, "on": False, "pick": "b",
    }  # fmt: skip


def test_a_required_unsupported_field_leaves_only_decline():
    fields = read_form({"properties": {"c": {"type": "color"}}, "required": ["c"]})
    assert not answerable(fields)
    with pytest.raises(ValueError, match="decline it"):
        check_content(fields, {})


@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "file:///etc/passwd", "https://", "", 5, "x" * 5000]
)
def test_it_takes_only_http_and_https_urls(url):
    with pytest.raises(BadRequest):
        read_url(url)
    assert read_url("https://example.com/a?b=1") == "https://example.com/a?b=1"

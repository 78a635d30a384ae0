"""Label selectors and field selectors as kubectl parses them."""

import pytest

from gctl.api import errors, fields, kinds, selector

LABELS = {"team": "nlp", "env": "prod", "tier": "gold"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("team=nlp", True),
        ("team==nlp", True),
        ("team=cv", False),
        ("team!=cv", True),
        ("team!=nlp", False),
        ("team", True),
        ("!team", False),
        ("missing", False),
        ("!missing", True),
        ("team in (cv, nlp)", True),
        ("team notin (cv,nlp)", False),
        ("team=nlp,env=prod", True),
        ("team=nlp,env=dev", False),
        ("team in (nlp,cv),tier=gold", True),
        ("", True),
    ],
)
def test_matches(text: str, matches: bool) -> None:
    assert selector.parse(text).matches(LABELS) is matches


@pytest.mark.parametrize("text", ["a b", "team=(x", "bad key!=x", "team=a b"])
def test_refused(text: str) -> None:
    with pytest.raises(errors.Invalid, match="-l"):
        selector.parse(text)


def test_labels_stored_in_a_form_gctl_refuses_match_as_far_as_they_are_text() -> None:
    """An older gctl or a hand edit may have left labels that are no map, or a value that is
    no text: what is not a map of text counts as no label, not as a traceback of `get -l`."""
    assert not selector.parse("a=b").matches(["a"])
    assert selector.parse("!a").matches(["a"])
    assert not selector.parse("a in (b)").matches({"a": ["b"]})
    assert selector.parse("a!=b,a").matches({"a": ["b"]})


@pytest.mark.parametrize(
    ("text", "matched"),
    [
        ("status.phase=Running", ["running"]),
        ("status.phase==Running,metadata.name!=running", []),
        # No value matches the empty string, as in Kubernetes.
        ("status.node=", ["pending", "unpooled"]),
        ("status.node!=", ["running"]),
        ("spec.pool=default", ["pending", "running", "unpooled"]),
        ("spec.pool!=default", []),
    ],
)
def test_field_selectors(text: str, matched: list[str]) -> None:
    wires = [
        {"metadata": {"name": "pending"}, "spec": {"pool": "default"}, "status": {}},
        {
            "metadata": {"name": "running"},
            "spec": {"pool": "default"},
            "status": {"phase": "Running", "node": "n1"},
        },
        # A Job that names no pool is stored without one, and runs in the default pool.
        {"metadata": {"name": "unpooled"}, "spec": {}, "status": {"phase": "Pending"}},
    ]
    chosen = fields.parse(text, kinds.JOB)
    assert [w["metadata"]["name"] for w in wires if chosen.matches(w)] == matched

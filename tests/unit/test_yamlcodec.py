"""gctl's YAML loader and dumper read and write every document as PyYAML's safe ones do."""

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gctl.api import yamlcodec

# Scalars written plainly, one for each rule of the safe loader's resolver (and a few near
# them), so that a loader that reads one differently from PyYAML's fails here.
PLAIN_SCALARS = [
    "",
    "~",
    "null",
    "Null",
    "NULL",
    "nul",
    "true",
    "True",
    "yes",
    "No",
    "off",
    "ON",
    "y",
    "n",
    "0",
    "-0",
    "+12",
    "0x1F",
    "0o17",
    "017",
    "0b101",
    "1_000",
    "190:20:30",
    "-1.5",
    "1e3",
    "1.0e+3",
    ".inf",
    "-.Inf",
    ".nan",
    ".NaN",
    "6.8523015e+5",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "2001-12-14 21:59:43.10",
    "<<",
    "=",
    "!",
    "&",
    "*",
    "hello",
    "gctl/v1",
    "Job",
    "1.2.3",
    "-",
    "--seed",
    "0.5",
    "24Gi",
    "3:30",
]


def _plain_values(*, allow_nan: bool) -> st.SearchStrategy[object]:
    """Values of dicts, lists and every scalar the safe loader and dumper know as plain."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=allow_nan),
        st.text(max_size=8),
        st.sampled_from(PLAIN_SCALARS),
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
        max_leaves=20,
    )


class _PyYAML(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The loader gctl had before its own walk: PyYAML's, refusing a repeated key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        yamlcodec.refuse_repeated_keys(node)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result


def _safe(text: str) -> str:
    """What PyYAML's safe loader reads from `text`, or the error it gives, as text (a NaN is
    not equal to itself)."""
    return _read(text, _PyYAML)


def _ours(text: str) -> str:
    return _read(text, yamlcodec.Loader)


def _read(text: str, loader: type[yaml.SafeLoader]) -> str:
    try:
        documents = list(yaml.load_all(text, Loader=loader))
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an int of 5,000 digits ...
        return f"{type(exc).__name__}: {exc}"
    return repr([(d, _types(d)) for d in documents])


def _types(value: object) -> object:
    if isinstance(value, dict):
        return [(type(k).__name__, _types(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize("scalar", PLAIN_SCALARS)
def test_plain_scalars_read_as_pyyaml_reads_them(scalar: str) -> None:
    text = f"- {scalar}\n- k: {scalar}\n- {{{scalar or 'e'}: v}}\n- '{scalar}'\n"
    assert _ours(text) == _safe(text)


@pytest.mark.parametrize(
    "text",
    [
        "kind: Job\nmetadata: {name: h, labels: {a: b}}\nspec:\n  command: [x, y]\n",
        "a: &x {b: [1, 2]}\nc: *x\nd: [*x, *x]\n",  # aliases
        "base: &b {x: 1, y: 2}\nmine:\n  <<: *b\n  y: 3\n",  # a merge key
        "s: !!set {a, b}\no: !!omap [{a: 1}, {b: 2}]\np: !!pairs [{a: 1}, {a: 2}]\n",
        "b: !!binary aGVsbG8=\nt: !!timestamp 2001-12-14\nf: !!float 1\ns: !!str 12\n",
        "? [1, 2]\n: pair as a key\n",
        "[" * 300 + "]" * 300,
        "---\n---\na: 1\n...\n---\n- 1\n",
        "k: 'quoted: yes'\nl: |\n  two\n  lines\nm: >\n  folded\n  text\n",
    ],
)
def test_documents_read_as_pyyaml_reads_them(text: str) -> None:
    assert _ours(text) == _safe(text)


@pytest.mark.parametrize(
    "text",
    [
        # Two faults: the error is the one PyYAML's constructor meets first (it builds a
        # mapping's scalars before the collections in it), not the walk's.
        "metadata: {labels: {x: 1, x: 2}}\nspec: !foo 1\n",
        "a:\n  b: 1\n  b: 2\nc: 2021-02-30\n",
        "a: [!!binary '@@']\nb: !!int 1x\n",
        "a: {x: 1}\n<<: 1\n",
        "metadata: {labels: {x: 1, x: 2}}\nspec: !!python/object:os.system 1\n",
        # A merge that rewrites a node before its own keys are compared: accepted, as by PyYAML.
        "a: &b {<<: {x: 1}, <<: {y: 2}}\n<<: *b\n",
    ],
)
def test_a_faulty_document_fails_as_in_pyyaml(text: str) -> None:
    assert _ours(text) == _safe(text)


@pytest.mark.parametrize(
    ("text", "what"), [("a: !!bool x\n", "boolean"), ("a: !!timestamp no\n", "timestamp")]
)
def test_a_tagged_scalar_that_is_not_of_its_type_is_a_yaml_error(text: str, what: str) -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match=f"'[a-z]+' is not a {what}"):
        yaml.load(text, Loader=yamlcodec.Loader)


def test_aliases_are_one_object_as_in_pyyaml() -> None:
    text = "a: &x {b: [1]}\nc: *x\nl: &y [1]\nm: [*y]\nn: &z 1000\no: *z\n"
    [document] = yaml.load_all(text, Loader=yamlcodec.Loader)
    assert isinstance(document, dict)
    assert document["a"] is document["c"]
    assert document["l"] is document["m"][0]
    assert document["n"] is document["o"]


def test_a_document_deeper_than_the_walk_can_go_is_read_by_pyyaml() -> None:
    text = "[" * 2000 + "]" * 2000
    assert _ours(text) == _safe(text)


@settings(max_examples=300, deadline=None)
@given(_plain_values(allow_nan=False), st.booleans())
def test_random_documents_read_as_pyyaml_reads_them(value: object, flow: bool) -> None:
    text = yaml.safe_dump(value, default_flow_style=flow)
    assert _ours(text) == _safe(text)


DUMPS: list[dict[str, Any]] = [
    {"sort_keys": False, "default_flow_style": False, "allow_unicode": True},  # `get -o yaml`
    {"sort_keys": False, "default_flow_style": None},
    {"sort_keys": False, "default_flow_style": True, "default_style": '"'},
    {"sort_keys": True},
]


def _dumped(value: object, dumper: type[Any], options: dict[str, Any]) -> str:
    text: str = yaml.dump(value, Dumper=dumper, **options)
    return text


@pytest.mark.parametrize("options", DUMPS)
def test_values_are_written_as_pyyaml_writes_them(options: dict[str, Any]) -> None:
    """Every implicit scalar (as text, so the emitter must quote it), numbers and their
    special values, unicode, empty containers, nesting, in all the dump's styles."""
    job = {
        "apiVersion": "gctl/v1",
        "kind": "Job",
        "metadata": {"name": "h", "labels": {}, "annotations": {"note": "é ✓ \t tab"}},
        "spec": {"command": ["python", "-c", "print('x: y')"], "priority": -3, "gpus": 0.5},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "attempts": []},
    }
    values = [
        job,
        PLAIN_SCALARS,
        [1.0, 1e20, 1e-7, float("inf"), -float("inf"), float("nan"), 0, -0.0, 2**70],
        [None, True, False, "", " lead", "trail ", "multi\nline", "#", "a: b", "- x"],
        {1: "int key", None: "null key", False: "bool key", 2.5: "float key"},
        [[[]], {}, [{}], {"a": [[1, 2], {"b": None}]}],
        "just a string",
        7,
    ]
    for value in values:
        ours = _dumped(value, yamlcodec.Dumper, options)
        assert ours == _dumped(value, yaml.CSafeDumper, options)


def test_an_object_met_twice_is_written_with_an_anchor_as_pyyaml_writes_it() -> None:
    shared = {"a": [1]}
    value = {"x": shared, "y": shared, "z": [shared["a"]]}
    ours = yaml.dump(value, Dumper=yamlcodec.Dumper, sort_keys=False)
    assert ours == yaml.dump(value, Dumper=yaml.CSafeDumper, sort_keys=False)
    assert "&id001" in ours


def test_values_pyyaml_writes_its_own_way_still_are() -> None:
    import datetime

    value = {"when": datetime.datetime(2026, 11, 27, 8, 0), "pair": (1, 2), "set": {1, 2}}
    assert _dumped(value, yamlcodec.Dumper, DUMPS[0]) == _dumped(value, yaml.CSafeDumper, DUMPS[0])
    with pytest.raises(yaml.representer.RepresenterError):
        yaml.dump({"x": object()}, Dumper=yamlcodec.Dumper)


@settings(max_examples=300, deadline=None)
@given(_plain_values(allow_nan=True), st.sampled_from(DUMPS))
def test_random_values_are_written_as_pyyaml_writes_them(
    value: object, options: dict[str, Any]
) -> None:
    assert _dumped(value, yamlcodec.Dumper, options) == _dumped(value, yaml.CSafeDumper, options)


def test_plain_values_are_written_without_pyyamls_representer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    used: list[object] = []
    generic = yaml.representer.BaseRepresenter.represent_data

    def recorded(self: yaml.representer.BaseRepresenter, data: Any) -> yaml.Node:
        used.append(data)
        return generic(self, data)

    monkeypatch.setattr(yaml.representer.BaseRepresenter, "represent_data", recorded)
    yaml.dump({"a": [1, "b", None, 2.5, {"c": True}]}, Dumper=yamlcodec.Dumper, sort_keys=False)
    assert used == []
    yaml.dump({"a": (1,)}, Dumper=yamlcodec.Dumper, sort_keys=False)  # a tuple: PyYAML's own
    assert used != []


@pytest.mark.parametrize("depth", [50, 100, 400])
def test_a_deep_value_is_written_or_refused_as_by_pyyaml(depth: int) -> None:
    """PyYAML's representer recurses about three frames a level: a value deep enough fails
    with RecursionError, with gctl's dumper as with PyYAML's."""
    nested: list[Any] = []
    for _ in range(depth):
        nested = [nested]

    def dumped(dumper: type[Any]) -> str:
        try:
            return _dumped(nested, dumper, DUMPS[0])
        except RecursionError:
            return "RecursionError"

    assert dumped(yamlcodec.Dumper) == dumped(yaml.CSafeDumper)

"""YAML read and written as PyYAML's safe loader and dumper do, with less of it in Python.

libyaml parses, composes and emits in C, but PyYAML builds the Python values from the nodes, and
the nodes from the values, with generic machinery in Python (generators and per-node state in
the constructor, a lookup by type and alias bookkeeping per value in the representer), and the C
composer and emitter call its Python resolver back for every node. Manifests and `get -o yaml`
hold plain mappings, lists and scalars: those are built here by one recursive walk each, and
the resolver is the safe loader's without its steps for path resolvers (it has none). Anything
else (a merge key, a tag such as `!!set`, a mapping as a key, a value that holds itself, an
object met twice on the dump side, a document too deep to recurse) goes to PyYAML's own code
from the start, so every document reads and writes exactly as with PyYAML's; so does a document
the walk finds an error in, so that the error is the one PyYAML meets first, in its order. One
difference: a `!!bool` or `!!timestamp` scalar that is not one is a YAML error saying where,
where PyYAML's own constructors raise a KeyError or an AttributeError.
"""

import re
from typing import Any

import yaml

_TAG = "tag:yaml.org,2002:"
STR, MAP, SEQ = f"{_TAG}str", f"{_TAG}map", f"{_TAG}seq"
# The scalars whose constructors are plain functions of the node (the rest are generators).
_SCALARS = frozenset(f"{_TAG}{name}" for name in ("null", "bool", "int", "float", "timestamp"))
_PLAIN_KEYS = _SCALARS | {STR}
_ANY_FIRST: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    yaml.SafeLoader.yaml_implicit_resolvers.get(None, [])
)
_IMPLICIT = {  # by a plain scalar's first character, in the order the safe loader tries them
    first: (*found, *_ANY_FIRST)
    for first, found in yaml.SafeLoader.yaml_implicit_resolvers.items()
    if first is not None
}


class _Unusual(Exception):
    """A value that the walks here leave to PyYAML's own code."""


class _Resolving:
    """The safe resolver, less the steps for path resolvers (none are registered)."""

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode:
            if implicit[0]:
                for tag, pattern in _IMPLICIT.get(value[:1], _ANY_FIRST):
                    if pattern.match(value):
                        return str(tag)
            return STR
        return MAP if kind is yaml.MappingNode else SEQ

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass

    def ascend_resolver(self) -> None:
        pass


class Loader(_Resolving, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A safe loader that refuses a key given twice in one mapping, as Kubernetes does."""

    def construct_document(self, node: yaml.Node) -> Any:
        try:
            return self._plain(node, {}, set())
        except Exception:  # an error too: PyYAML's constructor says the one it meets first
            return super().construct_document(node)

    def construct_yaml_bool(self, node: yaml.ScalarNode) -> bool:
        """A `!!bool` scalar, or an error saying where it is not one (PyYAML's KeyError)."""
        try:
            value: bool = super().construct_yaml_bool(node)
        except KeyError:
            raise _not_a(node, "boolean") from None
        return value

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        """A `!!timestamp` scalar, or an error saying where it is not one (PyYAML's
        AttributeError)."""
        try:
            return super().construct_yaml_timestamp(node)
        except (AttributeError, TypeError):
            raise _not_a(node, "timestamp") from None

    def _plain(self, node: yaml.Node, built: dict[int, Any], open_: set[int]) -> Any:
        """`node` as PyYAML's safe constructor builds it: an alias (the same node met again)
        is the same object, as there."""
        tag = node.tag
        if isinstance(node, yaml.ScalarNode) and tag == STR:
            return node.value
        key = id(node)
        if key in built:
            return built[key]
        if isinstance(node, yaml.ScalarNode):
            if tag not in _SCALARS:
                raise _Unusual
            built[key] = self.yaml_constructors[tag](self, node)
            return built[key]
        if key in open_:  # a node that holds itself
            raise _Unusual
        open_.add(key)
        result: Any
        if isinstance(node, yaml.SequenceNode) and tag == SEQ:
            result = [self._plain(item, built, open_) for item in node.value]
        elif isinstance(node, yaml.MappingNode) and tag == MAP:
            refuse_repeated_keys(node)
            result = {}
            for key_node, value_node in node.value:
                if type(key_node) is not yaml.ScalarNode or key_node.tag not in _PLAIN_KEYS:
                    raise _Unusual  # a merge key (<<), a mapping as a key ...
                result[self._plain(key_node, built, open_)] = self._plain(value_node, built, open_)
        else:
            raise _Unusual
        open_.discard(key)
        built[key] = result
        return result

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        refuse_repeated_keys(node)
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result


def refuse_repeated_keys(node: yaml.MappingNode) -> None:
    # Compare the keys as written: constructing each key here would double the load time.
    keys = [key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode)]
    if len(set(keys)) == len(keys):
        return
    seen: set[str] = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key_node.value!r} appears twice in one mapping",
                key_node.start_mark,
            )
        seen.add(key_node.value)


# The scalar types the safe representer writes with a plain function of the value.
_SCALAR_TYPES = frozenset({type(None), bool, int, float})


def _not_a(node: yaml.ScalarNode, what: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(
        None, None, f"{node.value!r} is not a {what}", node.start_mark
    )


Loader.add_constructor(f"{_TAG}bool", Loader.construct_yaml_bool)
Loader.add_constructor(f"{_TAG}timestamp", Loader.construct_yaml_timestamp)

# Deeper than this, a value is made into nodes by PyYAML's representer, which fails where it
# always failed (its recursion goes about three frames a level, the walk here one).
_DEPTH = 64


class Dumper(_Resolving, getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """The safe dumper; a document of plain dicts, lists and scalars, none of its dicts and
    lists met twice, is made into nodes by one walk. Keys keep their order only (`sort_keys`
    true: PyYAML's own representer)."""

    def represent(self, data: Any) -> None:
        try:
            if self.sort_keys:
                raise _Unusual
            node = self._node(data, set(), 0)
        except _Unusual:
            # BaseRepresenter.represent's own steps, here: a call to it would take one more
            # frame of the stack that its recursion fills, and fail a level earlier.
            node = self.represent_data(data)
            self.represented_objects: dict[int, yaml.Node] = {}
            self.object_keeper: list[Any] = []
            self.alias_key = None
        self.serialize(node)

    def _node(self, data: Any, seen: set[int], depth: int) -> yaml.Node:
        """The node SafeRepresenter makes of `data` (its `represent_data`)."""
        kind = type(data)
        if kind is str:
            return yaml.ScalarNode(STR, data, style=self.default_style)
        if kind in _SCALAR_TYPES:
            node: yaml.Node = self.yaml_representers[kind](self, data)
            return node
        if kind is not dict and kind is not list:
            raise _Unusual
        if id(data) in seen or depth > _DEPTH:  # PyYAML writes an anchor and an alias
            raise _Unusual
        seen.add(id(data))
        best_style = True
        collection: yaml.CollectionNode
        if kind is dict:
            pairs: list[tuple[yaml.Node, yaml.Node]] = []
            collection = yaml.MappingNode(MAP, pairs)
            for key, value in data.items():
                key_node = self._node(key, seen, depth + 1)
                value_node = self._node(value, seen, depth + 1)
                best_style = best_style and _plain_scalar(key_node) and _plain_scalar(value_node)
                pairs.append((key_node, value_node))
        else:
            items: list[yaml.Node] = []
            collection = yaml.SequenceNode(SEQ, items)
            for value in data:
                item = self._node(value, seen, depth + 1)
                best_style = best_style and _plain_scalar(item)
                items.append(item)
        flow = self.default_flow_style
        collection.flow_style = best_style if flow is None else flow
        return collection


def _plain_scalar(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and not node.style

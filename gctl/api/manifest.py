"""Reading manifests: YAML/JSON files, directories and stdin into validated objects.

Every failure is an `errors.Invalid` whose message is one line naming the file, the document,
the object and the field path, so the CLI can print it as it is.
"""

import functools
import json
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from gctl.api import dependencies, errors, kinds, meta, names, yamlcodec

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
T = TypeVar("T")


@dataclass(frozen=True)
class Source:
    file: str
    document: int  # 1-based, as a person counts documents in a file

    def __str__(self) -> str:
        return f"{self.file}: document {self.document}"


@dataclass(frozen=True)
class Manifest:
    source: Source
    obj: meta.Resource


def read_sources(paths: list[str], recursive: bool, stdin_text: str = "") -> list[tuple[str, str]]:
    """Return (display name, text) for each file the paths name, in a stable order. `-` is
    stdin, which the caller reads (`stdin_text`: the CLI's `following.read_stdin`), once: a
    second `-` is empty."""
    found: list[tuple[str, str]] = []
    for path in paths:
        if path == STDIN:
            found.append(("<stdin>", stdin_text))
            stdin_text = ""
            continue
        target = Path(path)
        if target.is_dir():
            # In the order of their paths' parts, as pathlib sorts paths (`a/b` before `a-c`).
            files = sorted(_manifest_files(target, recursive), key=lambda f: f.split(os.sep))
            if not files:
                where = "or below it" if recursive else "(add -R to look in subdirectories)"
                raise errors.Invalid(f"{path}: no .yaml, .yml or .json files in it {where}")
            found.extend((file, _read_file(file)) for file in files)
        elif target.exists():
            found.append((path, _read_file(target)))
        else:
            raise errors.Invalid(f"{path}: no such file or directory")
    return found


def _read_file(path: str | Path) -> str:
    """The file's text, its line ends made `\n` as a file opened as text reads them (read as
    bytes and decoded: a third of the time)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.Invalid(f"{path}: cannot read: {exc}") from None
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _manifest_files(root: Path, recursive: bool) -> Iterator[str]:
    """The files' paths as pathlib writes them (`./m` as `m`)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if recursive else []
        directory = Path(dirpath)
        for filename in filenames:
            if filename.endswith(MANIFEST_SUFFIXES) and not filename.startswith("."):
                yield str(directory / filename)


def parse(file: str, text: str) -> list[Manifest]:
    """Parse and validate every document of one file. Relative paths in the objects (a Job's
    workingDir, a Sweep's) are made absolute against the file's directory, or the current one
    when `file` names no file (`<stdin>`, `gctl run`)."""
    # Asked for where a path is relative, and worked out once: a List of 500 Jobs is one file.
    directory = _once(functools.partial(_directory_of, file))
    document = _json_document(text)
    if document is not None:
        return list(_objects(Source(file, 1), document, directory))
    manifests: list[Manifest] = []
    documents = yaml.load_all(text, Loader=yamlcodec.Loader)
    index = 0
    while True:
        try:
            document = next(documents)
        except StopIteration:
            break
        except yaml.YAMLError as exc:
            raise errors.Invalid(f"{file}: document {index + 1}: {_yaml_problem(exc)}") from None
        except ValueError as exc:  # a scalar the constructors refuse: an int of 5,000 digits
            why = str(exc).split(";")[0]  # not Python's advice on sys.set_int_max_str_digits
            raise errors.Invalid(f"{file}: document {index + 1}: invalid value: {why}") from None
        index += 1
        if document is None:
            continue
        source = Source(file, index)
        manifests.extend(_objects(source, document, directory))
    return manifests


def _once(work: Callable[[], T]) -> Callable[[], T]:
    """`work`, done at its first call only (functools.cache costs more to make, once a file)."""
    done: list[T] = []

    def result() -> T:
        if not done:
            done.append(work())
        return done[0]

    return result


def _directory_of(file: str) -> str | None:
    """The directory a manifest's relative paths are relative to, as the kernel finds it
    (symlinks resolved, as `gctl sync` resolves its directory and `gctl run` stores the current
    one): `l/job.yaml` through a link `l` and `job.yaml` in its target store the same path, and
    `../data` past a link means what it means to the agent's chdir, not what dropping the
    link's name would. None if the current directory is gone (an error only for a manifest
    that has a relative path)."""
    try:
        return os.path.realpath(os.path.dirname(file))  # "" (`<stdin>`): the current one
    except OSError:
        return None


def _json_document(text: str) -> object | None:
    """The document, if `text` is one JSON object (a `kind: List` of 500 Jobs parses about 25
    times faster than as YAML); None for anything else, which the YAML parser then reads (and
    explains, if it is broken)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        document: object = json.loads(text, object_pairs_hook=_unique_keys)
    except ValueError:  # not JSON after all (or a key twice): YAML says where
        return None
    return document


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise ValueError("a key appears twice in one mapping")
    return document


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {exc.problem}"
    return f"invalid YAML: {exc}"


def _objects(source: Source, document: object, directory: meta.Directory) -> Iterator[Manifest]:
    if not isinstance(document, dict):
        raise errors.Invalid(
            f"{source}: expected a mapping with apiVersion, kind, metadata and spec, "
            f"found {type(document).__name__}"
        )
    if document.get("kind") == "List" and isinstance(document.get("items"), list):
        for position, item in enumerate(document["items"]):
            if not isinstance(item, dict):
                raise errors.Invalid(f"{source}: items[{position}]: expected a mapping")
            yield Manifest(source, _validate(source, item, f"items[{position}].", directory))
        return
    yield Manifest(source, _validate(source, document, "", directory))


def _validate(
    source: Source, document: dict[str, Any], prefix: str, directory: meta.Directory
) -> meta.Resource:
    what = _describe(document)
    where = f"{source} ({what})" if what else str(source)
    api_version = document.get("apiVersion")
    if api_version != kinds.API_VERSION:
        found = "is missing" if api_version is None else f"is {api_version!r}"
        raise errors.Invalid(f"{where}: {prefix}apiVersion {found}: use {kinds.API_VERSION}")
    kind = document.get("kind")
    if kind not in kinds.APPLIABLE:
        known = ", ".join(sorted(kinds.APPLIABLE))
        found = "is missing" if kind is None else f"{kind!r} is not a kind you can apply"
        raise errors.Invalid(f"{where}: {prefix}kind {found} (known: {known})")
    cls = kinds.model(kind)
    body = {key: value for key, value in document.items() if key != "status"}
    unstorable = _holds(body, _unstorable)  # one walk: a document holds none almost always
    if unstorable and (path := _first_path(body, _holds_nul)) is not None:
        raise errors.Invalid(
            f"{where}: {prefix}{path}: contains a NUL character, which no command, "
            "environment variable or database can hold"
        )
    try:
        obj = cls.model_validate(body, by_alias=True, by_name=False, context=meta.INPUT)
    except pydantic.ValidationError as exc:
        raise errors.Invalid(f"{where}: {first_error(exc, prefix)}") from None
    # A number: refused after the fields' own checks, which say it better where a field has a
    # range, and only where it is stored as a number (a Sweep's items are stored as text); the
    # stored form is walked only where the manifest holds one.
    if unstorable and (path := _first_path(obj.wire(), _unstored_number)) is not None:
        raise errors.Invalid(f"{where}: {prefix}{path}: {_UNSTORED_NUMBER}")
    name_check = names.check_dns_label if cls.NAMESPACED else names.check_dns_subdomain
    field = "metadata.name"
    try:
        name_check(obj.metadata.name)
        if obj.metadata.namespace is not None:
            field = "metadata.namespace"
            names.check_dns_label(obj.metadata.namespace)
    except ValueError as exc:
        raise errors.Invalid(f"{where}: {prefix}{field}: {exc}") from None
    if not cls.NAMESPACED:
        obj.metadata.namespace = None
    try:  # stored resolved: the same file applies `unchanged` from any directory
        obj.resolve_paths(directory)
    except meta.FieldError as exc:
        raise errors.Invalid(f"{where}: {prefix}{exc.path}: {exc.message}") from None
    # A name in dependsOn is a Job first, then a Sweep: a Sweep naming itself may mean a Job
    # of that name, so it is `load`'s to judge, with every object of the apply at hand.
    for field, needed in obj.waits_for():
        if needed == obj.name and obj.KIND == dependencies.JOB:
            raise errors.Invalid(
                f"{where}: {prefix}{field}: names this {kind} itself: it would wait for "
                f"itself for ever; remove {needed!r}"
            )
    return obj


def _first_path(value: Any, bad: Callable[[Any], bool]) -> str | None:
    """The field path of the first key or value in `value` that `bad` says is so, if any.
    Looked for without paths first: a document holds none almost always, and making the path
    of every field is most of the walk."""
    return _path_of(value, "", bad) if _holds(value, bad) else None


def _holds(value: Any, bad: Callable[[Any], bool]) -> bool:
    """Whether a key or value in `value` is one that `bad` says is so. (Loops: `any` over a
    generator costs every mapping and list a generator, half the walk's time.)"""
    if isinstance(value, dict):
        for key, item in value.items():  # noqa: SIM110
            if bad(key) or _holds(item, bad):
                return True
        return False
    if isinstance(value, list):
        for item in value:  # noqa: SIM110
            if _holds(item, bad):
                return True
        return False
    return bad(value)


def _path_of(value: Any, path: str, bad: Callable[[Any], bool]) -> str | None:
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if bad(key):
                return here
            if (found := _path_of(item, here, bad)) is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            if (found := _path_of(item, f"{path}[{index}]", bad)) is not None:
                return found
        return None
    return path if bad(value) else None


def _holds_nul(value: Any) -> bool:
    return isinstance(value, str) and "\x00" in value


def _unstorable(value: Any) -> bool:
    """What no database holds as given: a string with a NUL, or a number gctl cannot store."""
    return _holds_nul(value) or _unstored_number(value)


# Stored numbers are JSON's as Kubernetes reads it: 64-bit integers and finite doubles
# (gctl.store.jsontext).
INT64 = range(-(2**63), 2**63)
_UNSTORED_NUMBER = (
    f"is a number gctl does not store: an integer from {INT64.start} to {INT64.stop - 1}, "
    "or a finite decimal (quoted, it is text)"
)


def _unstored_number(value: Any) -> bool:
    """An integer beyond 64 bits, NaN or an infinity: JSON as gctl stores it holds none."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value not in INT64
    return isinstance(value, float) and not math.isfinite(value)


def _describe(document: dict[str, Any]) -> str:
    kind = document.get("kind")
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    kind_text = kind if isinstance(kind, str) else ""
    if isinstance(name, str):
        return f'{kind_text} "{name}"'.strip()
    return kind_text


_MESSAGES = {
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
}


def first_error(exc: pydantic.ValidationError, prefix: str) -> str:
    """pydantic's first error in one line: `prefix`, the field's path, what is wrong. An
    unknown field comes first: a misspelt field (`comand`) is also a required one missing, and
    the misspelling is what to fix."""
    errs = exc.errors(include_url=False)
    first = next((e for e in errs if e["type"] == "extra_forbidden"), errs[0])
    path = _path(first["loc"])
    message = _MESSAGES.get(first["type"]) or _message(first["msg"])
    part = first.get("ctx", {}).get("error")
    if isinstance(part, meta.FieldError):  # about a part of the field: name that part
        path = _joined(path, part.path)
        message = part.message
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{prefix}{path}: {message}{more}"


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            continue
        else:
            text += f".{part}" if text else part
    return text


def _joined(path: str, part: str) -> str:
    if not path or part.startswith("["):
        return path + part
    return f"{path}.{part}"


def _message(raw: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        raw = raw.removeprefix(prefix)
    raw = raw.replace("Input should be", "must be")
    # pydantic's "List should have at least 1 item after validation, not 0" ("Value" when
    # the constraint is on a type its own validator reads, such as a pool's GPU indices)
    raw = re.sub(r"^(List|Dictionary|Value) should have", "must have", raw)
    return raw.replace(" after validation", "")


def load(paths: list[str], recursive: bool, namespace: str, stdin_text: str = "") -> list[Manifest]:
    """Read, validate and namespace every object the paths name; refuse duplicates, and
    sources with no object at all (as kubectl refuses "no objects passed to apply")."""
    try:
        names.check_dns_label(namespace)
    except ValueError as exc:
        raise errors.Invalid(f"namespace: {exc}") from None
    manifests: list[Manifest] = []
    for file, text in read_sources(paths, recursive, stdin_text):
        manifests.extend(parse(file, text))
    if not manifests:
        given = ", ".join("<stdin>" if p == STDIN else p for p in paths)
        raise errors.Invalid(f"{given}: no objects in it (empty, or only comments)")
    seen: dict[tuple[str, str, str], Source] = {}
    for manifest in manifests:
        obj = manifest.obj
        if obj.NAMESPACED and obj.metadata.namespace is None:
            obj.metadata.namespace = namespace
        key = (obj.KIND, obj.namespace, obj.name)
        if key in seen:
            raise errors.Invalid(
                f'{manifest.source} ({obj.KIND} "{obj.name}"): metadata.name: '
                f"{obj.KIND} {obj.name!r} is already defined in {seen[key]}"
            )
        seen[key] = manifest.source
    _refuse_cycles(manifests)
    return manifests


def _refuse_cycles(manifests: list[Manifest]) -> None:
    """Refuse a dependsOn cycle made only of objects of this apply: no Job on it could ever
    start. A cycle closed through objects already stored is the Job controller's to find
    (reason DependencyCycle), as a cycle can be made over several applies."""
    graphs: dict[str, dict[str, dependencies.Waiter]] = {}
    by_name: dict[tuple[str, str], Manifest] = {}
    # A name in dependsOn is a Job first, then a Sweep: Jobs go into the graph first.
    for m in sorted(manifests, key=lambda m: m.obj.KIND != dependencies.JOB):
        if m.obj.KIND not in (dependencies.JOB, dependencies.SWEEP):
            continue
        graph = graphs.setdefault(m.obj.namespace, {})
        if m.obj.name not in graph:
            needs = tuple(name for _, name in m.obj.waits_for())
            graph[m.obj.name] = dependencies.Waiter(m.obj.KIND, needs)
            by_name[(m.obj.namespace, m.obj.name)] = m
    for namespace, graph in graphs.items():
        order = [m.obj.name for m in manifests if m.obj.namespace == namespace]
        found = dependencies.cycle_in(graph, order)
        if found is None:
            continue
        first = by_name[(namespace, found[0])]
        field = next(f for f, name in first.obj.waits_for() if name == found[1])
        raise errors.Invalid(
            f'{first.source} ({first.obj.KIND} "{first.obj.name}"): {field}: makes a dependency '
            f"cycle {dependencies.describe(namespace, found, graph)}, so none of it could ever "
            "start: remove one of these dependsOn"
        )

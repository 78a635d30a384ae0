"""Sweep: one Job per item, config file or matrix point, from a Job template.

Beside the model live the pure rules that `apply` and the Sweep controller share: expanding a
Sweep into its points, naming each point's Job, filling `{placeholders}`, rendering a child Job,
counting progress, and what a dependency on a Job or a Sweep means for a Job that waits on it.
Globbing `files` is I/O: the controller does it and passes the paths in.
"""

import glob
import hashlib
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePath
from typing import Annotated, ClassVar, Literal

from pydantic import Field, PlainValidator, ValidationInfo, field_validator, model_validator

from gctl.api import job, kinds, meta

SweepPhase = Literal["Pending", "Running", "Succeeded", "Failed"]

LABEL = "gctl/sweep"  # on every child: `gctl get jobs -l gctl/sweep=NAME`
POINT_ANNOTATION = "gctl/sweep-point"  # the item, file or matrix point a child runs
# Held while a Sweep has children: deleting it deletes them (and stops those running) first.
FINALIZER = "gctl/children"
MAX_POINTS = 10_000
MAX_NAME = 63
HASH_LENGTH = 6

CONDITION_COMPLETE = "Complete"
CONDITION_FAILED = "Failed"
REASON_COMPLETED = "Completed"
REASON_CHILDREN_FAILED = "ChildrenFailed"
REASON_NO_FILES = "NoFilesMatched"
REASON_NAME_TAKEN = "NameTaken"

AGENT_PLACEHOLDERS = frozenset({"gpus"})  # left for the agent: the GPUs bound at run time
RESERVED = frozenset({"item", "file", "stem", "index"}) | AGENT_PLACEHOLDERS
# `{{name}}` is a literal `{name}`; `${name}` is the shell's and never a placeholder.
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_]\w*)\}\}|(?<!\$)\{([A-Za-z_]\w*)\}")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NOT_SLUG = re.compile(r"[^a-z0-9]+")


def _check_value(value: object, info: ValidationInfo) -> str | int | float | bool:
    """A matrix value or an item: a string, a number or a boolean (one message, not one per
    type it could have been). A number must be finite in what users give; a Sweep an older
    gctl stored with `.nan` in its matrix (SQLite holds it) still reads."""
    if not isinstance(value, str | int | float):  # bool is an int
        raise ValueError("must be a string, number or boolean")
    if isinstance(value, float) and not math.isfinite(value) and meta.is_input(info):
        raise ValueError("must be a finite number")
    return value


def _item_text(value: object, info: ValidationInfo) -> str:
    """An item as it goes into names and `{item}`: a number or boolean as a matrix value is."""
    return text(_check_value(value, info))


MatrixValue = Annotated[str | int | float | bool, PlainValidator(_check_value)]
Item = Annotated[str, PlainValidator(_item_text)]


class TemplateMeta(meta.Model):
    labels: meta.Labels = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class JobTemplate(meta.Model):
    metadata: TemplateMeta = Field(default_factory=TemplateMeta)
    spec: job.JobSpec


class SweepSpec(meta.Model):
    """Exactly one of `items`, `files` (a glob) or `matrix` says what the Jobs differ in."""

    items: list[Item] | None = Field(default=None, min_length=1, max_length=MAX_POINTS)
    files: str | None = Field(default=None, min_length=1)
    matrix: dict[str, list[MatrixValue]] | None = None
    template: JobTemplate
    max_parallel: int | None = Field(default=None, ge=1)
    depends_on: list[meta.DNSLabel] = Field(default_factory=list)

    @field_validator("items")
    @classmethod
    def _distinct_items(cls, items: list[str] | None) -> list[str] | None:
        if items is not None and len(set(items)) != len(items):
            twice = next(i for i in items if items.count(i) > 1)
            raise ValueError(f"lists {twice!r} twice")
        return items

    @field_validator("matrix")
    @classmethod
    def _matrix_shape(
        cls, matrix: dict[str, list[MatrixValue]] | None
    ) -> dict[str, list[MatrixValue]] | None:
        if matrix is None:
            return None
        if not matrix:
            raise ValueError("must name at least one parameter")
        size = 1
        for key, values in matrix.items():
            if not _KEY.match(key) or key in RESERVED:
                raise meta.FieldError(
                    key,
                    "a parameter is a letter or _ then letters, digits or _, and not one of "
                    f"{', '.join(sorted(RESERVED))}",
                )
            if not values:
                raise meta.FieldError(key, "list at least one value")
            if len({text(v) for v in values}) != len(values):
                raise meta.FieldError(key, "lists a value twice")
            size *= len(values)
        if size > MAX_POINTS:
            raise ValueError(f"makes {size} Jobs; at most {MAX_POINTS}")
        return matrix

    @field_validator("depends_on")
    @classmethod
    def _distinct_dependencies(cls, depends: list[str]) -> list[str]:
        if len(set(depends)) != len(depends):
            raise ValueError("names a dependency twice")
        return depends

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "SweepSpec":
        given = [f for f in ("items", "files", "matrix") if getattr(self, f) is not None]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one of items, files or matrix (found: {found})")
        if self.template.spec.ttl_seconds_after_finished is not None:
            # A point whose Job is gone has no Job: the Sweep would create and run it again.
            raise meta.FieldError(
                "template.spec.ttlSecondsAfterFinished",
                "not allowed in a Sweep: its Jobs are deleted with the Sweep (a deleted Job "
                "would be created and run again)",
            )
        if meta.is_input(info):  # its Jobs' annotations, as a Job's own are checked
            try:
                job.simulated_run(self.template.metadata.annotations)
            except meta.FieldError as exc:
                raise meta.FieldError(f"template.{exc.path}", exc.message) from None
        known = placeholders(self)
        for path, value in templated(self.template.spec):
            fill(value, dict.fromkeys(known, ""), f"template.spec.{path}")
        directory = self.template.spec.working_dir
        if self.files is not None and directory and has_placeholders(directory):
            raise meta.FieldError(
                "template.spec.workingDir",
                "has placeholders, but a files glob is expanded against it: write it without "
                "placeholders, or make files absolute",
            )
        if self.items is not None:
            _check_distinct_names(
                None, [(f"items[{i}]", slug(v)) for i, v in enumerate(self.items)]
            )
        if self.matrix is not None:
            _check_distinct_names("matrix", [(p.label, p.slug) for p in points(self, None)])
        return self


class SweepStatus(meta.Model):
    phase: SweepPhase = "Pending"
    observed_generation: int | None = None
    conditions: list[meta.Condition] = Field(default_factory=list)
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    running: int = 0  # Scheduled or Running
    pending: int = 0  # waiting in the queue, or not created yet (maxParallel)
    reason: str | None = None
    message: str | None = None
    completion_time: datetime | None = None


class Sweep(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.SWEEP

    kind: Literal["Sweep"] = "Sweep"
    spec: SweepSpec
    status: SweepStatus = Field(default_factory=SweepStatus)

    def waits_for(self) -> list[tuple[str, str]]:
        """What its Jobs wait for: the template's dependsOn and its own (`render_spec`)."""
        template = self.spec.template.spec.depends_on
        return [
            *((f"spec.template.spec.dependsOn[{i}]", name) for i, name in enumerate(template)),
            *((f"spec.dependsOn[{i}]", name) for i, name in enumerate(self.spec.depends_on)),
        ]

    def resolve_paths(self, directory: meta.Directory) -> None:
        """A relative template workingDir is the manifest's directory's, as a Job's. So is a
        relative files glob with no workingDir to be relative to (it was the controller's
        directory): it is stored absolute, so that the controller globs there wherever it
        runs, and `{file}` names the file wherever the Jobs run. A glob relative to a
        workingDir stays relative, as `{file}` is then relative to where the Jobs run."""
        template = self.spec.template.spec
        # The directory goes in front of placeholders: written so that it fills as itself.
        template.working_dir = job.absolute(
            template.working_dir,
            lambda: _written(directory(), literal),
            "spec.template.spec.workingDir",
        )
        if self.spec.files is not None and not template.working_dir:
            self.spec.files = job.absolute(
                self.spec.files, lambda: _written(directory(), glob.escape), "spec.files"
            )


def _written(directory: str | None, write: Callable[[str], str]) -> str | None:
    return None if directory is None else write(directory)


# -- points and names --------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One Job of a Sweep: what its placeholders are filled with, and what names it."""

    index: int
    slug: str  # the part of the Job's name after `<sweep>-`, before any hash
    identity: str  # what makes the point unique; hashed when the name needs a suffix
    values: Mapping[str, str]
    label: str  # as a person reads it: `0.001`, `configs/a.yaml`, `bs=16,lr=0.001`
    hashed: bool = False  # a suffix is needed whatever the length (a slug two files share)


def text(value: MatrixValue) -> str:
    """A matrix value as it goes into a command: YAML's `true` stays `true`, not `True`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def slug(value: str) -> str:
    """Lowercase, every run of other characters than [a-z0-9] one `-`: `LR=0.01` -> `lr-0-01`."""
    return _NOT_SLUG.sub("-", value.lower()).strip("-")


def placeholders(spec: SweepSpec) -> frozenset[str]:
    """The placeholders a template of this Sweep may use (besides the agent's `{gpus}`)."""
    if spec.items is not None:
        return frozenset({"item", "index"})
    if spec.files is not None:
        return frozenset({"file", "stem", "index"})
    return frozenset({*(spec.matrix or {}), "index"})


def points(spec: SweepSpec, files: Sequence[str] | None) -> list[Point]:
    """The Sweep's points in order: items as listed, files sorted, matrix keys sorted (the
    first key varies slowest). `files` are the glob's matches, for a files Sweep."""
    if spec.items is not None:
        return [
            Point(i, slug(item), item, {"item": item, "index": str(i)}, item)
            for i, item in enumerate(spec.items)
        ]
    if spec.files is not None:
        return _file_points(sorted(set(files or [])))
    matrix = spec.matrix or {}
    keys = sorted(matrix)
    found = []
    for i, combination in enumerate(itertools.product(*(matrix[k] for k in keys))):
        values = {k: text(v) for k, v in zip(keys, combination, strict=True)}
        label = ",".join(f"{k}={v}" for k, v in values.items())
        point_slug = "-".join(slug(f"{k}{v}") for k, v in values.items())
        found.append(Point(i, point_slug, label, values | {"index": str(i)}, label))
    return found


def _file_points(files: list[str]) -> list[Point]:
    stems = [PurePath(f).stem for f in files]
    slugs = [slug(s) for s in stems]
    found = []
    for i, (file, stem, file_slug) in enumerate(zip(files, stems, slugs, strict=True)):
        # Two files with one stem (a.yaml, a.json): both take a hash of their path, so that
        # neither name depends on whether the other exists.
        shared = slugs.count(file_slug) > 1
        values = {"file": file, "stem": stem, "index": str(i)}
        found.append(Point(i, file_slug, file, values, file, hashed=shared))
    return found


def child_name(sweep_name: str, point: Point) -> str:
    """`<sweep>-<slug>`; with `-<6 hex of the point>` instead when the slug is empty, shared,
    or the name would pass 63 characters (then cut to fit). Depends on the point alone, so a
    point keeps its Job's name whatever else the Sweep holds."""
    name = f"{sweep_name}-{point.slug}" if point.slug else sweep_name
    if point.slug and not point.hashed and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(point.identity.encode()).hexdigest()[:HASH_LENGTH]
    head = name[: MAX_NAME - HASH_LENGTH - 1].rstrip("-")
    return f"{head}-{digest}"


def _check_distinct_names(field: str | None, slugs: list[tuple[str, str]]) -> None:
    """Two points whose slugs agree would share one Job: refuse the second at apply, by its
    path (`items[1]`), or under `field` by its values (`matrix`: `a=x_y`)."""
    seen: dict[str, str] = {}
    for where, value_slug in slugs:
        if value_slug and value_slug in seen:  # empty slugs are hashed apart
            problem = (
                f"gives the Job name of {seen[value_slug]} (...-{value_slug}): make them "
                "differ in letters or digits"
            )
            if field is None:
                raise meta.FieldError(where, problem)
            raise meta.FieldError(field, f"{where} {problem}")
        seen[value_slug] = where


# -- placeholders and children -----------------------------------------------------------------


def templated(spec: job.JobSpec) -> Iterator[tuple[str, str]]:
    """(field path, text) of every template field placeholders may appear in."""
    if isinstance(spec.command, str):
        yield "command", spec.command
    else:
        for i, arg in enumerate(spec.command):
            yield f"command[{i}]", arg
    for key, value in spec.env.items():
        yield f"env.{key}", value
    if spec.working_dir is not None:
        yield "workingDir", spec.working_dir
    if spec.success_file is not None:
        yield "successFile", spec.success_file


def fill(value: str, values: Mapping[str, str], where: str) -> str:
    """Replace `{name}` with its value; `{gpus}` stays for the agent, `{{name}}` becomes
    `{name}`. An unknown name is a ValueError naming the field and the known names."""

    def replace(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return "{" + match.group(1) + "}"
        name = match.group(2)
        if name in AGENT_PLACEHOLDERS:
            return match.group(0)
        if name in values:
            return values[name]
        known = ", ".join(f"{{{k}}}" for k in sorted({*values, *AGENT_PLACEHOLDERS}))
        raise meta.FieldError(
            where,
            f"unknown placeholder {{{name}}}: use {known}, or {{{{{name}}}}} for a literal "
            f"{{{name}}}",
        )

    return _PLACEHOLDER.sub(replace, value)


def has_placeholders(value: str) -> bool:
    """Whether `fill` would put something in `value` (a `{{x}}` is a literal, no placeholder)."""
    return any(match.group(2) is not None for match in _PLACEHOLDER.finditer(value))


def literal(value: str) -> str:
    """`value` written so that `fill` gives it back unchanged: each `{x}` as `{{x}}`, each
    `{{x}}` as `{{{x}}}` (a directory's name may hold braces)."""
    return _PLACEHOLDER.sub(lambda match: "{" + match.group(0) + "}", value)


def render_spec(spec: SweepSpec, point: Point) -> job.JobSpec:
    """The template's Job spec for one point; the Sweep's dependsOn added to the template's."""
    template = spec.template.spec
    values = point.values
    command: list[str] | str
    if isinstance(template.command, str):
        command = fill(template.command, values, "command")
    else:
        command = [fill(arg, values, "command") for arg in template.command]
    env = {k: fill(v, values, f"env.{k}") for k, v in template.env.items()}
    directory = template.working_dir
    if directory is not None:
        directory = fill(directory, values, "workingDir")
    done = template.success_file
    if done is not None:
        done = fill(done, values, "successFile")
    depends = list(dict.fromkeys([*template.depends_on, *spec.depends_on]))
    return template.model_copy(
        update={
            "command": command,
            "env": env,
            "working_dir": directory,
            "success_file": done,
            "depends_on": depends,
        }
    )


def child(s: Sweep, point: Point) -> job.Job:
    """The Job a point of a Sweep runs: owned by the Sweep, labelled with its name."""
    template = s.spec.template.metadata
    metadata = meta.ObjectMeta(
        name=child_name(s.name, point),
        namespace=s.metadata.namespace,
        labels={**template.labels, LABEL: s.name},
        annotations={**template.annotations, POINT_ANNOTATION: point.label},
        owner_references=[meta.OwnerReference(kind=s.KIND, name=s.name, uid=s.metadata.uid or "")],
    )
    return job.Job(metadata=metadata, spec=render_spec(s.spec, point))


def owner(wire: Mapping[str, object]) -> tuple[str, str] | None:
    """(name, uid) of the Sweep that owns a Job, from its stored form; None if none does."""
    metadata = wire.get("metadata")
    refs = metadata.get("ownerReferences", []) if isinstance(metadata, dict) else []
    for ref in refs:
        if ref.get("kind") == Sweep.KIND and ref.get("controller", True):
            return str(ref["name"]), str(ref["uid"])
    return None


# -- progress ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    total: int
    succeeded: int
    failed: int
    running: int
    started: int = 0  # pending Jobs that have run before (in back-off, requeued): not counted above

    @property
    def pending(self) -> int:
        return self.total - self.succeeded - self.failed - self.running

    @property
    def phase(self) -> SweepPhase:
        """Like an Argo workflow: Succeeded when every Job succeeded, Failed once every Job
        has finished and some failed, Running once one has started (and still while one
        that ran waits to run again), else Pending."""
        if self.total and self.succeeded == self.total:
            return "Succeeded"
        if self.total and self.succeeded + self.failed == self.total:
            return "Failed"
        if self.succeeded + self.failed + self.running + self.started:
            return "Running"
        return "Pending"


def progress(total: int, phases: Iterable[str], started: int = 0) -> Progress:
    """Count the phases of the points' Jobs; a point with no Job yet is pending. `started`:
    how many pending ones have run before (QA: a Sweep went from Running back to Pending while
    its one Job waited out its back-off)."""
    counts = {"Succeeded": 0, "Failed": 0, "Running": 0}
    for phase in phases:
        key = "Running" if phase == "Scheduled" else phase
        if key in counts:
            counts[key] += 1
    return Progress(total, counts["Succeeded"], counts["Failed"], counts["Running"], started)


# -- dependencies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dependency:
    """What a name in `dependsOn` stands for now: a Job, a Sweep, or nothing yet."""

    name: str
    kind: str | None  # "Job", "Sweep", or None: no such object (yet)
    phase: str | None = None
    failed: int = 0  # a Sweep's failed Jobs
    total: int = 0


@dataclass(frozen=True)
class Verdict:
    state: Literal["ready", "waiting", "failed"]
    message: str = ""


def verdict(dependencies: Sequence[Dependency]) -> Verdict:
    """Slurm's afterok: fail when one dependency failed for good, wait while any has not
    succeeded (naming those that do not exist yet), else go."""
    waiting, missing = [], []
    for d in dependencies:
        if d.kind == Sweep.KIND and d.phase == "Failed":
            return Verdict(
                "failed",
                f"dependency sweep {d.name} failed ({d.failed}/{d.total} children failed)",
            )
        if d.kind is not None and d.phase == "Failed":
            return Verdict("failed", f"dependency {d.name} failed")
        if d.kind is None:
            missing.append(d.name)
        elif d.phase != "Succeeded":
            waiting.append(f"sweep {d.name}" if d.kind == Sweep.KIND else d.name)
    if not waiting and not missing:
        return Verdict("ready")
    message = f"waiting for {', '.join(waiting + missing)} to succeed"
    if missing:
        message += f" ({', '.join(missing)}: no such Job or Sweep yet)"
    return Verdict("waiting", message)

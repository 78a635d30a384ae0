"""Sweeps without a database: expansion, placeholders, child names, progress, the plan of one
reconcile, and what a dependency on a Job or a Sweep decides."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller import sweeps
from gctl.api import errors, manifest, sweep


def _spec(**fields: Any) -> sweep.SweepSpec:
    fields.setdefault("template", {"spec": {"command": ["run", "{item}"]}})
    return sweep.SweepSpec.model_validate(fields, by_alias=True, by_name=False)


def _sweep(name: str = "s", **fields: Any) -> sweep.Sweep:
    return sweep.Sweep(
        metadata={"name": name, "namespace": "default", "uid": "u-1"},
        spec=_spec(**fields),
    )


def _manifest_error(spec: str) -> str:
    text = f"apiVersion: gctl/v1\nkind: Sweep\nmetadata: {{name: lr}}\nspec: {spec}\n"
    with pytest.raises(errors.Invalid) as caught:
        manifest.parse("sweep.yaml", text)
    return str(caught.value)


# -- expansion ---------------------------------------------------------------------------------


def test_items_expand_in_order_with_their_index() -> None:
    points = sweep.points(_spec(items=["b", "a"]), None)
    assert [(p.values["item"], p.values["index"]) for p in points] == [("b", "0"), ("a", "1")]


def test_files_expand_sorted_with_file_and_stem() -> None:
    spec = _spec(files="c/*.yaml", template={"spec": {"command": "t {file} {stem}"}})
    points = sweep.points(spec, ["c/b.yaml", "c/a.yaml"])
    assert [dict(p.values) for p in points] == [
        {"file": "c/a.yaml", "stem": "a", "index": "0"},
        {"file": "c/b.yaml", "stem": "b", "index": "1"},
    ]


def test_a_matrix_is_the_product_with_keys_sorted() -> None:
    spec = _spec(
        matrix={"lr": [0.001, 0.01], "bs": [16, 32], "fp16": [True]},
        template={"spec": {"command": "t {lr} {bs} {fp16}"}},
    )
    points = sweep.points(spec, None)
    assert [p.label for p in points] == [
        "bs=16,fp16=true,lr=0.001",
        "bs=16,fp16=true,lr=0.01",
        "bs=32,fp16=true,lr=0.001",
        "bs=32,fp16=true,lr=0.01",
    ]
    assert sweep.child_name("grid", points[0]) == "grid-bs16-fp16true-lr0-001"


def test_files_expand_against_the_working_dir(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    for name in ("a.toml", "b.toml", "skip.txt"):
        (tmp_path / "configs" / name).write_text("")
    (tmp_path / "configs" / "dir.toml").mkdir()
    spec = _spec(files="configs/*.toml", template={"spec": {"command": "t {file}"}})
    assert sweeps.expand(spec, cwd=str(tmp_path)) == ["configs/a.toml", "configs/b.toml"]
    absolute = _spec(files=f"{tmp_path}/configs/a.*", template={"spec": {"command": "{file}"}})
    assert sweeps.expand(absolute) == [f"{tmp_path}/configs/a.toml"]


def test_a_glob_in_a_directory_named_with_braces_applies_again_and_expands(
    tmp_path: Path,
) -> None:
    """The manifest's directory goes in front of workingDir written as a literal (`{{x}}`):
    not a placeholder to refuse when applied again, and what the controller globs in."""
    project = tmp_path / "{x}"
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "a.toml").write_text("")
    text = (
        "apiVersion: gctl/v1\nkind: Sweep\nmetadata: {name: s}\nspec:\n  files: configs/*\n"
        "  template: {spec: {command: 't {file}', workingDir: .}}\n"
    )
    (parsed,) = manifest.parse(str(project / "s.yaml"), text)
    assert isinstance(parsed.obj, sweep.Sweep)
    (again,) = manifest.parse("<stdin>", yaml.safe_dump(parsed.obj.wire()))
    assert isinstance(again.obj, sweep.Sweep)
    assert again.obj.spec == parsed.obj.spec
    assert sweeps.expand(again.obj.spec) == ["configs/a.toml"]
    point = sweep.points(again.obj.spec, ["configs/a.toml"])[0]
    assert sweep.render_spec(again.obj.spec, point).working_dir == str(project)


# -- placeholders ------------------------------------------------------------------------------


def test_placeholders_fill_command_env_and_working_dir() -> None:
    spec = _spec(
        items=["x1"],
        template={
            "spec": {
                "command": "train {item} on {gpus} in ${HOME} {{item}}",
                "env": {"RUN": "run-{index}"},
                "workingDir": "/runs/{item}",
                "successFile": "out/{item}-{index}.done",
            }
        },
    )
    rendered = sweep.render_spec(spec, sweep.points(spec, None)[0])
    assert rendered.command == "train x1 on {gpus} in ${HOME} {item}"
    assert rendered.env == {"RUN": "run-0"}
    assert rendered.working_dir == "/runs/x1"
    assert rendered.success_file == "out/x1-0.done"


def test_a_files_sweep_fills_the_success_file_with_the_stem() -> None:
    spec = _spec(
        files="configs/*.yaml", template={"spec": {"command": "x", "successFile": "{stem}.done"}}
    )
    rendered = sweep.render_spec(spec, sweep.points(spec, ["configs/a.yaml"])[0])
    assert rendered.success_file == "a.done"


def test_list_commands_fill_each_argument() -> None:
    spec = _spec(matrix={"lr": ["1e-4"]}, template={"spec": {"command": ["t", "--lr={lr}"]}})
    assert sweep.render_spec(spec, sweep.points(spec, None)[0]).command == ["t", "--lr=1e-4"]


def test_the_sweeps_depends_on_joins_the_templates() -> None:
    spec = _spec(
        items=["a"], dependsOn=["prep"], template={"spec": {"command": "x", "dependsOn": ["d"]}}
    )
    assert sweep.render_spec(spec, sweep.points(spec, None)[0]).depends_on == ["d", "prep"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "{items: [a], template: {spec: {command: [run, '{lr}']}}}",
            'sweep.yaml: document 1 (Sweep "lr"): spec.template.spec.command[1]: unknown '
            "placeholder {lr}: use {gpus}, {index}, {item}, or {{lr}} for a literal {lr}",
        ),
        (
            "{files: '*.yaml', template: {spec: {command: x, env: {A: '{item}'}}}}",
            "template.spec.env.A: unknown placeholder {item}: use {file}, {gpus}, {index}, {stem}",
        ),
        (
            "{items: [a], template: {spec: {command: x, successFile: 'out/{stem}.done'}}}",
            "spec.template.spec.successFile: unknown placeholder {stem}: use {gpus}, {index}, "
            "{item}, or {{stem}} for a literal {stem}",
        ),
        (
            "{items: [a], files: '*.y', template: {spec: {command: x}}}",
            "spec: give exactly one of items, files or matrix (found: items, files)",
        ),
        ("{template: {spec: {command: x}}}", "(found: none)"),
        ("{items: [a, a], template: {spec: {command: x}}}", "spec.items: lists 'a' twice"),
        (
            "{items: [], template: {spec: {command: x}}}",
            "spec.items: must have at least 1 item, not 0",
        ),
        ("{matrix: {item: [1]}, template: {spec: {command: x}}}", "spec.matrix.item: a param"),
        ("{matrix: {lr: []}, template: {spec: {command: x}}}", "spec.matrix.lr: list at least"),
        (
            "{matrix: {flag: [true, false], n: [null]}, template: {spec: {command: x}}}",
            "spec.matrix.n[0]: must be a string, number or boolean",
        ),
        (
            "{matrix: {lr: [0.1, {a: 1}]}, template: {spec: {command: x}}}",
            "spec.matrix.lr[1]: must be a string, number or boolean",
        ),
        (
            "{matrix: {lr: [0.1, .nan]}, template: {spec: {command: x}}}",
            "spec.matrix.lr[1]: must be a finite number",
        ),
        ("{matrix: {lr: [-.inf]}, template: {spec: {command: x}}}", "spec.matrix.lr[0]: must"),
        (
            "{matrix: {a: [x-y, x_y]}, template: {spec: {command: x}}}",
            "spec.matrix: a=x_y gives the Job name of a=x-y (...-ax-y): make them",
        ),
        (
            "{items: [A.1, b, a-1], template: {spec: {command: x}}}",
            "spec.items[2]: gives the Job name of items[0] (...-a-1): make them differ in",
        ),
        ("{items: [1, '1'], template: {spec: {command: x}}}", "spec.items: lists '1' twice"),
        (
            "{items: [a, null], template: {spec: {command: x}}}",
            "spec.items[1]: must be a string, number or boolean",
        ),
        ("{items: [[a]], template: {spec: {command: x}}}", "spec.items[0]: must be a string,"),
        ("{items: [.nan], template: {spec: {command: x}}}", "spec.items[0]: must be a finite"),
        (
            "{items: [a], template: {spec: {command: x, resources: {gpus: .inf}}}}",
            "spec.template.spec.resources.gpus: must be a finite number",
        ),
        (
            "{items: [a], template: {spec: {command: x, activeDeadlineSeconds: 40000000}}}",
            "spec.template.spec.activeDeadlineSeconds: must be less than or equal to 31536000",
        ),
        ("{items: [a], maxParallel: 0, template: {spec: {command: x}}}", "spec.maxParallel"),
        ("{items: [a], template: {spec: {command: x, gpu: 1}}}", "template.spec.gpu: unknown"),
        (
            "{items: [a], template: {spec: {command: x, ttlSecondsAfterFinished: 5}}}",
            "spec.template.spec.ttlSecondsAfterFinished: not allowed in a Sweep",
        ),
    ],
)
def test_mistakes_are_one_line_naming_the_field(spec: str, expected: str) -> None:
    message = _manifest_error(spec)
    assert expected in message
    assert "\n" not in message
    assert "(and " not in message  # one problem, said once


def test_a_sweep_stored_with_a_nan_in_its_matrix_still_reads() -> None:
    """Refused in manifests now; an older gctl stored such Sweeps (on SQLite), and a Sweep
    that no longer reads would stop the controller's resync of every Sweep."""
    stored = _sweep(matrix={"lr": [0.1]}, template={"spec": {"command": "t {lr}"}}).wire()
    stored["spec"]["matrix"]["lr"] = [0.1, float("nan"), float("inf")]
    read = sweep.Sweep.model_validate(stored)
    assert [p.label for p in sweep.points(read.spec, None)] == ["lr=0.1", "lr=nan", "lr=inf"]


def test_items_may_be_numbers_and_booleans_written_as_matrix_values_are() -> None:
    spec = _spec(items=[1, 0.5, True, "a"], template={"spec": {"command": "seed {item}"}})
    assert spec.items == ["1", "0.5", "true", "a"]
    points = sweep.points(spec, None)
    assert [sweep.child_name("s", p) for p in points] == ["s-1", "s-0-5", "s-true", "s-a"]
    assert sweep.render_spec(spec, points[2]).command == "seed true"
    assert [p.values["item"] for p in points] == [sweep.text(v) for v in (1, 0.5, True, "a")]


# -- names -------------------------------------------------------------------------------------


def test_child_names_are_slugs_of_the_point() -> None:
    names = [sweep.child_name("lr", p) for p in sweep.points(_spec(items=["A_b", "0.1"]), None)]
    assert names == ["lr-a-b", "lr-0-1"]


def test_a_name_stays_when_items_are_added_or_removed() -> None:
    before = {
        p.label: sweep.child_name("s", p) for p in sweep.points(_spec(items=["a", "b"]), None)
    }
    after = {
        p.label: sweep.child_name("s", p) for p in sweep.points(_spec(items=["z", "b", "a"]), None)
    }
    assert {k: after[k] for k in before} == before


def test_long_or_empty_slugs_take_a_hash_and_fit_a_label() -> None:
    long_item = "x" * 80
    points = sweep.points(_spec(items=[long_item, "x" * 81, "!!!", "???"]), None)
    names = [sweep.child_name("sweep", p) for p in points]
    assert len(set(names)) == 4
    assert all(len(n) <= 63 and n[0].isalnum() and n[-1].isalnum() for n in names)
    assert names[0].startswith("sweep-xxx")
    assert names[2].startswith("sweep-")
    assert len(names[2]) == len("sweep-") + 6
    assert names == [sweep.child_name("sweep", p) for p in points]  # stable


def test_files_sharing_a_stem_both_take_a_hash() -> None:
    spec = _spec(files="*", template={"spec": {"command": "{file}"}})
    names = [sweep.child_name("f", p) for p in sweep.points(spec, ["a.json", "a.yaml", "b.yaml"])]
    assert names[2] == "f-b"
    assert names[0] != names[1]
    assert all(n.startswith("f-a-") for n in names[:2])


# -- progress ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "phases", "counts", "phase"),
    [
        (3, [], (0, 0, 0, 3), "Pending"),
        (3, ["Pending", "Scheduled"], (0, 0, 1, 2), "Running"),
        (3, ["Succeeded", "Running", "Failed"], (1, 1, 1, 0), "Running"),
        (2, ["Succeeded", "Failed"], (1, 1, 0, 0), "Failed"),
        (2, ["Succeeded", "Succeeded"], (2, 0, 0, 0), "Succeeded"),
        (20, ["Succeeded"] * 20, (20, 0, 0, 0), "Succeeded"),
        (0, [], (0, 0, 0, 0), "Pending"),
    ],
)
def test_progress_counts_and_phase(
    total: int, phases: list[str], counts: tuple[int, int, int, int], phase: str
) -> None:
    found = sweep.progress(total, phases)
    assert (found.succeeded, found.failed, found.running, found.pending) == counts
    assert found.phase == phase


def test_a_sweep_whose_job_waits_to_run_again_is_still_running() -> None:
    """Its one Job failed and waits out its back-off (Pending, having run): still Running,
    not back to Pending (QA)."""
    found = sweep.progress(1, ["Pending"], started=1)
    assert (found.running, found.pending, found.phase) == (0, 1, "Running")


# -- one reconcile's plan ----------------------------------------------------------------------


def _wire(name: str, phase: str = "Pending", attempts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {sweep.LABEL: "s"}},
        "spec": {"command": ["run", name.removeprefix("s-")]},
        "status": {"phase": phase, "attempts": attempts},
    }


def test_the_plan_creates_what_is_missing_within_max_parallel() -> None:
    s = _sweep(items=["a", "b", "c", "d"], maxParallel=2)
    decided = sweeps.plan(s, sweep.points(s.spec, None), {"s-a": _wire("s-a", "Running")}, set())
    assert [j.name for j in decided.create] == ["s-b"]
    done = {"s-a": _wire("s-a", "Succeeded", 1)}
    decided = sweeps.plan(s, sweep.points(s.spec, None), done, set())
    assert [j.name for j in decided.create] == ["s-b", "s-c"]


def test_the_plan_deletes_removed_points_only_before_they_start() -> None:
    s = _sweep(items=["a"])
    points = sweep.points(s.spec, None)
    current = sweep.child(s, points[0]).wire()  # as the Sweep made it: nothing to change
    mine = {"s-b": _wire("s-b"), "s-c": _wire("s-c", "Running", 1), "s-a": current}
    decided = sweeps.plan(s, points, mine, set())
    assert decided.delete == ["s-b"]
    assert decided.create == decided.update == []


def test_a_job_that_failed_before_it_ran_follows_the_template() -> None:
    """Its dependency failed: the Sweep's fixed template reaches it, for `gctl rerun` to run
    (QA); one that failed after it ran keeps what it ran."""
    s = _sweep(items=["a", "b", "c"], template={"spec": {"command": ["run2", "{item}"]}})
    mine = {
        "s-a": _wire("s-a", "Failed"),  # DependencyFailed: never ran
        "s-b": _wire("s-b", "Failed", 1),
        "s-c": _wire("s-c", "Pending", 1),  # waiting to retry
    }
    decided = sweeps.plan(s, sweep.points(s.spec, None), mine, set())
    assert [(j.name, j.spec.command) for j in decided.update] == [("s-a", ["run2", "a"])]
    gone = sweeps.plan(
        _sweep(items=["b", "c"]), sweep.points(_spec(items=["b", "c"]), None), mine, set()
    )
    assert gone.delete == ["s-a"]


def test_the_plan_updates_idle_children_and_skips_names_taken() -> None:
    s = _sweep(items=["a", "b"], template={"spec": {"command": ["run2", "{item}"]}})
    mine = {"s-a": _wire("s-a"), "s-b": _wire("s-b", "Succeeded", 1)}
    decided = sweeps.plan(s, sweep.points(s.spec, None), mine, set())
    assert [(j.name, j.spec.command) for j in decided.update] == [("s-a", ["run2", "a"])]
    unchanged = sweeps.plan(s, sweep.points(s.spec, None), mine, set(), refresh=False)
    assert unchanged.update == []  # the template was applied to them already
    taken = sweeps.plan(_sweep(items=["x"]), sweep.points(_spec(items=["x"]), None), {}, {"s-x"})
    assert (taken.create, taken.taken) == ([], ["s-x"])


# -- dependencies ------------------------------------------------------------------------------


def _dep(name: str, kind: str | None, phase: str | None = None, **counts: int) -> sweep.Dependency:
    return sweep.Dependency(name, kind, phase, **counts)


@pytest.mark.parametrize(
    ("dependencies", "state", "message"),
    [
        ([], "ready", ""),
        ([_dep("a", "Job", "Succeeded"), _dep("g", "Sweep", "Succeeded")], "ready", ""),
        (
            [_dep("a", "Job", "Running"), _dep("g", "Sweep", "Running")],
            "waiting",
            "waiting for a, sweep g to succeed",
        ),
        (
            [_dep("later", None)],
            "waiting",
            "waiting for later to succeed (later: no such Job or Sweep yet)",
        ),
        ([_dep("a", "Job", "Failed"), _dep("x", None)], "failed", "dependency a failed"),
        (
            [_dep("a", "Job", "Running"), _dep("g", "Sweep", "Failed", failed=3, total=20)],
            "failed",
            "dependency sweep g failed (3/20 children failed)",
        ),
    ],
)
def test_the_dependency_decision(
    dependencies: list[sweep.Dependency], state: str, message: str
) -> None:
    assert sweep.verdict(dependencies) == sweep.Verdict(state, message)  # type: ignore[arg-type]

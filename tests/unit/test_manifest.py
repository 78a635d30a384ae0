"""Reading manifests: what is accepted, and one-line errors that name file, document and field."""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gctl.api import errors, job, manifest, pool, quantity, sweep

GOOD = """
apiVersion: gctl/v1
kind: Job
metadata: {name: hello, labels: {team: nlp}}
spec:
  command: [python, train.py]
  resources: {gpus: 0.5, gpuMemory: 24Gi, gpuModel: "*A100*"}
---
apiVersion: gctl/v1
kind: GPUPool
metadata: {name: a100}
spec:
  selector: {nodeLabels: {gpu: a100}, gpus: ["0-3", 5]}
  maxJobsPerGPU: 2
  policy: spread
"""


def _job(spec: str, name: str = "h") -> str:
    return f"apiVersion: gctl/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def _sweep(spec: str, name: str = "s") -> str:
    return f"apiVersion: gctl/v1\nkind: Sweep\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def test_multi_document_file() -> None:
    parsed = manifest.parse("x.yaml", GOOD)
    assert [str(m.source) for m in parsed] == ["x.yaml: document 1", "x.yaml: document 2"]
    first, second = parsed[0].obj, parsed[1].obj
    assert isinstance(first, job.Job)
    assert first.spec.resources.gpus == 0.5
    assert first.spec.resources.gpu_memory_bytes() == 24 * 2**30
    assert isinstance(second, pool.GPUPool)
    assert pool.expand_indices(second.spec.selector.gpus or []) == [0, 1, 2, 3, 5]
    assert second.metadata.namespace is None


def test_list_documents_and_empty_documents() -> None:
    text = "---\n---\napiVersion: gctl/v1\nkind: List\nitems:\n" + "".join(
        f"- apiVersion: gctl/v1\n  kind: Job\n  metadata: {{name: j{i}}}\n  spec: {{command: x}}\n"
        for i in range(3)
    )
    assert [m.obj.name for m in manifest.parse("l.yaml", text)] == ["j0", "j1", "j2"]


def test_a_json_file_reads_as_its_yaml_would() -> None:
    items = [
        {
            "apiVersion": "gctl/v1",
            "kind": "Job",
            "metadata": {"name": f"j{i}"},
            "spec": {"command": "x"},
        }
        for i in range(3)
    ]
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1)
    parsed = manifest.parse("l.json", text)
    assert [m.obj for m in parsed] == [m.obj for m in manifest.parse("l.yaml", " " + text)]
    assert [str(m.source) for m in parsed] == ["l.json: document 1"] * 3


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            '{"kind": "Job", "kind": "Job"}',
            "line 1, column 17: invalid YAML: key 'kind' appears twice",
        ),
        (
            '{"apiVersion": "gctl/v1", "kind": "Job",',
            "invalid YAML: did not find expected node content",
        ),
        (
            '{"apiVersion": "gctl/v1", "kind": "Job", "metadata": {"name": "h"}, "spec": {}}',
            "spec.command",
        ),
    ],
)
def test_json_errors_name_the_field_or_the_line(text: str, where: str) -> None:
    with pytest.raises(errors.Invalid) as caught:
        manifest.parse("bad.json", text)
    assert str(caught.value).startswith("bad.json: document 1")
    assert where in str(caught.value)


def test_status_and_server_fields_are_ignored_not_refused() -> None:
    text = _job("{command: x}") + "status: {phase: Running, bogus: 1}\n"
    (parsed,) = manifest.parse("s.yaml", text)
    assert isinstance(parsed.obj, job.Job)
    assert parsed.obj.status.phase == "Pending"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (_job("{command: x, foo: 1}"), "spec.foo: unknown field"),
        (_job("{command: x, working_dir: /tmp}"), "spec.working_dir: unknown field"),
        (_job("{command: x, priority: high}"), "spec.priority: must be a valid integer"),
        (_job("{command: x}", name="Hello_World"), "metadata.name: 'Hello_World' is not a valid"),
        (_job("{command: x, resources: {gpus: -1}}"), "spec.resources.gpus: must not be"),
        (_job("{command: x, resources: {gpus: 1.5}}"), "spec.resources.gpus: 1.5 is neither"),
        (_job("{command: x, resources: {gpuMemory: -5Gi}}"), "spec.resources.gpuMemory:"),
        (_job("{command: [1, 2]}"), "spec.command: must be a list of strings"),
        (_job("{command: x, env: {1A: b}}"), "spec.env.1A:"),
        (_job("{command: x, dependsOn: [a, a]}"), "spec.dependsOn: names a Job twice"),
        (_job("{command: x, dependsOn: [a, h]}"), 'Job "h"): spec.dependsOn[1]: names this Job'),
        (
            _job("{command: x, resources: {gpus: 2}, placement: {gpus: [3]}}"),
            "spec.placement: gpus lists 1 GPU(s) but resources.gpus asks for 2: list at least 2",
        ),
        (
            _job("{command: x, resources: {gpus: 0}, placement: {gpus: [0]}}"),
            "spec.placement: gpus lists 1 GPU(s) but resources.gpus asks for 0: list none",
        ),
        (_job("{command: x, backoffLimit: -1}"), "spec.backoffLimit:"),
        (
            _job("{command: x, activeDeadlineSeconds: 300000000000}"),
            "spec.activeDeadlineSeconds: must be less than or equal to 31536000 (365 days)",
        ),
        (
            _job("{command: x, ttlSecondsAfterFinished: 31536001}"),
            "spec.ttlSecondsAfterFinished: must be less than or equal to 31536000 (365 days)",
        ),
        (_job("{command: x, activeDeadlineSeconds: .inf}"), "spec.activeDeadlineSeconds: must be"),
        (_job("{command: x, resources: {gpus: .nan}}"), "spec.resources.gpus: must be a finite"),
        (_job("{command: x, resources: {gpus: .inf}}"), "spec.resources.gpus: must be a finite"),
        (_job("{command: x, resources: {gpus: -.inf}}"), "spec.resources.gpus: must be a finite"),
        (_job("{command: x, priority: .nan}"), "spec.priority: must be a finite number"),
        # a whole number past what a float holds was a traceback when converted to one
        (_job(f"{{command: x, resources: {{gpus: {'9' * 400}}}}}"), "(at most 1024)"),
        # numbers JSON as gctl stores it cannot hold, where no field's own range said so
        (
            _sweep(f"{{matrix: {{a: [1, -{2**63 + 1}]}}, template: {{spec: {{command: x}}}}}}"),
            "spec.matrix.a[1]: is a number gctl does not store: an integer from "
            "-9223372036854775808 to 9223372036854775807, or a finite decimal (quoted, it is "
            "text)",
        ),
        (
            _job(f"{{command: x, placement: {{gpus: [{2**64}]}}}}"),
            "spec.placement.gpus[0]: is a number gctl does not store",
        ),
        (_job('{command: ["a", "b\\0c"]}'), "spec.command[1]: contains a NUL character"),
        (_job('{command: x, env: {A: "\\0"}}'), "spec.env.A: contains a NUL character"),
        # a NUL after a number stored as text (a Sweep's item), which is no error
        (
            _sweep(f'{{items: [{2**70}], template: {{spec: {{command: ["a", "b\\0"]}}}}}}'),
            "spec.template.spec.command[1]: contains a NUL character",
        ),
        (_job("{}"), "spec.command: required field is missing"),
        (_job("{comand: x}"), "spec.comand: unknown field (and 1 more)"),
        ("apiVersion: gctl/v1\nkind: Jobz\nmetadata: {name: h}\n", "kind 'Jobz' is not a kind"),
        ("kind: Job\nmetadata: {name: h}\n", "apiVersion is missing"),
        ("apiVersion: gctl/v1\nkind: Job\nkind: Job\n", "line 7, column 1: invalid YAML: key"),
        ("apiVersion: gctl/v1\nkind: Job\nspec: {command: x\n", "invalid YAML"),
        # scalars YAML's constructors refuse: a 5,000-digit int, a date that is no date
        (_job(f"{{command: x, resources: {{gpus: 1{'0' * 5000}}}}}"), "invalid value: Exceeds"),
        ("apiVersion: gctl/v1\nkind: Job\nmetadata: {name: d, a: 2026-13-45}\n", "month must"),
        ("- a\n- b\n", "expected a mapping"),
        (
            "apiVersion: gctl/v1\nkind: GPUPool\nmetadata: {name: p}\nspec: {policy: random}\n",
            "spec.policy: must be 'binpack' or 'spread'",
        ),
        (
            "apiVersion: gctl/v1\nkind: GPUPool\nmetadata: {name: p}\n"
            "spec: {selector: {gpus: ['3-1']}}\n",
            "spec.selector.gpus: range '3-1' runs backwards",
        ),
        (
            "apiVersion: gctl/v1\nkind: GPUPool\nmetadata: {name: p}\n"
            "spec: {selector: {gpus: []}}\n",
            "spec.selector.gpus: must have at least 1 item, not 0",
        ),
        (
            "apiVersion: gctl/v1\nkind: GPUProfile\nmetadata: {name: p}\nspec: {gpus: .nan}\n",
            "spec.gpus: must be a finite number",
        ),
        (
            "apiVersion: gctl/v1\nkind: GPUProfile\nmetadata: {name: p}\nspec: {gpus: .inf}\n",
            "spec.gpus: must be a finite number",
        ),
    ],
)
def test_errors_name_file_document_and_field(text: str, where: str) -> None:
    with pytest.raises(errors.Invalid) as caught:
        manifest.parse(
            "bad.yaml", "apiVersion: gctl/v1\nkind: GPUPool\nmetadata: {name: ok}\n---\n" + text
        )
    message = str(caught.value)
    assert message.startswith("bad.yaml: document 2")
    assert where in message
    assert "\n" not in message


def test_a_large_number_stored_as_text_is_taken() -> None:
    """A Sweep's items are stored as text: a number beyond 64 bits there is no number."""
    text = _sweep("{items: [99999999999999999999999], template: {spec: {command: x}}}")
    (parsed,) = manifest.parse("s.yaml", text)
    assert isinstance(parsed.obj, sweep.Sweep)
    assert parsed.obj.spec.items == ["99999999999999999999999"]


def test_durations_up_to_a_year_are_accepted() -> None:
    text = _job("{command: x, activeDeadlineSeconds: 31536000, ttlSecondsAfterFinished: 31536000}")
    (parsed,) = manifest.parse("y.yaml", text)
    assert isinstance(parsed.obj, job.Job)
    assert parsed.obj.spec.active_deadline_seconds == quantity.MAX_DURATION_SECONDS == 365 * 86_400


@pytest.mark.parametrize(
    ("annotations", "where"),
    [
        ("{gctl/simulated-duration: soon}", "[gctl/simulated-duration]: 'soon' is not a number"),
        ("{gctl/simulated-duration: '-1'}", "[gctl/simulated-duration]: -1.0 is not a finite"),
        ("{gctl/simulated-duration: 'nan'}", "[gctl/simulated-duration]: nan is not a finite"),
        ("{gctl/simulated-duration: '4e7'}", "4e+07 is more than a year"),
        ("{gctl/simulated-exit-code: '300'}", "[gctl/simulated-exit-code]: '300' is not an exit"),
        ("{gctl/simulated-exit-code: '-1'}", "'-1' is not an exit code"),
        ("{gctl/simulated-exit-code: '1.5'}", "'1.5' is not an exit code"),
        ("{gctl/simulated-exit-code: '1e20'}", "'1e20' is not an exit code"),
    ],
)
def test_a_bad_simulation_annotation_is_refused_when_applied(annotations: str, where: str) -> None:
    """What a virtual node would only find when it starts the Job, one line at apply."""
    text = f"apiVersion: gctl/v1\nkind: Job\nmetadata: {{name: v, annotations: {annotations}}}\n"
    with pytest.raises(errors.Invalid) as caught:
        manifest.parse("v.yaml", text + "spec: {command: x}\n")
    message = str(caught.value)
    assert message.startswith('v.yaml: document 1 (Job "v"): metadata.annotations[gctl/simulated-')
    assert where in message


def test_a_sweeps_template_simulation_annotations_are_checked_too() -> None:
    text = _sweep(
        "{items: [a], template: {metadata: {annotations: {gctl/simulated-exit-code: '300'}}, "
        "spec: {command: x}}}"
    )
    with pytest.raises(errors.Invalid) as caught:
        manifest.parse("s.yaml", text)
    assert "spec.template.metadata.annotations[gctl/simulated-exit-code]: '300' is not an" in str(
        caught.value
    )


def test_good_simulation_annotations_and_a_stored_bad_one_read() -> None:
    text = (
        "apiVersion: gctl/v1\nkind: Job\nmetadata: {name: v, annotations: "
        "{gctl/simulated-duration: '31536000', gctl/simulated-exit-code: '255'}}\n"
        "spec: {command: x}\n"
    )
    (parsed,) = manifest.parse("v.yaml", text)
    assert job.simulated_run(parsed.obj.metadata.annotations) == (31_536_000.0, 255)
    stored = yaml.safe_load(text.replace("'255'", "'300'"))
    read = job.Job.model_validate(stored)  # the virtual node reports it as a start error
    assert read.metadata.annotations["gctl/simulated-exit-code"] == "300"


def test_a_stored_job_from_before_the_limit_still_reads() -> None:
    """The limit is for what users give: a Job an older gctl stored with a longer deadline
    must still read (to run, show and delete), not fail every read of it."""
    stored = yaml.safe_load(_job("{command: x, activeDeadlineSeconds: 300000000000}"))
    stored["spec"]["ttlSecondsAfterFinished"] = 300_000_000_000
    read = job.Job.model_validate(stored)
    assert read.spec.active_deadline_seconds == read.spec.ttl_seconds_after_finished == 3 * 10**11


def test_directory_reads_manifests_only_and_recurses_on_request(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_job("{command: x}", name="a"))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text(_job("{command: x}", name="b"))
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "c.yaml").write_text("not: [valid")
    flat = manifest.load([str(tmp_path)], recursive=False, namespace="default")
    deep = manifest.load([str(tmp_path)], recursive=True, namespace="ns1")
    assert [m.obj.name for m in flat] == ["a"]
    assert [m.obj.name for m in deep] == ["a", "b"]
    assert {m.obj.metadata.namespace for m in deep} == {"ns1"}


def test_duplicates_across_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_job("{command: x}", name="same"))
    (tmp_path / "b.yaml").write_text(_job("{command: y}", name="same"))
    with pytest.raises(errors.Invalid, match=r"b.yaml: document 1 .*already defined in .*a.yaml"):
        manifest.load([str(tmp_path)], recursive=False, namespace="default")


def test_same_name_in_two_namespaces_is_no_duplicate(tmp_path: Path) -> None:
    text = (
        _job("{command: x}", name="same")
        + "---\n"
        + _job("{command: x}", name="same").replace("name: same}", "name: same, namespace: other}")
    )
    (tmp_path / "a.yaml").write_text(text)
    loaded = manifest.load([str(tmp_path)], recursive=False, namespace="default")
    assert [m.obj.metadata.namespace for m in loaded] == ["default", "other"]


def test_a_cycle_made_in_one_apply_is_refused(tmp_path: Path) -> None:
    # A diamond, and a name the apply does not hold (a cycle through it is the controller's).
    (tmp_path / "a.yaml").write_text(_job("{command: x, dependsOn: [stored]}", name="a"))
    (tmp_path / "b.yaml").write_text(
        _job("{command: x, dependsOn: [a]}", name="b")
        + "---\n"
        + _job("{command: x, dependsOn: [a]}", name="c")
        + "---\n"
        + _job("{command: x, dependsOn: [b, c]}", name="d")
    )
    loaded = manifest.load([str(tmp_path)], recursive=False, namespace="ml")
    assert [m.obj.name for m in loaded] == ["a", "b", "c", "d"]
    (tmp_path / "a.yaml").write_text(_job("{command: x, dependsOn: [c]}", name="a"))
    (tmp_path / "b.yaml").write_text(
        _job("{command: x, dependsOn: [prep, a]}", name="b")
        + "---\n"
        + _job("{command: x, dependsOn: [b]}", name="c")
    )
    with pytest.raises(errors.Invalid) as caught:
        manifest.load([str(tmp_path)], recursive=False, namespace="ml")
    assert str(caught.value) == (
        f'{tmp_path}/a.yaml: document 1 (Job "a"): spec.dependsOn[0]: makes a dependency cycle '
        "ml/a -> ml/c -> ml/b -> ml/a, so none of it could ever start: remove one of these "
        "dependsOn"
    )


@pytest.mark.parametrize(
    "spec",
    [
        "{items: [a], dependsOn: [s], template: {spec: {command: x}}}",
        "{items: [a], template: {spec: {command: x, dependsOn: [s]}}}",
    ],
)
def test_a_sweep_naming_itself_is_refused_unless_a_job_has_that_name(
    tmp_path: Path, spec: str
) -> None:
    """A name in dependsOn is a Job first, then a Sweep: beside a Job `s`, it is that Job."""
    (tmp_path / "s.yaml").write_text(_sweep(spec, "s"))
    with pytest.raises(errors.Invalid, match=r'\(Sweep "s"\): spec.*dependsOn\[0\]: makes a'):
        manifest.load([str(tmp_path)], recursive=False, namespace="default")
    (tmp_path / "j.yaml").write_text(_job("{command: x}", name="s"))
    loaded = manifest.load([str(tmp_path)], recursive=False, namespace="default")
    assert sorted(m.obj.KIND for m in loaded) == ["Job", "Sweep"]


def test_a_cycle_through_a_sweep_in_one_apply_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        _job("{command: x, dependsOn: [grid]}", name="collect")
        + "---\n"
        + _sweep("{items: [a], dependsOn: [collect], template: {spec: {command: x}}}", "grid")
    )
    with pytest.raises(errors.Invalid, match=r'p.yaml: document 1 \(Job "collect"\): spec.dep'):
        manifest.load([str(tmp_path)], recursive=False, namespace="default")


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(errors.Invalid, match="no such file or directory"):
        manifest.load([str(tmp_path / "nope")], recursive=False, namespace="default")
    with pytest.raises(errors.Invalid, match=r"no \.yaml, \.yml or \.json files"):
        manifest.load([str(tmp_path)], recursive=False, namespace="default")


def test_stdin() -> None:
    loaded = manifest.load(["-"], recursive=False, namespace="default", stdin_text=GOOD)
    assert str(loaded[0].source) == "<stdin>: document 1"


# -- relative paths: the manifest's directory's ------------------------------------------------

WORKING_DIRS = {  # as written: as stored, for a manifest in /proj/team
    "sub": "/proj/team/sub",
    "./a/../b/": "/proj/team/b",
    ".": "/proj/team",
    "/abs/./x": "/abs/./x",  # absolute: as written
    "~/runs": "~/runs",  # the home directory's: as written
    "": "",  # empty, as absent: the agent's directory
}


def test_a_relative_working_dir_is_made_absolute_against_the_files_directory() -> None:
    text = "---\n".join(
        _job(f"{{command: x, workingDir: {given!r}}}", f"j{i}")
        for i, given in enumerate(WORKING_DIRS)
    )
    parsed = manifest.parse("/proj/team/job.yaml", text + "---\n" + _job("{command: x}", "none"))
    stored = [m.obj.spec.working_dir for m in parsed if isinstance(m.obj, job.Job)]
    assert stored == [*WORKING_DIRS.values(), None]


def test_a_sweeps_paths_are_made_absolute_and_its_placeholders_kept() -> None:
    template = "{spec: {command: x, workingDir: %s}}"
    text = "---\n".join(
        [
            _sweep("{items: [a], template: %s}" % (template % "'runs/{item}'"), "in-dir"),
            _sweep("{files: 'c/*.toml', template: %s}" % (template % "."), "files-in-dir"),
            _sweep("{files: 'c/*.toml', template: {spec: {command: x}}}", "files-alone"),
            _sweep("{files: '~/c/*.toml', template: {spec: {command: x}}}", "files-home"),
        ]
    )
    parsed = manifest.parse("/p/{x}/[y]/sweep.yaml", text)
    specs = [m.obj.spec for m in parsed if isinstance(m.obj, sweep.Sweep)]
    assert [(s.files, s.template.spec.working_dir) for s in specs] == [
        (None, "/p/{{x}}/[y]/runs/{item}"),  # a brace in the directory's name: as itself
        ("c/*.toml", "/p/{{x}}/[y]"),  # relative to its workingDir, as before
        ("/p/{x}/[[]y]/c/*.toml", None),  # no workingDir: the glob is the file's directory's
        ("~/c/*.toml", None),
    ]
    point = sweep.points(specs[0], None)[0]
    assert sweep.render_spec(specs[0], point).working_dir == "/p/{x}/[y]/runs/a"


def test_a_relative_path_with_the_current_directory_gone_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert manifest.parse("<stdin>", _job("{command: x, workingDir: /abs}"))
    with pytest.raises(errors.Invalid) as caught:
        manifest.parse("<stdin>", _job("{command: x, workingDir: sub}"))
    assert str(caught.value) == (
        "<stdin>: document 1 (Job \"h\"): spec.workingDir: 'sub' is relative, but the current "
        "directory is gone: give an absolute path"
    )


def test_a_manifest_reached_through_a_symlink_stores_the_path_the_agent_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory is taken as the kernel finds it, as `gctl sync` and `gctl run` take
    theirs: `..` past a symlink means what it means to the agent's chdir, and the same file
    stores the same path whichever way it is named (so it applies `unchanged`)."""
    real = tmp_path.resolve()
    (real / "proj").mkdir()
    (real / "elsewhere").mkdir()
    (real / "elsewhere" / "link").symlink_to(real / "proj")
    text = _job("{command: x, workingDir: ../data}")
    monkeypatch.chdir(real)
    named = [
        manifest.parse(file, text)[0].obj.spec.working_dir
        for file in ("proj/job.yaml", "elsewhere/link/job.yaml", f"{real}/elsewhere/link/job.yaml")
    ]
    monkeypatch.chdir(real / "elsewhere" / "link")
    named.append(manifest.parse("job.yaml", text)[0].obj.spec.working_dir)
    assert named == [str(real / "data")] * 4


def test_a_repeated_key_is_refused_wherever_it_is() -> None:
    for text in ("a: 1\na: 2\n", "x: [{a: 1, a: 2}]\n", "x: &y {b: 1}\nz: {<<: *y, c: 1, c: 2}\n"):
        with pytest.raises(errors.Invalid, match="appears twice in one mapping"):
            manifest.parse("r.yaml", text)


def test_a_tagged_scalar_that_is_not_of_its_type_is_a_one_line_error() -> None:
    """PyYAML's own constructors raise a KeyError or an AttributeError (a traceback)."""
    for value, what in (("!!bool x", "boolean"), ("!!timestamp nope", "timestamp")):
        with pytest.raises(errors.Invalid) as caught:
            manifest.parse("t.yaml", _job("{command: x}") + f"status: {{at: {value}}}\n")
        assert str(caught.value) == (
            f"t.yaml: document 1: line 5, column 14: invalid YAML: "
            f"{value.split()[1]!r} is not a {what}"
        )


def test_plain_documents_are_read_without_pyyaml_constructor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    used: list[object] = []
    generic = yaml.constructor.BaseConstructor.construct_document

    def recorded(self: yaml.constructor.BaseConstructor, node: yaml.Node) -> Any:
        used.append(node)
        return generic(self, node)

    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_document", recorded)
    assert len(manifest.parse("x.yaml", GOOD)) == 2
    assert used == []
    manifest.parse("x.yaml", _job("{command: x, env: &e {A: '1'}, dependsOn: []}"))
    assert used == []
    manifest.parse("x.yaml", _job("{<<: {command: x}, env: {A: '1'}}"))
    assert len(used) == 1  # a merge key: PyYAML's constructor


def test_a_directorys_files_are_read_in_pathlibs_order_and_naming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a/b.yaml", "a-c/x.yaml", "a/z/y.yml", "top.json", "a/.hidden.yaml", ".d/h.yaml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"# {name}\n")
    (tmp_path / "notes.txt").write_text("not a manifest\n")
    monkeypatch.chdir(tmp_path)
    for root in (".", "./", str(tmp_path), "a/../a"):
        read = [name for name, _ in manifest.read_sources([root], recursive=True)]
        walked = [
            Path(d) / f
            for d, ds, fs in os.walk(root)
            for f in fs
            if f.endswith((".yaml", ".yml", ".json")) and not f.startswith(".")
            if ".d" not in Path(d).parts
        ]
        assert read == [str(p) for p in sorted(walked)]
    assert [name for name, _ in manifest.read_sources(["."], recursive=True)] == [
        "a/b.yaml",
        "a/z/y.yml",
        "a-c/x.yaml",
        "top.json",
    ]


def test_line_ends_of_any_kind_read_as_newlines(tmp_path: Path) -> None:
    for name, text in (("crlf.yaml", "a: |\r\n  x\r\n  y\r\n"), ("cr.yaml", "a: |\r  x\r  y\r")):
        (tmp_path / name).write_bytes(text.encode())
        [(_, read)] = manifest.read_sources([str(tmp_path / name)], recursive=False)
        assert read == "a: |\n  x\n  y\n"
        assert (tmp_path / name).read_text() == read  # as a file opened as text reads it

"""Pure rules of running a job: back-off, exit codes, what is exec'd."""

import json
from datetime import timedelta
from pathlib import Path

import pytest

from controller import outcomes
from gctl.api import binding, errors, job
from nodeagent import launches, runtime, supervisor
from tests.builders import make_binding, make_job


@pytest.mark.parametrize(
    ("failures", "seconds"), [(1, 10), (2, 20), (3, 40), (6, 320), (7, 360), (40, 360)]
)
def test_backoff_doubles_and_is_capped(failures: int, seconds: int) -> None:
    assert outcomes.backoff(failures) == timedelta(seconds=seconds)


def test_backoff_base_is_configurable() -> None:
    assert outcomes.backoff(3, timedelta(seconds=1)) == timedelta(seconds=4)


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [(0, (0, None)), (3, (3, None)), (-9, (137, "SIGKILL")), (-15, (143, "SIGTERM"))],
)
def test_exit_codes_read_like_a_shell(returncode: int, expected: tuple[int, str | None]) -> None:
    assert supervisor.exit_code_of(returncode) == expected


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        (["python", "train.py", "--cuda", "{gpus}"], ["python", "train.py", "--cuda", "0,1"]),
        ("echo on {gpus}", ["/bin/sh", "-c", "echo on 0,1"]),
        (["./run.sh"], ["bash", "./run.sh"]),
        (["./run.sh", "--fast"], ["./run.sh", "--fast"]),
        # A string of one `.sh` path is that path too (it need not be executable).
        ("./run.sh", ["bash", "./run.sh"]),
        ("  /abs/run-{gpus}.sh ", ["bash", "/abs/run-0,1.sh"]),
        ("./run.sh --fast", ["/bin/sh", "-c", "./run.sh --fast"]),
        ("$HOME/run.sh", ["/bin/sh", "-c", "$HOME/run.sh"]),
        ("run*.sh", ["/bin/sh", "-c", "run*.sh"]),
    ],
)
def test_command_argv(command: list[str] | str, argv: list[str]) -> None:
    spec = make_job("j").build().spec.model_copy(update={"command": command})
    assert launches.command_argv(spec, "0,1", {}) == argv


def _launch_on_gpus_2_3(tmp_path: Path, owner: job.Job) -> runtime.Launch:
    node = runtime.Runtime(tmp_path / "state")
    try:
        return launches.launch_for(
            node,
            launches.Settings("node-1", 30.0, None, 0.0),
            make_binding("j", "n", [2, 3]),
            owner,
        )
    finally:
        node.close()


def test_gpus_in_an_env_value_becomes_the_gpu_list(tmp_path: Path) -> None:
    owner = make_job("j").in_namespace("default").build()
    owner.spec.env = {"MY_GPUS": "{gpus}", "DEVICES": "cuda:{gpus}", "PLAIN": "x"}
    launch = _launch_on_gpus_2_3(tmp_path, owner)
    assert (launch.env["MY_GPUS"], launch.env["DEVICES"], launch.env["PLAIN"]) == (
        "2,3",
        "cuda:2,3",
        "x",
    )


def test_gpus_in_the_working_dir_and_success_file_become_the_gpu_list(tmp_path: Path) -> None:
    """As a Sweep's template promises: `{gpus}` is left there for the agent."""
    owner = make_job("j").in_namespace("default").build()
    owner.spec.working_dir = "/runs/gpus-{gpus}"
    owner.spec.success_file = "done-{gpus}"
    launch = _launch_on_gpus_2_3(tmp_path, owner)
    assert (launch.cwd, launch.success_file) == ("/runs/gpus-2,3", "done-2,3")


DISTRIBUTED = (
    *("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "NNODES"),
    *("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
    "PET_NPROC_PER_NODE",
    *("GCTL_NODE_RANK", "GCTL_NNODES", "GCTL_NODES"),
)


def _launch_env(bound: binding.Binding, env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    owner = make_job("j").in_namespace("default").build()
    owner.spec.env = env
    node = runtime.Runtime(tmp_path / "state")
    try:
        settings = launches.Settings(bound.spec.node, 30.0, None, 0.0)
        return launches.launch_for(node, settings, bound, owner).env
    finally:
        node.close()


def test_a_job_starts_from_the_agents_environment_as_the_agent_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copied once, when the agent's settings are made (copying `os.environ` at every launch
    decoded each variable again); the Job's `env` over it, gctl's own over both."""
    monkeypatch.setenv("FROM_THE_SHELL", "yes")
    monkeypatch.setenv("GCTL_NODE", "set-by-someone")
    settings = launches.Settings("node-1", 30.0, None, 0.0)
    monkeypatch.setenv("SET_LATER", "no")
    owner = make_job("j").in_namespace("default").build()
    owner.spec.env = {"FROM_THE_SHELL": "overridden"}
    node = runtime.Runtime(tmp_path / "state")
    try:
        first = launches.launch_for(node, settings, make_binding("j", "n", [0]), owner).env
        again = launches.launch_for(node, settings, make_binding("j", "n", [1]), owner).env
    finally:
        node.close()
    assert (first["FROM_THE_SHELL"], first["GCTL_NODE"], "SET_LATER" in first) == (
        "overridden",
        "node-1",
        False,
    )
    assert (first["CUDA_VISIBLE_DEVICES"], again["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    assert settings.environ["FROM_THE_SHELL"] == "yes"  # the launches changed no shared copy


def _member(rank: int, members: list[str], **spec: object) -> binding.Binding:
    bound = make_binding("j", members[rank], [0, 1])
    bound.spec = bound.spec.model_copy(update={"rank": rank, "members": members, **spec})
    return bound


def test_a_multi_node_member_is_told_its_rank_and_where_rank_0_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variables a PyTorchJob's pods get and torchrun's own; the Job's `env` wins over
    the launchers' (the user knows better), never over gctl's own. A single-node attempt gets
    none of them."""
    for name in DISTRIBUTED:
        monkeypatch.setenv(name, "from-the-agent")  # an agent started inside a launcher
    bound = _member(2, ["a", "b", "c"], master_addr="a.lab", master_port=29612)

    env = _launch_env(bound, {"MASTER_PORT": "1234", "GCTL_NODE_RANK": "0"}, tmp_path)

    assert {name: env[name] for name in DISTRIBUTED} == {
        "MASTER_ADDR": "a.lab",
        "MASTER_PORT": "1234",  # the Job's env
        "WORLD_SIZE": "3",
        "RANK": "2",
        "NODE_RANK": "2",
        "NNODES": "3",
        "PET_NNODES": "3",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "a.lab",
        "PET_MASTER_PORT": "29612",
        "PET_NPROC_PER_NODE": "2",  # its two GPUs
        "GCTL_NODE_RANK": "2",  # not the Job's: gctl's own
        "GCTL_NNODES": "3",
        "GCTL_NODES": "a,b,c",
    }
    assert env["GCTL_NODE"] == "c"
    for name in DISTRIBUTED:
        monkeypatch.delenv(name)
    alone = _launch_env(make_binding("j", "n", [0]), {}, tmp_path)  # a single-node attempt
    assert not set(DISTRIBUTED) & set(alone)


def test_a_member_bound_without_an_address_gets_rank_0s_node_and_its_jobs_port(
    tmp_path: Path,
) -> None:
    env = _launch_env(_member(1, ["a", "b"]), {}, tmp_path)
    port = str(binding.master_port("uid-j"))
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["PET_MASTER_PORT"]) == ("a", port, port)


def test_the_master_port_is_the_jobs_own_and_spread_over_a_thousand() -> None:
    """Every member works it out alike, in any process (no salted hash); two gangs whose rank
    0 share a host seldom pick the same one."""
    uids = [f"{i:08x}-5f1c-4a7e-9d0b-3c2e1f0a9b8c" for i in range(2000)]
    ports = [binding.master_port(uid) for uid in uids]
    assert ports == [binding.master_port(uid) for uid in uids]
    assert all(29500 <= p <= 30499 for p in ports)
    assert len(set(ports)) > 800  # 2000 draws over 1000 ports: about 865 distinct
    # Pinned: members running different gctl versions during an upgrade must still agree.
    assert binding.master_port("d3b07384-d9a0-4c9f-8e6b-7a1c2d3e4f50") == 30385


def test_conda_env_without_conda_is_a_clear_error() -> None:
    spec = make_job("j").build().spec.model_copy(update={"conda_env": "torch"})
    with pytest.raises(errors.Invalid, match="condaEnv 'torch': conda is not on the job's PATH"):
        launches.command_argv(spec, "0", {"PATH": "/nonexistent"})


def _fake_conda(directory: Path) -> Path:
    directory.mkdir()
    conda = directory / "conda"
    conda.write_text("#!/bin/sh\n")
    conda.chmod(0o755)
    return conda


def test_conda_is_found_on_the_path_the_job_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conda the agent's PATH lacks (a daemon started by systemd) but the Job's `env` names,
    in PATH or in conda's own CONDA_EXE, runs the job, as the command itself is looked up."""
    monkeypatch.setenv("PATH", "/nonexistent")
    conda = _fake_conda(tmp_path / "bin")
    owner = make_job("j").command("python", "t.py").in_namespace("default").build()
    owner.spec.conda_env = "torch"
    wrapped = [str(conda), "run", "-n", "torch", "--no-capture-output", "python", "t.py"]
    node = runtime.Runtime(tmp_path / "state")
    try:
        for env in ({"PATH": f"/nonexistent:{conda.parent}"}, {"CONDA_EXE": str(conda)}):
            owner.spec.env = env
            launch = launches.launch_for(
                node,
                launches.Settings("node-1", 30.0, None, 0.0),
                make_binding("j", "n", [0]),
                owner,
            )
            assert launch.argv == wrapped
    finally:
        node.close()


def test_an_attempt_that_ends_while_its_state_is_read_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor writes its exit record, then dies (releasing its lock): an agent that
    looked for the record before the lock would see neither, and call a clean exit lost."""
    attempts = runtime.Runtime(tmp_path)
    directory = attempts.attempts_dir / "uid-1"
    directory.mkdir()
    for name, record in ((supervisor.SPEC, {}), (supervisor.PID, {"pid": 1, "started": 0.0})):
        (directory / name).write_text(json.dumps(record))

    def ends_now(_: Path) -> bool:  # the supervisor finishes at this very moment
        (directory / supervisor.EXIT).write_text(json.dumps({"exitCode": 0}))
        return False

    monkeypatch.setattr(runtime, "_supervisor_alive", ends_now)
    state = attempts.state("uid-1")
    assert (state.phase, state.exit_code) == ("exited", 0)


@pytest.mark.parametrize(
    ("namespace", "name", "job_uid", "field"),
    [
        ("../../escape", "esc", "uid-esc", "metadata.namespace"),
        ("default", "../up", "uid-up", "metadata.name"),
        ("default", "up", "../../..", "spec.jobUID"),
    ],
)
def test_a_job_whose_names_are_not_dns_labels_never_gets_a_log_path(
    tmp_path: Path, namespace: str, name: str, job_uid: str, field: str
) -> None:
    """The names and the Job's uid are the log's directories: a Job or Binding written to the
    database by anything that skipped validation cannot make the agent write outside its
    logs."""
    owner = make_job(name).build()
    owner.metadata.namespace = namespace
    bound = make_binding(name, "node-1", [0])
    bound.spec.job_uid = job_uid
    node = runtime.Runtime(tmp_path / "state")
    settings = launches.Settings("node-1", 30.0, None, 0.0)
    try:
        with pytest.raises(errors.Invalid, match=field):
            launches.launch_for(node, settings, bound, owner)
    finally:
        node.close()

"""Pure rules of running a job: back-off, exit codes, what is exec'd."""

from datetime import timedelta

import pytest

from controller import jobs
from gctl.api import errors
from nodeagent import agent, supervisor
from tests.builders import make_job


@pytest.mark.parametrize(
    ("failures", "seconds"), [(1, 10), (2, 20), (3, 40), (6, 320), (7, 360), (40, 360)]
)
def test_backoff_doubles_and_is_capped(failures: int, seconds: int) -> None:
    assert jobs.backoff(failures) == timedelta(seconds=seconds)


def test_backoff_base_is_configurable() -> None:
    assert jobs.backoff(3, timedelta(seconds=1)) == timedelta(seconds=4)


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
    ],
)
def test_command_argv(command: list[str] | str, argv: list[str]) -> None:
    spec = make_job("j").build().spec.model_copy(update={"command": command})
    assert agent.command_argv(spec, "0,1") == argv


def test_conda_env_without_conda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    spec = make_job("j").build().spec.model_copy(update={"conda_env": "torch"})
    with pytest.raises(errors.Invalid, match="condaEnv 'torch': conda is not on this node"):
        agent.command_argv(spec, "0")

"""What to run for an attempt: the command line and environment of a Job on its GPUs, as the
node agent hands them to a supervisor (runtime.Launch)."""

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gctl.api import binding, errors, job, names
from nodeagent import runtime


def command_argv(spec: job.JobSpec, gpu_list: str, environ: Mapping[str, str]) -> list[str]:
    """What to exec: a lone `.sh` path (a one-element list, or a string of one word) with bash,
    whether or not it is executable, as the schedulers gctl replaces ran their `.sh` jobs; any
    other string with /bin/sh -c. `{gpus}` in an argument becomes the GPU list, and condaEnv
    wraps it all in `conda run`, found as the command is, in the job's environment `environ`."""
    if isinstance(spec.command, str):
        command = spec.command.replace("{gpus}", gpu_list)
        words = command.split()
        argv = words if len(words) == 1 and _lone_script(words[0]) else ["/bin/sh", "-c", command]
    else:
        argv = [arg.replace("{gpus}", gpu_list) for arg in spec.command]
    if len(argv) == 1 and argv[0].endswith(".sh"):
        argv = ["bash", *argv]
    if spec.conda_env:
        argv = [
            _conda(spec.conda_env, environ),
            "run",
            "-n",
            spec.conda_env,
            "--no-capture-output",
            *argv,
        ]
    return argv


def _conda(name: str, environ: Mapping[str, str]) -> str:
    """The conda executable: on the job's PATH (the agent's, or the one its `env` sets), else
    where the job's CONDA_EXE says, as conda's own shell hooks find it. A daemon started outside
    an initialised shell (systemd, cron) has neither, and a Job can then name it in `env`."""
    found = shutil.which("conda", path=environ.get("PATH", os.defpath))
    if found is not None:
        return found
    exe = environ.get("CONDA_EXE", "")
    if exe and os.access(exe, os.X_OK):
        return exe
    raise errors.Invalid(
        f"spec.condaEnv {name!r}: conda is not on the job's PATH on this node, nor is CONDA_EXE "
        "set to it: set spec.env PATH or CONDA_EXE"
    )


def _lone_script(word: str) -> bool:
    """A `.sh` path and nothing the shell would read otherwise (quotes, `$`, globs ...)."""
    return word.endswith(".sh") and all(c.isalnum() or c in "._-/+@%:,=" for c in word)


@dataclass(frozen=True)
class Settings:
    """The agent's part of every launch: who runs it, and how it may be stopped."""

    node_name: str
    grace_seconds: float
    lease_path: Path | None  # None: no fencing
    fence_seconds: float


def launch_for(
    attempts: runtime.Runtime,
    settings: Settings,
    bound: binding.Binding,
    owner: job.Job,
    *,
    wait_for: tuple[Path, ...] = (),
) -> runtime.Launch:
    """What to run for an attempt of `owner`; errors.Invalid if it cannot start here."""
    named = (
        ("metadata.namespace", owner.namespace),
        ("metadata.name", owner.name),
        ("the Binding's spec.jobUID", bound.spec.job_uid),
    )
    for field, value in named:
        try:  # they name the log's directories: never a path outside the logs
            names.check_dns_label(value)
        except ValueError as exc:
            raise errors.Invalid(f"{field}: {exc}") from None
    gpu_list = ",".join(str(g) for g in bound.spec.gpus)
    env = (
        dict(os.environ)
        | {name: value.replace("{gpus}", gpu_list) for name, value in owner.spec.env.items()}
        | {
            owner.spec.gpu_env: gpu_list,
            "GCTL_JOB_NAME": owner.name,
            "GCTL_NAMESPACE": owner.namespace,
            "GCTL_ATTEMPT": str(bound.spec.attempt),
            "GCTL_GPUS": gpu_list,
            "GCTL_NODE": settings.node_name,
        }
    )
    argv = command_argv(owner.spec, gpu_list, env)
    grace = owner.spec.termination_grace_period_seconds
    warning = owner.spec.stop_warning
    return runtime.Launch(
        uid=bound.metadata.uid or "",
        argv=argv,
        env=env,
        cwd=owner.spec.working_dir,
        log_path=attempts.log_path(
            owner.namespace, owner.name, bound.spec.job_uid, bound.spec.attempt
        ),
        grace_seconds=settings.grace_seconds if grace is None else grace,
        lease_path=settings.lease_path,
        fence_seconds=settings.fence_seconds,
        fence_grace_seconds=settings.grace_seconds,
        stop_warning=None if warning is None else (warning.signal, warning.seconds),
        success_file=owner.spec.success_file,
        wait_for=wait_for,
    )

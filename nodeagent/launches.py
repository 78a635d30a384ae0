"""What to run for an attempt: the command line and environment of a Job on its GPUs, as the
node agent hands them to a supervisor (runtime.Launch)."""

import dataclasses
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


def distributed_env(spec: binding.BindingSpec) -> tuple[dict[str, str], dict[str, str]]:
    """What a member of a multi-node attempt is told of the others, as a PyTorchJob's pods
    are: (the variables distributed launchers read, which the Job's own `env` may set
    otherwise, the user knowing better; gctl's own, which it may not). Both empty for a
    single-node attempt.

    MASTER_ADDR and MASTER_PORT say where rank 0 listens, WORLD_SIZE and RANK count nodes (a
    PyTorchJob's replicas; torchrun sets them again for each process it starts), and the
    `PET_` ones are torchrun's own configuration (`--nnodes`, `--node-rank`, `--master-addr`,
    `--master-port`, `--nproc-per-node`: one process per GPU), so `torchrun train.py` needs
    nothing more. A member
    bound without an address or port gets rank 0's node name and `binding.master_port` of its
    Job, which every member works out alike."""
    if spec.rank is None:
        return {}, {}
    nodes = str(len(spec.members))
    rank = str(spec.rank)
    address = spec.master_addr or (spec.members[0] if spec.members else "")
    port = str(spec.master_port or binding.master_port(spec.job_uid))
    launcher = {
        "MASTER_ADDR": address,
        "MASTER_PORT": port,
        "WORLD_SIZE": nodes,
        "RANK": rank,
        "NODE_RANK": rank,
        "NNODES": nodes,
        "PET_NNODES": nodes,
        "PET_NODE_RANK": rank,
        "PET_MASTER_ADDR": address,
        "PET_MASTER_PORT": port,
        # torchrun's --nproc-per-node: a process per GPU of the member, as Kubeflow sets it
        "PET_NPROC_PER_NODE": str(len(spec.gpus) or 1),
    }
    own = {"GCTL_NODE_RANK": rank, "GCTL_NNODES": nodes, "GCTL_NODES": ",".join(spec.members)}
    return launcher, own


@dataclass(frozen=True)
class Settings:
    """The agent's part of every launch: who runs it, and how it may be stopped; and the
    environment every job starts from, the agent's as it started (copying `os.environ` decodes
    every variable again: 65 us a launch with 35 of them)."""

    node_name: str
    grace_seconds: float
    lease_path: Path | None  # None: no fencing
    fence_seconds: float
    environ: dict[str, str] = dataclasses.field(
        default_factory=lambda: dict(os.environ), hash=False, compare=False
    )


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
    launcher, own = distributed_env(bound.spec)
    env = (
        settings.environ
        | launcher
        | {name: value.replace("{gpus}", gpu_list) for name, value in owner.spec.env.items()}
        | {
            owner.spec.gpu_env: gpu_list,
            "GCTL_JOB_NAME": owner.name,
            "GCTL_NAMESPACE": owner.namespace,
            "GCTL_ATTEMPT": str(bound.spec.attempt),
            "GCTL_GPUS": gpu_list,
            "GCTL_NODE": settings.node_name,
        }
        | own
    )
    argv = command_argv(owner.spec, gpu_list, env)
    grace = owner.spec.termination_grace_period_seconds
    warning = owner.spec.stop_warning
    working_dir, success_file = owner.spec.working_dir, owner.spec.success_file
    return runtime.Launch(
        uid=bound.metadata.uid or "",
        argv=argv,
        env=env,
        # `{gpus}` here too, as in a Sweep's template, which leaves it for the agent (QA: a
        # Sweep's successFile `done-{gpus}` was looked for as written, and the Job failed)
        cwd=working_dir.replace("{gpus}", gpu_list) if working_dir else working_dir,
        log_path=attempts.log_path(
            owner.namespace, owner.name, bound.spec.job_uid, bound.spec.attempt
        ),
        grace_seconds=settings.grace_seconds if grace is None else grace,
        lease_path=settings.lease_path,
        fence_seconds=settings.fence_seconds,
        fence_grace_seconds=settings.grace_seconds,
        stop_warning=None if warning is None else (warning.signal, warning.seconds),
        success_file=success_file.replace("{gpus}", gpu_list) if success_file else success_file,
        wait_for=wait_for,
    )

"""`gctl logs`, `run`, `rerun`, `cordon`, `drain` and `uncordon`: the verbs over Jobs and the
GPUs they run on, their flags, and the hand-over to the modules that run them.

Typer and the standard library only at the top (see gctl/cli/main.py, which registers these
functions as commands): each command imports the rest when it runs.
"""

from typing import Annotated

import typer

from gctl.cli.options import DbOpt, NamespaceOpt

FromNodeOpt = Annotated[
    bool,
    typer.Option(
        "--from-node",
        help="Read the output through its node's agent even if its path exists here "
        "(a directory shared over NFS, which does not see another host's appends).",
    ),
]


def logs(
    job: Annotated[str, typer.Argument(help="The Job, as NAME or job/NAME.")],
    namespace: NamespaceOpt = None,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing output until the attempt ends.")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option("--attempt", help="Show attempt N (default: the latest).", min=1)
    ] = None,
    previous: Annotated[
        bool, typer.Option("-p", "--previous", help="Show the attempt before the latest.")
    ] = False,
    rank: Annotated[
        int | None,
        typer.Option(
            "--rank",
            help="Of a multi-node Job, show member R's output, from its node (default: rank 0).",
            min=0,
        ),
    ] = None,
    from_node: FromNodeOpt = False,
    db: DbOpt = None,
) -> None:
    """Print the output of a Job's latest attempt (or another one); -f follows it."""
    from gctl.cli import running

    running.logs(
        name=job,
        namespace=namespace,
        follow=follow,
        attempt=attempt,
        previous=previous,
        db_url=db,
        from_node=from_node,
        rank=rank,
    )


def run(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="What to run, after -- when it has options of its own.",
            metavar="-- COMMAND [ARGS]",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The Job's name (default: run-XXXXX).")
    ] = None,
    namespace: NamespaceOpt = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="GPUs: a fraction in (0,1], a whole number, or 0.")
    ] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", help="Memory needed on each GPU, e.g. 24Gi.")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="A GPUProfile for what --gpus and --gpu-memory leave out."),
    ] = None,
    priority: Annotated[str | None, typer.Option("--priority", help="Higher runs first.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE in the environment (repeatable).")
    ] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="The GPUPool to run in.")] = None,
    depends_on: Annotated[
        list[str] | None,
        typer.Option(
            "--depends-on",
            help="Start once these Jobs or Sweeps have succeeded (repeatable, or a,b).",
        ),
    ] = None,
    backoff_limit: Annotated[
        str | None, typer.Option("--backoff-limit", help="Retries after a failure (default 0).")
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time",
            help="Stop and fail it after running this long, as srun --time: 30m, 2h, 1d.",
        ),
    ] = None,
    conda_env: Annotated[
        str | None, typer.Option("--conda-env", help="Run inside this conda environment.")
    ] = None,
    gpu_env: Annotated[
        str | None,
        typer.Option(
            "--gpu-env",
            help="The variable that carries the GPU list, e.g. ASCEND_RT_VISIBLE_DEVICES.",
        ),
    ] = None,
    nodes: Annotated[
        str | None,
        typer.Option(
            "--nodes",
            help="Run on this many nodes at once, --gpus whole GPUs on each (as srun --nodes); "
            "each gets MASTER_ADDR, RANK, WORLD_SIZE and torchrun's PET_ variables.",
        ),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option("--node", help="Run on this node only, or on some of a,b,c (--nodes)."),
    ] = None,
    gpu_ids: Annotated[
        str | None,
        typer.Option(
            "--gpu-ids",
            help="Run on these GPU indices, e.g. 0,1 or 0-3 (--gpus defaults to as many).",
        ),
    ] = None,
    attach: Annotated[
        bool,
        typer.Option(
            "--attach",
            help="Stream the output and exit with the Job's exit code; Ctrl-C deletes the Job.",
        ),
    ] = False,
    from_node: FromNodeOpt = False,
    labels: Annotated[
        list[str] | None, typer.Option("-l", "--labels", help="key=value labels (repeatable).")
    ] = None,
    db: DbOpt = None,
) -> None:
    """Create a Job that runs a command in this directory, like kubectl run or srun."""
    from gctl.cli import running

    running.run(
        command=command or [],
        name=name,
        namespace=namespace,
        gpus=gpus,
        gpu_memory=gpu_memory,
        profile=profile,
        priority=priority,
        env=env or [],
        pool=pool,
        depends_on=depends_on or [],
        backoff_limit=backoff_limit,
        time_limit=time_limit,
        conda_env=conda_env,
        gpu_env=gpu_env,
        labels=labels or [],
        attach=attach,
        db_url=db,
        node=node,
        nodes=nodes,
        gpu_ids=gpu_ids,
        from_node=from_node,
    )


TargetsArg = Annotated[
    list[str],
    typer.Argument(
        help="gpuN (on the only node, or --node), NODE/gpuN, or node NAME...",
        metavar="TARGET...",
        show_default=False,
    ),
]
NodeFlagOpt = Annotated[
    str | None, typer.Option("--node", help="The node of a bare gpuN when there are several.")
]


def rerun(
    resource: Annotated[str, typer.Argument(help="job, or job/NAME.")],
    names: Annotated[list[str] | None, typer.Argument(help="The Job's name.")] = None,
    namespace: NamespaceOpt = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why, for the Event (default: gctl rerun).")
    ] = None,
    db: DbOpt = None,
) -> None:
    """Run a Job again, whatever its phase: a running attempt is stopped (not counted as a
    failure), a finished Job goes back to the queue; attempt numbers go on."""
    from gctl.cli import rerunning

    rerunning.rerun(
        resource=resource, names=names or [], namespace=namespace, reason=reason, db_url=db
    )


def cordon(targets: TargetsArg, node: NodeFlagOpt = None, db: DbOpt = None) -> None:
    """Start no new jobs on GPUs or a node; running jobs go on.

    Targets: gpu0 (GPU 0 of the only node, or of --node), box2/gpu1, node box2.
    """
    from gctl.cli import draining

    draining.cordon(words=targets, node_flag=node, db_url=db)


def drain(
    targets: TargetsArg,
    node: NodeFlagOpt = None,
    evict: Annotated[
        bool,
        typer.Option(
            "--evict", help="Stop the jobs there now; they go back to the queue, not failed."
        ),
    ] = False,
    wait_: Annotated[
        bool, typer.Option("--wait", help="Return once no job is left there.")
    ] = False,
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", help="With --wait: give up after 30s, 10m, 1h (default: never)."),
    ] = None,
    db: DbOpt = None,
) -> None:
    """Let the jobs on GPUs or a node finish and start no new ones, as Slurm drains.

    The target shows Draining, then Drained once no job is left. With --evict the jobs are
    stopped now and go back to the queue (not counted as failures). Targets: gpu0 (GPU 0 of
    the only node, or of --node), box2/gpu1, node box2.
    """
    from gctl.cli import draining

    draining.drain(
        words=targets, node_flag=node, evicting=evict, wait=wait_, timeout=timeout, db_url=db
    )


def uncordon(targets: TargetsArg, node: NodeFlagOpt = None, db: DbOpt = None) -> None:
    """Open GPUs or a node to new jobs again: clears cordon and drain.

    Targets: gpu0 (GPU 0 of the only node, or of --node), box2/gpu1, node box2.
    """
    from gctl.cli import draining

    draining.uncordon(words=targets, node_flag=node, db_url=db)

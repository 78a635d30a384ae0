"""`gctl up`, `gctl controller run` and `gctl agent run`: their flags, and the hand-over to
gctl/cli/daemons.py, which is the one module that imports the controller and the node agent.

Typer and the standard library only at the top: the daemons load inside the commands.
"""

import math
from typing import TYPE_CHECKING, Annotated

import typer

from gctl.cli.options import DbOpt, fail

if TYPE_CHECKING:
    from gctl.cli import daemons

controller_app = typer.Typer(
    help="The controller: schedules and follows Jobs.", no_args_is_help=True
)
agent_app = typer.Typer(help="The node agent: runs this host's bound Jobs.", no_args_is_help=True)

FakeGpusOpt = Annotated[
    int | None,
    typer.Option("--fake-gpus", help="Offer N fake GPUs instead of asking NVML.", min=0),
]
GpuModelOpt = Annotated[str, typer.Option("--gpu-model", help="Model name of fake GPUs.")]


def _memory(param: typer.CallbackParam, value: str) -> str:
    from gctl.api import quantity  # the standard library only: nothing heavy

    try:
        quantity.parse_bytes(value)
    except ValueError as exc:
        fail(f"{param.opts[0]}: {exc}")
    return value


GpuMemoryOpt = Annotated[
    str, typer.Option("--gpu-memory", help="Memory of each fake GPU.", callback=_memory)
]
NodeNameOpt = Annotated[
    str | None, typer.Option("--node-name", help="This node's name (default: the host name).")
]
StateDirOpt = Annotated[
    str | None,
    typer.Option(
        "--state-dir",
        help="Where attempts and logs live (default: ~/.local/state/gctl/NODE; with --simulate, "
        "the virtual agent's lock: ~/.local/state/gctl/_virtual/PREFIX).",
    ),
]
LabelOpt = Annotated[
    list[str] | None, typer.Option("--label", help="Node label key=value (repeatable).")
]
AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Where other nodes reach this one, for multi-node Jobs' MASTER_ADDR "
        "(default: the host name).",
    ),
]


def _seconds(param: typer.CallbackParam, value: float) -> float:
    """NaN passes click's range checks and infinity its minimum: a daemon's number of seconds
    must be finite, and at most a year, which its clocks and waits can hold."""
    from gctl.api import quantity  # the standard library only: nothing heavy

    if not value <= quantity.MAX_DURATION_SECONDS:  # NaN fails this too
        fail(f"{param.opts[0]}: {value:g} is not a finite number of seconds of at most a year")
    return value


def _finite(param: typer.CallbackParam, value: float) -> float:
    if not math.isfinite(value):
        fail(f"{param.opts[0]}: {value:g} is not a finite number")
    return value


HeartbeatOpt = Annotated[
    float,
    typer.Option("--heartbeat", help="Seconds between heartbeats.", min=0.1, callback=_seconds),
]
GraceOpt = Annotated[
    float,
    typer.Option(
        "--grace-period",
        help="Seconds between SIGTERM and SIGKILL when stopping.",
        min=0,
        callback=_seconds,
    ),
]
BackoffOpt = Annotated[
    float,
    typer.Option(
        "--backoff",
        help="Seconds before the first retry of a failed Job; doubles each time, up to 6 minutes.",
        min=0,
        callback=_seconds,
    ),
]
NodeTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--node-timeout",
        help="Seconds without a heartbeat before a node is NotReady (its jobs are retried "
        "elsewhere once their agent's fence has stopped them too).",
        min=0.5,
        callback=_seconds,
    ),
]


SyncDirOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sync", help="Also keep this directory synced, as `gctl sync DIR --watch` (repeatable)."
    ),
]


FenceOpt = Annotated[
    float,
    typer.Option(
        "--fence-after",
        help="Stop this node's jobs when the agent has been silent this long (seconds; 0: "
        "never). The controller retries a silent node's jobs elsewhere only after this, "
        "--grace-period and one heartbeat.",
        min=0,
        callback=_seconds,
    ),
]


SimulateOpt = Annotated[
    bool,
    typer.Option(
        "--simulate",
        help="Run no processes: each Job 'runs' for its gctl/simulated-duration annotation "
        "(seconds) on virtual nodes.",
    ),
]
VirtualNodesOpt = Annotated[
    int | None,
    typer.Option("--virtual-nodes", help="With --simulate: how many Nodes to play.", min=1),
]
GpusPerNodeOpt = Annotated[
    int, typer.Option("--gpus-per-node", help="With --simulate: GPUs of each Node.", min=0)
]
TimeScaleOpt = Annotated[
    float,
    typer.Option(
        "--time-scale",
        help="With --simulate: run simulated time this many times faster.",
        min=1e-9,  # nodeagent.virtual.MIN_TIME_SCALE
        callback=_finite,
    ),
]
NamePrefixOpt = Annotated[
    str, typer.Option("--name-prefix", help="With --simulate: Nodes are PREFIX-0001...")
]


def _agent_options(
    node_name: str | None,
    fake_gpus: int | None,
    gpu_model: str,
    gpu_memory: str,
    state_dir: str | None,
    labels: list[str] | None,
    heartbeat: float,
    grace: float,
    fence: float,
    address: str | None = None,
) -> "daemons.AgentOptions":
    from pathlib import Path

    from gctl.cli import daemons

    return daemons.AgentOptions(
        node_name=node_name,
        fake_gpus=fake_gpus,
        gpu_model=gpu_model,
        gpu_memory=gpu_memory,
        state_dir=Path(state_dir) if state_dir else None,
        labels=labels or [],
        heartbeat_seconds=heartbeat,
        grace_seconds=grace,
        fence_seconds=fence,
        address=_address(address),
    )


def _address(value: str | None) -> str | None:
    """--address as given: a host name or IP address, without spaces or a port."""
    if value is None:
        return None
    text = value.strip()
    if not text or any(c.isspace() for c in text) or "/" in text:
        fail(f"--address: {value!r} is not a host name or IP address")
    return text


def up(
    fake_gpus: FakeGpusOpt = None,
    gpu_model: GpuModelOpt = "Fake GPU",
    gpu_memory: GpuMemoryOpt = "80Gi",
    node_name: NodeNameOpt = None,
    state_dir: StateDirOpt = None,
    label: LabelOpt = None,
    heartbeat: HeartbeatOpt = 10.0,
    grace_period: GraceOpt = 10.0,
    fence_after: FenceOpt = 30.0,
    address: AddressOpt = None,
    node_timeout: NodeTimeoutOpt = 40.0,
    backoff: BackoffOpt = 10.0,
    sync_dirs: SyncDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Run the controller and a local node agent in one foreground process."""
    from gctl.cli import daemons

    syncs = [daemons.sync_options(d, None, True, None, None) for d in sync_dirs or []]

    options = _agent_options(
        node_name,
        fake_gpus,
        gpu_model,
        gpu_memory,
        state_dir,
        label,
        heartbeat,
        grace_period,
        fence_after,
        address,
    )
    daemons.up(db, options, node_timeout, backoff, syncs)


@controller_app.command("run")
def controller_run(
    node_timeout: NodeTimeoutOpt = 40.0,
    backoff: BackoffOpt = 10.0,
    sync_dirs: SyncDirOpt = None,
    db: DbOpt = None,
) -> None:
    """Run the controller in the foreground."""
    from gctl.cli import daemons

    syncs = [daemons.sync_options(d, None, True, None, None) for d in sync_dirs or []]
    daemons.controller(db, node_timeout, backoff, syncs)


def _given(ctx: typer.Context, *params: str) -> list[str]:
    """Which of the command's `params` the user gave (on the command line or through an
    environment variable), as their flags."""
    given = []
    for param in ctx.command.params:
        if param.name in params:
            source = ctx.get_parameter_source(param.name)
            if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
                given.append(param.opts[0])
    return given


# What `gctl agent run` takes only with --simulate, and only without it.
_SIMULATE_ONLY = ("gpus_per_node", "time_scale", "name_prefix")
_PROCESSES_ONLY = ("grace_period", "fence_after")


@agent_app.command("run")
def agent_run(
    ctx: typer.Context,
    fake_gpus: FakeGpusOpt = None,
    gpu_model: GpuModelOpt = "Fake GPU",
    gpu_memory: GpuMemoryOpt = "80Gi",
    node_name: NodeNameOpt = None,
    state_dir: StateDirOpt = None,
    label: LabelOpt = None,
    heartbeat: HeartbeatOpt = 10.0,
    grace_period: GraceOpt = 10.0,
    fence_after: FenceOpt = 30.0,
    address: AddressOpt = None,
    simulate: SimulateOpt = False,
    virtual_nodes: VirtualNodesOpt = None,
    gpus_per_node: GpusPerNodeOpt = 8,
    time_scale: TimeScaleOpt = 1.0,
    name_prefix: NamePrefixOpt = "vnode",
    db: DbOpt = None,
) -> None:
    """Run a node agent for this host in the foreground (or, with --simulate, virtual nodes)."""
    from pathlib import Path

    from gctl.cli import daemons

    if simulate or virtual_nodes is not None:
        if not simulate:
            fail("--virtual-nodes: give --simulate too (virtual nodes run no processes)")
        if fake_gpus is not None or node_name is not None:
            fail("--simulate: use --gpus-per-node and --name-prefix, not --fake-gpus/--node-name")
        if address is not None:
            fail("--simulate: virtual nodes run nothing to reach: leave --address out")
        for flag in _given(ctx, *_PROCESSES_ONLY):
            fail(f"--simulate: virtual nodes run no processes to stop: leave {flag} out")
        daemons.virtual_agent(
            db,
            daemons.VirtualOptions(
                nodes=1 if virtual_nodes is None else virtual_nodes,
                gpus_per_node=gpus_per_node,
                name_prefix=name_prefix,
                gpu_model=gpu_model,
                gpu_memory=gpu_memory,
                labels=label or [],
                heartbeat_seconds=heartbeat,
                time_scale=time_scale,
                state_dir=Path(state_dir) if state_dir else None,
            ),
        )
        return
    for flag in _given(ctx, *_SIMULATE_ONLY):
        fail(f"{flag}: give --simulate too (it sets up virtual nodes)")
    options = _agent_options(
        node_name,
        fake_gpus,
        gpu_model,
        gpu_memory,
        state_dir,
        label,
        heartbeat,
        grace_period,
        fence_after,
        address,
    )
    daemons.agent(db, options)

"""The queue a planning pass walks, and how far down it decides (`placement.plan`).

`Ordered` is a pass's requests in queue order, drawn as the pass goes: each pool's queue is
one or more runs already sorted (the Jobs a controller keeps from pass to pass, `pending`,
and the few it reads again every pass), merged as `placement` orders them. So a pass that
decides the head of a long queue pays for the head, not for the queue. Beside them it knows
what `Rest` and `Tail` ask of the whole: how many requests, how many must be decided
wherever they stand, and how many of each request shape.

A pass decides the queue in order, and much of a long queue behind busy GPUs would only be told
again that it waits. `Rest` says, from each place in the queue on, whether a later request could
still start now or preempt, or must be decided (it needs no GPU, or is bound ahead): a pass that
starts Jobs stops where none could (`starts_only`). `Tail` says which request shapes are left: a
pass stops behind the head of the queue once every shape left has found nothing but waiting
(`head`). Slurm splits its scheduling so too: its main scheduler looks no further than
`default_queue_depth` Jobs, and its backfill scheduler walks the rest every `bf_interval`.
"""

import heapq
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from controller.snapshot import Allocation, Request, age_key

ORDER = operator.attrgetter("order")  # `snapshot.queue_key`, as each Request keeps it
Shape = tuple[object, ...] | None  # a request's shape; None: it cannot be queued at all


def shape_of(request: Request) -> Shape:
    """The shape `Tail` counts a request under: None for one that is only told why it waits."""
    return None if request.problem is not None else request.shape


def must_decide(request: Request) -> bool:
    """Whether a pass decides the request wherever it stands (`Rest`)."""
    return request.gpus == 0 or request.queued is not None


class Ordered:
    """A pass's requests in queue order: each pool's queue in its own order (`queue_key`), the
    pools' queues merged by the priority, then the age, of the Job each has first. So a
    LongestFirst pool's newer long Jobs go ahead of its own older ones but not ahead of an
    older Job of a FIFO pool that shares their GPUs; with FIFO pools only, it is the queue
    sorted by `queue_key`. Each pool's queue is given as runs, each sorted by `queue_key`
    (read them, never change them while the pass runs), and the counts of all of them. Either
    way the priorities come out highest first: a pool's queue is sorted by priority first,
    and the merge takes the highest priority at the head of a pool's queue."""

    def __init__(
        self,
        runs: Mapping[str, Sequence[Sequence[Request]]],
        shapes: Counter[Shape],
        examples: Mapping[Shape, Request],
        must: int,
        bound: Sequence[Request] = (),
    ) -> None:
        self.runs = runs  # pool -> its sorted runs
        self.shapes = shapes  # of every request
        self.examples = examples  # shape -> a request of that shape
        self.must = must  # requests that `must_decide`
        self.bound = bound  # the requests bound ahead, in any order
        self.size = sum(len(run) for pool_runs in runs.values() for run in pool_runs)

    @classmethod
    def of(cls, requests: Iterable[Request]) -> "Ordered":
        """The requests of a pass read in full, sorted here."""
        pools: dict[str, list[Request]] = {}
        for request in requests:
            pools.setdefault(request.pool, []).append(request)
        shapes: Counter[Shape] = Counter()
        examples: dict[Shape, Request] = {}
        must = 0
        bound = []
        for waiting in pools.values():
            waiting.sort(key=ORDER)
            for request in waiting:
                shape = shape_of(request)
                shapes[shape] += 1
                examples.setdefault(shape, request)
                must += must_decide(request)
                if request.queued is not None:
                    bound.append(request)
        runs = {name: [waiting] for name, waiting in pools.items()}
        return cls(runs, shapes, examples, must, bound)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Request]:
        pools = [_merged(runs) for runs in self.runs.values()]
        if not pools:
            return iter(())
        if len(pools) == 1:
            return pools[0]
        return heapq.merge(*pools, key=age_key)

    def movable(self) -> list[Allocation]:
        """The attempts bound ahead among the requests, in queue order (`ahead`): sorted, in
        one pool's queue; else drawn from the merged queues until the last is found (one far
        back in a long queue costs a walk that far)."""
        if len(self.runs) <= 1:
            return [r.queued for r in sorted(self.bound, key=ORDER) if r.queued is not None]
        found: list[Allocation] = []
        if self.bound:
            for request in self:
                if request.queued is not None:
                    found.append(request.queued)
                    if len(found) == len(self.bound):
                        break
        return found


def _merged(runs: Sequence[Sequence[Request]]) -> Iterator[Request]:
    filled = [run for run in runs if run]
    if len(filled) == 1:
        return iter(filled[0])
    return heapq.merge(*filled, key=ORDER)


class Rest:
    """What the requests from each place in the queue on could do, for `plan(starts_only=)`.
    A pass that starts a Job writes only the Bindings of the Jobs that start (and
    preemptions): binding ahead and telling the waiting Jobs why they wait are left to the
    next pass (`writing._starting`). So once no GPU has room left, it need not decide the rest
    of a long queue only to drop the outcome, unless one of them could still start (it needs
    no GPU) or preempt (its priority is above an attempt's), or is a Job bound ahead: a Job
    before it may have taken its place, and one left undecided would keep it beside the
    taker's Binding (two Jobs next on one GPU). The pass tells it each request it takes, in
    order."""

    def __init__(self, ordered: Ordered) -> None:
        self.must = ordered.must  # of the requests not taken yet

    def take(self, request: Request) -> None:
        self.must -= must_decide(request)

    def none_may_start(self, request: Request, priorities: list[int]) -> bool:
        """Whether no request from `request` (the next to be decided) on can start now or
        preempt, where no GPU has room (`priorities`: of the attempts on the GPUs,
        ascending). The queue comes highest priority first (`Ordered`), so none behind it has
        a higher priority than it."""
        return not self.must and (not priorities or request.priority <= priorities[0])


class Tail:
    """The request shapes (`Request.shape`) from each place in the queue on, for
    `plan(head=)`. Once every GPU is full and no later request could start or preempt
    (`Rest`), a request can still bind ahead, or wait for an attempt that is stopping; when
    no shape left in the queue can do either (the planner's `exhausted`: it tried and found
    nothing, and nothing has changed since), every later request would only be told why it
    waits, and that is left to a pass that decides the whole queue. Past `MAX_SHAPES` shapes
    the pass decides the whole queue, as before. The pass tells it each request it takes."""

    MAX_SHAPES = 16

    def __init__(self, ordered: Ordered) -> None:
        self.left: Counter[Shape] = Counter(ordered.shapes)
        self.example = ordered.examples

    def take(self, request: Request) -> None:
        """The request is decided: it is no longer left."""
        shape = shape_of(request)
        self.left[shape] -= 1
        if not self.left[shape]:
            del self.left[shape]

    def settled(self, exhausted: Callable[[Request, tuple[object, ...]], bool]) -> bool:
        """Whether no shape left could do more than wait, told why (`exhausted`: whether a
        request of a shape would, as the planner now stands). Any request of a shape stands
        for it: the planner's answer depends on the shape alone."""
        if len(self.left) > self.MAX_SHAPES:
            return False
        return all(shape is None or exhausted(self.example[shape], shape) for shape in self.left)

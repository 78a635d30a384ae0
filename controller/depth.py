"""How far down the queue a planning pass decides (`placement.plan`).

A pass decides the queue in order, and much of a long queue behind busy GPUs would only be told
again that it waits. `Rest` says, from each place in the queue on, whether a later request could
still start now or preempt, or must be decided (it needs no GPU, or is bound ahead): a pass that
starts Jobs stops where none could (`starts_only`). `Tail` says which request shapes are left: a
pass stops behind the head of the queue once every shape left has found nothing but waiting
(`head`). Slurm splits its scheduling so too: its main scheduler looks no further than
`default_queue_depth` Jobs, and its backfill scheduler walks the rest every `bf_interval`.
"""

from collections import Counter
from collections.abc import Callable

from controller.snapshot import Request


class Rest:
    """What the requests from each place in the queue on could do, for `plan(starts_only=)`.
    A pass that starts a Job writes only the Bindings of the Jobs that start (and
    preemptions): binding ahead and telling the waiting Jobs why they wait are left to the
    next pass (`writing._starting`). So once no GPU has room left, it need not decide the rest
    of a long queue only to drop the outcome, unless one of them could still start (it needs
    no GPU) or preempt (its priority is above an attempt's), or is a Job bound ahead: a Job
    before it may have taken its place, and one left undecided would keep it beside the
    taker's Binding (two Jobs next on one GPU)."""

    def __init__(self, ordered: list[Request]) -> None:
        # From each index on: the highest priority, and whether a request needs no GPU or is
        # bound ahead.
        self.top: list[int] = [0] * len(ordered)
        self.must_decide: list[bool] = [False] * len(ordered)
        top, must = -(2**63), False
        for i in range(len(ordered) - 1, -1, -1):
            top = max(top, ordered[i].priority)
            must = must or ordered[i].gpus == 0 or ordered[i].queued is not None
            self.top[i], self.must_decide[i] = top, must

    def none_may_start(self, i: int, priorities: list[int]) -> bool:
        """Whether no request from index `i` on can start now or preempt, where no GPU has
        room (`priorities`: of the attempts on the GPUs, ascending)."""
        return not self.must_decide[i] and (not priorities or self.top[i] <= priorities[0])


class Tail:
    """The request shapes (`Request.shape`) from each place in the queue on, for
    `plan(head=)`. Once every GPU is full and no later request could start or preempt
    (`Rest`), a request can still bind ahead, or wait for an attempt that is stopping; when
    no shape left in the queue can do either (the planner's `exhausted`: it tried and found
    nothing, and nothing has changed since), every later request would only be told why it
    waits, and that is left to a pass that decides the whole queue. Past `MAX_SHAPES` shapes
    the pass decides the whole queue, as before."""

    MAX_SHAPES = 16

    def __init__(self, ordered: list[Request]) -> None:
        # None: it cannot be queued at all (it is only told why)
        self.shapes = [None if r.problem is not None else r.shape for r in ordered]
        self.left: Counter[tuple[object, ...] | None] = Counter(self.shapes)
        self.example = dict(zip(self.shapes, ordered, strict=True))

    def take(self, i: int) -> None:
        """The request at `i` is decided: it is no longer left."""
        shape = self.shapes[i]
        self.left[shape] -= 1
        if not self.left[shape]:
            del self.left[shape]

    def settled(self, exhausted: Callable[[Request, tuple[object, ...]], bool]) -> bool:
        """Whether no shape left could do more than wait, told why (`exhausted`: whether a
        request of a shape would, as the planner now stands)."""
        if len(self.left) > self.MAX_SHAPES:
            return False
        return all(shape is None or exhausted(self.example[shape], shape) for shape in self.left)

"""How a loop that never dies says that a pass failed and will be retried.

An error of the project's own (`errors.GctlError`: the database away or full, a conflict) is
expected and already one line that names the cause: it is logged as that line. Anything else
is a bug and keeps its traceback. Either way a failure that repeats (the same type and message,
as a full disk gives once a second) is logged once, and again only once a minute has passed,
with the count of the repeats held back; a different failure is logged at once.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gctl.api import errors

REPEAT_SECONDS = 60.0  # a repeated failure is logged again after this long, with its count
FORGET_AFTER = 10  # repeat periods after which a failure that stopped is forgotten


@dataclass
class _Seen:
    logged_at: float
    held: int = 0  # repeats since it was last logged


class FailureLog:
    """The failures of one loop's passes, logged to `logger` without repeating itself."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        repeat_seconds: float = REPEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.repeat_seconds = repeat_seconds
        self.clock = clock
        self._seen: dict[tuple[str, str], _Seen] = {}

    def failed(self, what: str, exc: BaseException) -> None:
        """`what` (such as "agent pass") failed with `exc` and will be retried."""
        now = self.clock()
        key = (type(exc).__name__, str(exc))
        seen = self._seen.get(key)
        if seen is not None and now - seen.logged_at < self.repeat_seconds:
            seen.held += 1
            return
        self._forget_old(now)
        self._seen[key] = _Seen(logged_at=now)
        held = ""
        if seen is not None and seen.held:
            held = f" (and {seen.held} time(s) more in the {now - seen.logged_at:.0f}s before)"
        if isinstance(exc, errors.GctlError):
            self.logger.warning("%s failed; retrying: %s%s", what, exc, held)
        else:
            self.logger.error("%s failed; retrying%s", what, held, exc_info=exc)

    def _forget_old(self, now: float) -> None:
        """Failures that stopped: their held repeats are told if they come back, for a while."""
        self._seen = {
            key: seen
            for key, seen in self._seen.items()
            if now - seen.logged_at < self.repeat_seconds * (FORGET_AFTER if seen.held else 1)
        }

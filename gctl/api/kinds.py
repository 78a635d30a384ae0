"""The registry of kinds: lookup by kind name or by the words users type (`jobs`, `pool`)."""

from gctl.api import binding, errors, event, job, meta, node, pool

ALL: tuple[type[meta.Resource], ...] = (
    job.Job,
    pool.GPUPool,
    node.Node,
    binding.Binding,
    event.Event,
)
# Kinds a user may apply; Nodes, Bindings and Events are written by the agent and controller.
APPLIABLE: frozenset[str] = frozenset({"Job", "GPUPool"})

BY_KIND: dict[str, type[meta.Resource]] = {cls.KIND: cls for cls in ALL}
_BY_WORD: dict[str, type[meta.Resource]] = {
    word: cls for cls in ALL for word in (*cls.ALIASES, cls.KIND.lower(), cls.PLURAL)
}


def by_word(word: str) -> type[meta.Resource]:
    """`jobs`, `job`, `job.gctl`, `pools` -> the kind; NotFound names the known words."""
    key = word.lower().removesuffix(".gctl")
    try:
        return _BY_WORD[key]
    except KeyError:
        known = ", ".join(cls.PLURAL for cls in ALL)
        raise errors.NotFound(
            f'the server doesn\'t have a resource type "{word}" (known: {known})'
        ) from None

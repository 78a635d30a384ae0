"""The project's own exceptions; every layer raises these and the CLI turns them into one line."""


class GctlError(Exception):
    """An error a user can cause or act on; its message is one line that names the fix."""

    reason = "Error"


class Invalid(GctlError):
    """Input that does not validate: a manifest, a flag, a selector."""

    reason = "Invalid"


class NotFound(GctlError):
    reason = "NotFound"


class AlreadyExists(GctlError):
    reason = "AlreadyExists"


class Conflict(GctlError):
    """A write based on a stale read (resourceVersion mismatch); retry from a fresh read."""

    reason = "Conflict"


class Forbidden(GctlError):
    """A change the object's state does not allow, such as editing a started Job's command."""

    reason = "Forbidden"


class Unavailable(GctlError):
    """The database cannot be reached or is in a state this gctl cannot use."""

    reason = "Unavailable"


class Incompatible(GctlError):
    """The database holds a schema newer than this gctl knows: no retry helps, an upgrade
    of gctl does (a daemon that waits for an Unavailable database stops on this one)."""

    reason = "Incompatible"


class StoredInvalid(GctlError):
    """A stored object that no longer validates: written by an older gctl under a rule since
    dropped, or edited by hand in the database. It names the object (`key`: kind, namespace,
    name) and the version read, so that a daemon can tell it apart from every other and
    report it once; `generation`, that of its spec (a status write, such as an agent's
    heartbeat, moves the version but not the generation)."""

    reason = "StoredInvalid"

    def __init__(
        self,
        key: tuple[str, str, str],
        uid: str,
        resource_version: str,
        detail: str,
        *,
        generation: int | None = None,
    ) -> None:
        kind, namespace, name = key
        where = f' in namespace "{namespace}"' if namespace else ""
        super().__init__(
            f'{kind.lower()} "{name}"{where} as stored does not validate ({detail}): written '
            "by an older gctl or edited by hand; fix or delete its row in the database"
        )
        self.key = key
        self.uid = uid
        self.resource_version = resource_version
        self.detail = detail
        self.generation = generation

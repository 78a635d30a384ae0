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

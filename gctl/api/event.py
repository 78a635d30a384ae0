"""The Event kind: what happened to an object and why."""

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from gctl.api import kinds, meta


class ObjectReference(meta.Model):
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None


class EventSpec(meta.Model):
    involved_object: ObjectReference
    type: Literal["Normal", "Warning"] = "Normal"
    reason: str
    message: str = ""
    source: str = ""
    count: int = Field(default=1, ge=1)
    first_timestamp: datetime | None = None
    last_timestamp: datetime | None = None


class EventStatus(meta.Model):
    pass


class Event(meta.Resource):
    INFO: ClassVar[kinds.KindInfo] = kinds.EVENT

    kind: Literal["Event"] = "Event"
    spec: EventSpec
    status: EventStatus = Field(default_factory=EventStatus)

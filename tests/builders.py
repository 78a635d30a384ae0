"""Builders for test objects: `make_job("a").gpus(2).on("n1").build()` and manifest text."""

from dataclasses import dataclass, field
from typing import Any

import yaml

from gctl.api import job, meta


@dataclass
class JobBuilder:
    name: str
    spec: dict[str, Any] = field(default_factory=lambda: {"command": ["true"]})
    labels: dict[str, str] = field(default_factory=dict)
    namespace: str | None = None

    def gpus(self, count: float) -> "JobBuilder":
        self.spec.setdefault("resources", {})["gpus"] = count
        return self

    def memory(self, quantity: str) -> "JobBuilder":
        self.spec.setdefault("resources", {})["gpuMemory"] = quantity
        return self

    def on(self, node: str, *gpus: int) -> "JobBuilder":
        self.spec["placement"] = {"node": node, **({"gpus": list(gpus)} if gpus else {})}
        return self

    def priority(self, value: int) -> "JobBuilder":
        self.spec["priority"] = value
        return self

    def command(self, *argv: str) -> "JobBuilder":
        self.spec["command"] = list(argv)
        return self

    def label(self, key: str, value: str) -> "JobBuilder":
        self.labels[key] = value
        return self

    def in_namespace(self, namespace: str) -> "JobBuilder":
        self.namespace = namespace
        return self

    def document(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name}
        if self.labels:
            metadata["labels"] = self.labels
        if self.namespace:
            metadata["namespace"] = self.namespace
        return {"apiVersion": "gctl/v1", "kind": "Job", "metadata": metadata, "spec": self.spec}

    def yaml(self) -> str:
        return yaml.safe_dump(self.document(), sort_keys=False)

    def build(self) -> job.Job:
        return job.Job.model_validate(self.document())


def make_job(name: str) -> JobBuilder:
    return JobBuilder(name)


def manifests(*builders: JobBuilder) -> str:
    return "---\n".join(b.yaml() for b in builders)


def object_meta(name: str, namespace: str | None = None) -> meta.ObjectMeta:
    return meta.ObjectMeta(name=name, namespace=namespace)

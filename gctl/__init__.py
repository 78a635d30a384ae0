"""gctl: a declarative GPU job orchestrator."""

__version__ = "0.1.0"

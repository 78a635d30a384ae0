"""The node agent: GPU discovery, the processes bound to this host's GPUs, and status reports.

It imports gctl.api and gctl.store only, never the controller. Import its modules, not names.
"""

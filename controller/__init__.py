"""The controller: reconcilers that move Jobs, Bindings and Nodes toward what users declared.

It imports gctl.api and gctl.store only, never the node agent. Import its modules, not names.
"""

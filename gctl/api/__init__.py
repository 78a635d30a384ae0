"""The resource kinds (Job, GPUPool, Node, Binding, Event), their validation and quantities.

This package is the bottom layer: it imports nothing else of gctl and knows no database.
Import its modules, not names from this package.
"""

"""The `gctl` command. `main` imports only typer and the standard library; each command imports
what it needs when it runs, so that `gctl version` and `gctl --help` start fast."""

"""The `mlx-spec` command: app.py (the commands and the entry point), flags.py (the flags
every command shares), chat_loop.py (`mlx-spec chat`'s conversation), terminal.py (what it
prints)."""

from .app import cli, main

__all__ = ["cli", "main"]

"""`python -m mlx_spec`, as the `mlx-spec` command (a newcomer's first try; `python -m mlx_spec.cli` too)."""

from .cli.app import main

main()

"""`python -m mlx_spec.cli`, as the `mlx-spec` command."""

from .app import main

main()

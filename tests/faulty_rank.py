"""`mlx-spec` on every rank of a group, with a fault on one rank alone (tests/test_distributed.py,
tests/test_distributed_serve.py): what a full disk or memory that ran out on one machine does.

    python faulty_rank.py RANK:WHERE mlx-spec-arguments...

WHERE: "load" (reading the weights raises an OSError) or "step" (a batch step raises a
MemoryError)."""

import os
import sys

from mlx_spec.cli.app import main

rank, where = sys.argv[1].split(":")
if os.environ.get("MLX_RANK") == rank:
    if where == "load":
        import mlx_spec.loading as loading

        def evaluate_weights(target):
            raise OSError(28, "No space left on device")

        loading.evaluate_weights = evaluate_weights
    elif where == "step":
        from mlx_spec.decoding.batch import Batch

        def step(self):
            raise MemoryError("this rank alone ran out of memory")

        Batch.step = step
    else:
        raise SystemExit(f"unknown fault {where!r}")
main(sys.argv[2:])

"""`mlx-spec bench batch` from a checkout (the code is mlx_spec/bench/batch.py): its JSON and
markdown go to the results folder (--out, by default a dated one here), with the report."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_spec.bench import run  # noqa: E402

if __name__ == "__main__":
    run("batch", sys.argv[1:])

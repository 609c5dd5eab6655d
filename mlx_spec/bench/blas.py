"""Which BLAS MLX's CPU matrix products run on, and how fast, for the benchmarks' machine line.

On a Mac, MLX's CPU side calls Accelerate (and the model runs on Metal). On Linux the `mlx[cpu]`
wheel brings netlib's reference BLAS (`mlx_cpu.libs/libblas-*.so.3.10.0`): on a two-core Xeon a
512 x 512 product runs at about 5 GFLOP/s there, against some 300 with OpenBLAS. Every batched
figure on such a machine is bent by it (a step's rows cost far more than they would), so the
figures name it. A BLAS preloaded (`LD_PRELOAD=.../libopenblas.so`) comes first in the dynamic
linker's search, so MLX's `cblas_sgemm` resolves to it.
"""

import os
import sys
import time
from typing import Optional

import mlx.core as mx

BLAS_NAMES = ("blas", "mkl", "blis", "accelerate")


def blas_library() -> str:
    """The library MLX's CPU matrix products call, as a short description."""
    if sys.platform == "darwin":
        return "Accelerate"
    preloaded = [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if _is_blas(p)]
    if preloaded:
        return f"{os.path.basename(preloaded[0])} (preloaded)"
    loaded = _loaded_blas()
    if loaded is None:
        return "unknown"
    name = os.path.basename(loaded)
    if name.startswith("libblas") and "mlx_cpu.libs" in loaded:
        return f"{name} (netlib reference BLAS, from the mlx-cpu wheel)"
    return name


def matmul_gflops(n: int = 512, repeats: int = 3) -> float:
    """GFLOP/s of an n x n float32 product on MLX's default device (the best of `repeats`)."""
    a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
    mx.eval(a, b, a @ b)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - began)
    return 2 * n ** 3 / best / 1e9


def _is_blas(path: str) -> bool:
    name = os.path.basename(path).lower()
    return any(k in name for k in BLAS_NAMES) and "lapack" not in name


def _loaded_blas() -> Optional[str]:
    """The first BLAS among the libraries mapped into this process (Linux), MLX's own first."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:
        return None
    found = sorted(p for p in paths if _is_blas(p))
    ours = [p for p in found if "mlx" in p]
    return (ours or found or [None])[0]

"""The model files a benchmark measured, named by their sha256, so that two reports can be told
apart by the weights they ran and not only by a repository name that may have moved on."""

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from ..errors import LoadError
from ..models.checkpoint import resolve, weight_files


def fingerprint(target: str, drafter: Optional[str]) -> Dict[str, List[dict]]:
    """{"target": [{"file", "bytes", "sha256"}, ...], "drafter": [...]} for a loaded pair."""
    out = {}
    for role, name in (("target", target), ("drafter", drafter)):
        if name:
            try:
                out[role] = model_files(resolve(name, role))
            except LoadError as e:  # not on this machine: say so rather than fail the run
                out[role] = [{"file": name, "error": str(e)}]
    return out


def model_files(folder: Path) -> List[dict]:
    files = [Path(f) for f in weight_files(folder)] + [folder / "config.json"]
    return [{"file": f.name, "bytes": f.stat().st_size, "sha256": sha256(f)} for f in files if f.is_file()]


def sha256(file: Path) -> str:
    """The file's sha256. huggingface-hub stores a downloaded weight file as a blob named by its
    sha256; that name is used rather than reading gigabytes again. A local folder's files are
    read once per process (`mlx-spec bench all` names them in every table)."""
    real = file.resolve()
    return _digest(real, real.stat().st_size, real.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _digest(real: Path, size: int, mtime_ns: int) -> str:  # size and mtime: a changed file is read again
    if real.parent.name == "blobs" and len(real.name) == 64 and all(c in "0123456789abcdef" for c in real.name):
        return real.name
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()

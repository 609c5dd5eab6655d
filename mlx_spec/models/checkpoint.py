"""Finding and reading a checkpoint, whatever its family: a local folder as it is, or a hub
repo id downloaded with huggingface-hub (only configs, tokenizer and processor files and
safetensors). Only safetensors are read and no code from a checkpoint runs. Every problem a
user can cause is a `LoadError` naming the path and what is wrong.
"""

import glob
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import LoadError

ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    # The image and audio processors' settings (media/processor.py reads them).
    "processor_config.json",
    "preprocessor_config.json",
]


@dataclass
class Checkpoint:
    path: Path
    config: dict
    generation_config: dict


def resolve(path_or_repo: str, what: str) -> Path:
    """A local folder, or a hub repo id downloaded (configs, tokenizer and safetensors only)."""
    path = Path(path_or_repo).expanduser()
    if path.exists():
        if not path.is_dir():
            raise LoadError(f"{what} {path_or_repo}: not a folder")
        return path
    if not _looks_like_repo_id(path_or_repo):
        raise LoadError(f"{what} {path_or_repo}: no such folder")
    return _download(path_or_repo, what)


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _download(repo_id: str, what: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except GatedRepoError:
        raise LoadError(
            f"{what} {repo_id}: the repository is gated; accept its license on the hub and log in"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError, HFValidationError):
        raise LoadError(f"{what} {repo_id}: no such folder, and no such repository on the hub") from None
    except LocalEntryNotFoundError:
        raise LoadError(
            f"{what} {repo_id}: no such folder; as a hub repo it is not in the local cache either, "
            "and the hub cannot be reached (offline?)"
        ) from None


def read_checkpoint(path: Path, what: str) -> Checkpoint:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise LoadError(f"{what} {path}: no config.json")
    config = read_json(config_file, what)
    generation = path / "generation_config.json"
    generation_config = read_json(generation, what) if generation.is_file() else {}
    for name, value in (("config.json", config), ("generation_config.json", generation_config)):
        if not isinstance(value, dict):
            raise LoadError(f"{what} {path}: {name} is not a JSON object")
    if not weight_files(path):
        raise LoadError(f"{what} {path}: no weights (model*.safetensors)")
    return Checkpoint(path, config, generation_config)


def weight_files(path: Path) -> list:
    # The names mlx-lm reads; only safetensors, never pickles.
    return sorted(glob.glob(str(path / "model*.safetensors")))


def read_json(file: Path, what: str) -> dict:
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:  # not JSON, or not UTF-8 text
        raise LoadError(f"{what} {file}: not valid JSON ({e})") from None


def mlx_error(what: str, path: Path, error: Exception) -> LoadError:
    """mlx-lm's or MLX's complaint about a checkpoint, as one line naming it: a weights file it
    cannot read, a key the config lacks, or weights that do not fit the config."""
    one_line = " ".join(str(error).split())
    if "[load_safetensors]" in one_line:
        return LoadError(f"{what} {path}: a weights file (model*.safetensors) is unreadable or incomplete, as a "
                         f"download cut short or a git-lfs pointer cloned without git-lfs is: {one_line}")
    if isinstance(error, KeyError):
        return LoadError(f"{what} {path}: mlx-lm needs {one_line}, which config.json (or the weights) lacks")
    if isinstance(error, TypeError):
        return LoadError(f"{what} {path}: mlx-lm cannot build the model from this config.json: {one_line}")
    return LoadError(f"{what} {path}: the weights do not fit the config: {one_line}")

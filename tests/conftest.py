"""Session-wide tiny checkpoints, built once per test run with transformers (no network).

The suite runs on every core (pytest-xdist, see pyproject.toml); the checkpoints are built once
for all the workers, in the run's shared temporary folder, by whichever worker asks first.
"""

import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One process per core: torch's own thread pool would have each worker spin on both cores
    # (OpenMP threads busy-wait between parallel regions), slowing the other worker's MLX work.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from filelock import FileLock  # noqa: E402

import chat_script  # noqa: E402
import tiny  # noqa: E402


def built_once(tmp_path_factory, name: str, build):
    """`build(folder)`'s result (a JSON-able mapping of names to paths), built once per test
    run and shared by every xdist worker: the first to ask builds it under a lock."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    folder, done = shared / f"built-{name}", shared / f"built-{name}.json"
    with FileLock(str(shared / f"built-{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half way
            folder.mkdir()
            done.write_text(json.dumps({k: str(v) for k, v in build(folder).items()}))
    return {k: Path(v) for k, v in json.loads(done.read_text()).items()}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    return built_once(tmp_path_factory, "checkpoints", lambda root: {
        "text": tiny.build_target(root / "target-text", "text"),
        "google": tiny.build_target(root / "target-google", "google", tokenizer=False),
        "assistant": tiny.build_assistant(root / "assistant", ordered=True),
        "assistant_plain": tiny.build_assistant(root / "assistant-plain", ordered=False),
    })


@pytest.fixture(scope="session")
def no_template(checkpoints, tmp_path_factory):
    """The tiny text target with a tokenizer that has no chat template, as a base model or a
    hand-made conversion has (the weights are the text target's)."""

    def build(root):
        for name in ("config.json", "model.safetensors"):
            shutil.copy(checkpoints["text"] / name, root / name)
        tiny.save_tokenizer(root, chat_template=False)
        return {"target": root}

    return built_once(tmp_path_factory, "no-template", build)["target"]


@pytest.fixture(scope="session")
def engine(checkpoints):
    """The tiny target and MTP assistant, with no stop tokens: the random tiny model would end
    early, and most tests want long outputs. (test_chat keeps the stop tokens.)"""
    from mlx_spec import load

    loaded = load(str(checkpoints["text"]), str(checkpoints["assistant"]))
    return loaded.with_stop_tokens([])


@pytest.fixture(scope="session")
def trained(checkpoints, tmp_path_factory):
    """A tiny target trained to speak Gemma 4's chat format (tool calls, a thought, turn ends),
    rendered with Google's template; see `chat_script`."""
    from mlx_spec import load

    def build(root):
        tokenizer = load(str(checkpoints["text"]), drafter=None).tokenizer
        examples = [(chat_script.render(tokenizer, *prompt), chat_script.encode(tokenizer, answer))
                    for prompt, answer in chat_script.EXAMPLES]
        return {"target": tiny.build_trained_target(root / "target", examples)}

    return built_once(tmp_path_factory, "trained", build)["target"]


@pytest.fixture(scope="session")
def long_trained(trained, tmp_path_factory):
    """The trained target with a context of 32,768 tokens (its config's
    max_position_embeddings; RoPE has no weights, so the weights are the same): room for the
    prompts agents such as Codex CLI and Claude Code send, thousands of tokens of instructions
    and tools."""

    def build(root):
        folder = root / "target"
        shutil.copytree(trained, folder)
        config = json.loads((folder / "config.json").read_text())
        config["max_position_embeddings"] = 32768
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        return {"target": folder}

    return built_once(tmp_path_factory, "long-trained", build)["target"]


@pytest.fixture(scope="session")
def multimodal(tmp_path_factory):
    """The 12B's tiny multimodal checkpoint (vision and audio towers, Google's layout, with a
    tokenizer) and its assistant: {"text": folder, "assistant": folder}."""
    return built_once(tmp_path_factory, "multimodal", lambda root: {
        "text": tiny.build_target(root / "target", layout="google", variant="12b"),
        "assistant": tiny.build_family_assistant(root / "assistant", "12b"),
    })


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """Tiny checkpoints of each Gemma 4 size (tiny.VARIANTS), each built on first use:
    family(variant) -> {"target": folder, "assistant": folder}."""

    def get(variant):
        return built_once(tmp_path_factory, f"family-{variant}", lambda root: {
            "target": tiny.build_target(root / variant, variant=variant, tokenizer=False),
            "assistant": tiny.build_family_assistant(root / f"{variant}-assistant", variant),
        })

    return get


@pytest.fixture(scope="session")
def torchvision_path(tmp_path_factory):
    """A folder holding the torchvision release made for this torch (0.28 for 2.13), for
    transformers' processors that need it to run with in a process of their own
    (tests/unified_processor.py says why). Installed here, not with the test extra: in the
    suite's own environment it would break every transformers import. Once per run, for every
    module and worker."""
    import subprocess
    import sys

    import torch

    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    wanted = f"torchvision=={major - 2}.{minor + 15}.*"

    def build(root):
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                              str(root / "site"), wanted], capture_output=True, text=True, timeout=600)
        if pip.returncode == 0:
            return {"site": root / "site"}
        (root / "error.txt").write_text(pip.stderr.strip()[-300:])
        return {"error": root / "error.txt"}

    found = built_once(tmp_path_factory, "torchvision", build)
    if "error" in found:
        pytest.skip(f"{wanted} (transformers' processors' backend) could not be installed: "
                    f"{found['error'].read_text()}")
    return found["site"]


# The modules that take longest, started first: with one module per worker at a time
# (--dist loadfile), a long module collected last would run alone at the end of the run.
LONGEST_FIRST = ("test_sampling.py", "test_bench.py", "test_chat.py", "test_compiled.py", "test_cli.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))

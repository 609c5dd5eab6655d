"""Session-wide tiny checkpoints, built once per test run with transformers (no network)."""

import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

import chat_script  # noqa: E402
import tiny  # noqa: E402


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "text": tiny.build_target(root / "target-text", "text"),
        "google": tiny.build_target(root / "target-google", "google", tokenizer=False),
        "assistant": tiny.build_assistant(root / "assistant", ordered=True),
        "assistant_plain": tiny.build_assistant(root / "assistant-plain", ordered=False),
    }


@pytest.fixture(scope="session")
def no_template(checkpoints, tmp_path_factory):
    """The tiny text target with a tokenizer that has no chat template, as a base model or a
    hand-made conversion has (the weights are the text target's)."""
    folder = tmp_path_factory.mktemp("no-template") / "target"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoints["text"] / name, folder / name)
    tiny.save_tokenizer(folder, chat_template=False)
    return folder


@pytest.fixture(scope="session")
def engine(checkpoints):
    """The tiny target and MTP assistant, with no stop tokens: the random tiny model would end
    early, and most tests want long outputs. (test_chat keeps the stop tokens.)"""
    from mlx_spec import load
    from mlx_spec.engine import Engine

    loaded = load(str(checkpoints["text"]), str(checkpoints["assistant"]))
    return Engine(loaded.target, loaded.assistant, loaded.tokenizer, stop_tokens=[])


@pytest.fixture(scope="session")
def trained(checkpoints, tmp_path_factory):
    """A tiny target trained to speak Gemma 4's chat format (tool calls, a thought, turn ends),
    rendered with Google's template; see `chat_script`."""
    from mlx_spec import load

    tokenizer = load(str(checkpoints["text"]), drafter=None).tokenizer
    examples = [(chat_script.render(tokenizer, *prompt), chat_script.encode(tokenizer, answer))
                for prompt, answer in chat_script.EXAMPLES]
    return tiny.build_trained_target(tmp_path_factory.mktemp("trained") / "target", examples)


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """Tiny checkpoints of each Gemma 4 size (tiny.VARIANTS), each built on first use:
    family(variant) -> {"target": folder, "assistant": folder}."""
    root = tmp_path_factory.mktemp("family")
    built = {}

    def get(variant):
        if variant not in built:
            built[variant] = {
                "target": tiny.build_target(root / variant, variant=variant, tokenizer=False),
                "assistant": tiny.build_family_assistant(root / f"{variant}-assistant", variant),
            }
        return built[variant]

    return get

"""The flags `chat`, `generate` and `serve` share (mlx-lm's spellings), and the engine they load."""

from pathlib import Path

import click

from ..chat import ChatSession
from ..errors import SettingsError
from ..loading import AUTO, DEFAULT_TARGET
from ..memory import DEFAULT_CONTEXT
from ..models import FAMILIES
from ..models.quantize import QUANT_MODES
from ..options import Options


def _remember(ctx, param, value):
    ctx.meta[f"mlx_spec.{param.name}"] = value
    return value


# Read by load_engine (through the click context) rather than passed to every command.
load_options = [
    click.option("--context", type=click.IntRange(min=1), default=DEFAULT_CONTEXT, show_default=True, expose_value=False,
                 callback=_remember, help="Tokens of context the memory check counts K/V cache for (at most the model's own)."),
    click.option("--force", is_flag=True, expose_value=False, callback=_remember,
                 help="Load even where the memory check says the model does not fit."),
    click.option("--experts", type=click.Choice(["whole", "split"]), default="whole", show_default=True,
                 expose_value=False, callback=_remember,
                 help="Under mlx.launch, a mixture of experts (26b-a4b): each rank keeps every expert, or a share of them "
                      "(less memory, one more all-reduce per layer)."),
]


def model_options(f):
    options = [
        click.option("--model", default=DEFAULT_TARGET, show_default=True,
                     help=f"Target: {'|'.join(FAMILIES.size_names)} (4-bit MLX), hub id or folder."),
        click.option("--drafter", default=AUTO, show_default=True,
                     help="MTP drafter: auto (the target's own assistant), a size name, hub id or folder."),
        *load_options,
        click.option("--drafter-bits", type=click.Choice(["4", "8"]), default=None, help="Quantize the drafter to 4 or 8 bits."),
        click.option("--drafter-mode", type=click.Choice(QUANT_MODES), default=None,
                     help="Quantization mode for the drafter [default: affine; mxfp4, mxfp8 and nvfp4 set their own bits]."),
        click.option("--no-mtp", is_flag=True, help="Decode with the target alone (no drafter is loaded)."),
        click.option("--draft-tokens", type=int, default=None, help="Guesses per cycle [default: chosen each cycle]."),
        click.option("--no-lookup", is_flag=True, help="No prompt-lookup guesses (the MTP drafter's only)."),
        click.option("--temp", type=float, default=0.0, show_default=True, help="Temperature; 0 is greedy."),
        click.option("--top-k", type=int, default=0, show_default=True, help="Top-k; 0 turns it off."),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="Top-p; 1 turns it off."),
        click.option("--seed", type=int, default=None, help="Random seed."),
        click.option("--max-tokens", "-m", type=int, default=ChatSession.MAX_TOKENS, show_default=True,
                     help="Tokens per answer."),
        click.option("--thinking", is_flag=True, help="Let the model think before it answers (shown dimmed)."),
        click.option("--image-tokens", type=click.Choice(["70", "140", "280", "560", "1120"]), default=None,
                     help="Soft tokens per image [default: the checkpoint processor's, or 280]."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def constraint_options(f):
    """`generate`'s flags for an answer that must parse (constraints/spec.py)."""
    options = [
        click.option("--json-schema", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="Hold the answer to this JSON schema (a .json file), drafting still on."),
        click.option("--regex", default=None, help="Hold the answer to this regular expression."),
        click.option("--grammar", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                     help="Hold the answer to this Lark grammar (its rule `start`)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def constraint_settings(json_schema, regex, grammar) -> dict:
    """The constraint flags as Options' settings, the files read (a SettingsError names one that
    cannot be)."""
    settings = {"regex": regex}
    for name, path in (("json_schema", json_schema), ("grammar", grammar)):
        if path is not None:
            try:
                settings[name] = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise SettingsError(f"--{name.replace('_', '-')} {path}: cannot be read ({e})") from None
    return settings


def flag_options(temp, top_k, top_p, seed, draft_tokens, no_mtp, no_lookup, max_tokens, thinking, stop=(),
                 image_tokens=None) -> Options:
    """The command line's flags as Options, checked before any time is spent on loading."""
    return Options(max_tokens=max_tokens, temperature=temp, top_k=top_k, top_p=top_p, seed=seed,
                   mtp=False if no_mtp else None, draft_tokens=draft_tokens, lookup=not no_lookup,
                   thinking=thinking, stop=tuple(stop), image_tokens=int(image_tokens) if image_tokens else None)


def load_engine(model, drafter, drafter_bits, drafter_mode, no_mtp, load_settings=None, group=None, flags=None):
    """The engine, with --context and --force as the command line gave them (`load_settings`,
    read from the click context unless given: `serve` loads on another thread), split over
    `group` (decoding/lockstep.py: `launched_group`) if one is given, whose ranks must have been
    given the same `flags` (`command_flags`; read from the click context unless given)."""
    from ..loading import load

    bits = int(drafter_bits) if drafter_bits else None
    settings = load_settings if load_settings is not None else memory_settings()
    engine = load(model, None if no_mtp else drafter, bits, drafter_mode, group=group, **settings)
    if group is not None:
        engine.lockstep.agree("their flags", flags if flags is not None else command_flags())
    return engine


def command_flags() -> str:
    """The command's flags (its prompt too), but the checkpoints' folders, which may lie
    elsewhere on each host: what every rank of a group must be given alike."""
    params = {k: v for k, v in click.get_current_context().params.items() if k not in ("model", "drafter")}
    return repr(sorted({**params, **memory_settings()}.items()))


def memory_settings() -> dict:
    meta = click.get_current_context().meta
    return {"context": meta.get("mlx_spec.context", DEFAULT_CONTEXT), "force": meta.get("mlx_spec.force", False),
            "experts": meta.get("mlx_spec.experts", "whole")}

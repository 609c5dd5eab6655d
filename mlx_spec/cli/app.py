"""The `mlx-spec` command: `chat`, `generate`, `serve` and `bench`."""

import json
import logging
import os
import sys
from typing import List, Optional

import click

from ..decoding.lockstep import lost_peer
from ..errors import GroupError, LoadError, SettingsError
from .chat_loop import media_parts, run_chat
from .flags import command_flags, constraint_options, constraint_settings, flag_options, load_engine, memory_settings, model_options
from .group import UNSHARED, follow_quietly, group_faults, join_launched_group, shared_file
from .terminal import TokenPrinter, as_utf8, read_bytes_as_escapes, stats_line


class PipeClosed(Exception):
    """The reader of standard output left (`mlx-spec generate ... | head`)."""


class Commands(click.Group):
    def invoke(self, ctx):
        # Click turns a closed pipe into exit status 1, as if the command had failed; it did what
        # was asked until nobody read on. `main` ends such a run with 0.
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise PipeClosed() from None


@click.group(cls=Commands)
@click.version_option(package_name="mlx-spec")
def cli():
    """Exact speculative decoding for Gemma 4 with its MTP drafter, in MLX."""


@cli.command()
@model_options
@click.option("--system-prompt", default=None, help="System prompt for the conversation.")
@click.option("--show-probs", is_flag=True, help="Colour tokens by probability; underline kept guesses.")
def chat(model, drafter, drafter_bits, drafter_mode, no_mtp, draft_tokens, no_lookup, temp, top_k, top_p, seed, max_tokens,
         thinking, image_tokens, system_prompt, show_probs):
    """Chat with Gemma 4; the KV cache is kept across turns."""
    options = flag_options(temp, top_k, top_p, seed, draft_tokens, no_mtp, no_lookup, max_tokens, thinking,
                           image_tokens=image_tokens)
    engine = load_engine(model, drafter, drafter_bits, drafter_mode, no_mtp, group=join_launched_group())
    follow_quietly(engine)
    with group_faults(engine):
        run_chat(engine, engine.chat(system_prompt=system_prompt, options=options), show_probs)


@cli.command()
@model_options
@click.option("--prompt", "-p", default=None, help="The prompt; '-' or none reads standard input.")
@click.option("--system-prompt", default=None, help="System prompt.")
@click.option("--raw", is_flag=True, help="Send the prompt as plain text, without the chat template.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per token, then a stats line.")
@click.option("--stop", multiple=True, help="End the answer before this string (left out); may be given more than once.")
@click.option("--image", "images", multiple=True, metavar="PATH", help="An image before the prompt (repeatable).")
@click.option("--audio", "clips", multiple=True, metavar="PATH", help="A 16 kHz WAV clip before the prompt (repeatable).")
@constraint_options
def generate(model, drafter, drafter_bits, drafter_mode, no_mtp, draft_tokens, no_lookup, temp, top_k, top_p, seed, max_tokens,
             thinking, image_tokens, prompt, system_prompt, raw, as_json, stop, images, clips, json_schema, regex, grammar):
    """Answer one prompt."""
    options = flag_options(temp, top_k, top_p, seed, draft_tokens, no_mtp, no_lookup, max_tokens, thinking, stop,
                           image_tokens).but(**constraint_settings(json_schema, regex, grammar))
    if raw and (images or clips):
        raise SettingsError("--image and --audio need the chat template: leave out --raw")
    group = join_launched_group()
    if prompt is None or prompt == "-":
        if group is not None:  # mlx.launch forwards standard input to every rank, but never its end
            raise SettingsError("under mlx.launch, give the prompt with --prompt (standard input never ends there)")
        read_bytes_as_escapes()
        prompt = sys.stdin.read()
    prompt = as_utf8(prompt)
    engine = load_engine(model, drafter, drafter_bits, drafter_mode, no_mtp, group=group)
    prints = follow_quietly(engine)
    places = [f"--image {path}" for path in images] + [f"--audio {path}" for path in clips]
    if engine.lockstep.size > 1:  # rank 0 reads the files, and every rank takes its bytes
        images, clips = ([read_by_rank_0(engine, path) for path in paths] for paths in (images, clips))
    messages: List[dict] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    request = prompt if raw else messages + [{"role": "user", "content": media_parts(images, clips, places) + [
        {"type": "text", "text": prompt}]}]
    printer = TokenPrinter(False, sys.stdout.isatty())
    with group_faults(engine):
        generation = engine.stream(request, options)
        for report in generation:
            if as_json:
                click.echo(json.dumps(report.to_dict(), ensure_ascii=False))
            else:
                printer.print(report)
    result = generation.result
    if as_json:
        summary = {
            "stats": result.stats.to_dict(), "text": result.text, "thinking": result.thinking,
            "finish_reason": result.finish_reason, "tool_calls": result.tool_calls,
            "group": engine.lockstep.describe(),
        }
        click.echo(json.dumps(summary, ensure_ascii=False))
    else:
        printer.end()
        if prints:
            click.echo(stats_line(result.stats), err=True)


@cli.command()
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (other hosts only when asked).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port to listen on.")
@click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on every /v1 request.")
@click.option("--cache-gb", type=float, default=4.0, show_default=True,
              help="Memory for the prompt cache of recent conversations (least recently used go first; 0 turns it off).")
@click.option("--max-batch", type=int, default=8, show_default=True,
              help="Requests decoded together at most (the rest wait in order); each drafts its own guesses. "
                   "1 answers one at a time.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="uvicorn's log level.")
@click.option("--served-model-name", "served_names", multiple=True, metavar="NAME",
              help="The model's name in the API (repeatable: the first is the id answers carry, the others aliases). "
                   "The path or hub id, its last part and the family's short name (e2b, ...) are accepted too.")
@click.option("--allow-files", is_flag=True, help="Let image and audio parts name local files of this machine.")
@click.option("--allow-fetch", is_flag=True, help="Fetch image and audio parts given as http(s) URLs.")
@click.option("--any-model", is_flag=True,
              help="Answer every model name a request gives with the served model (for agents that ask for names "
                   "of their own, such as Claude Code); without it, an unknown name is a 404.")
def serve(model, drafter, drafter_bits, drafter_mode, no_mtp, draft_tokens, no_lookup, temp, top_k, top_p, seed, max_tokens,
          thinking, image_tokens, host, port, api_key, cache_gb, max_batch, log_level, served_names, allow_files,
          allow_fetch, any_model):
    """Serve OpenAI's API (/v1/chat/completions, /v1/completions, /v1/responses), Anthropic's
    (/v1/messages) and the token page at /.

    The sampling flags, --max-tokens and --thinking are the defaults for requests that leave
    them out."""
    defaults = flag_options(temp, top_k, top_p, seed, draft_tokens, no_mtp, no_lookup, max_tokens, thinking,
                            image_tokens=image_tokens)
    if not 0 <= cache_gb < float("inf"):  # (NaN too: a traceback where a byte count was made of it)
        raise SettingsError(f"--cache-gb must be a number of GB >= 0, got {cache_gb}")
    if max_batch < 1:
        raise SettingsError(f"--max-batch must be at least 1, got {max_batch}")
    group = join_launched_group()
    settings, flags = memory_settings(), command_flags()  # here: the click context belongs to this thread
    load = lambda: load_engine(model, drafter, drafter_bits, drafter_mode, no_mtp, settings, group, flags)  # noqa: E731
    if group is not None and group.rank() != 0:  # rank 0 serves; this rank runs what its scheduler admits
        follow_group(load(), int(cache_gb * 1e9))
    from ..server import (
        serve as run_server,  # FastAPI and uvicorn only for this command
    )

    try:
        run_server(load, model, defaults, host=host, port=port, api_key=api_key, cache_gb=cache_gb,
                   max_batch=max_batch, log_level=log_level, served_names=served_names, allow_files=allow_files,
                   allow_fetch=allow_fetch, any_model=any_model)
    except (LoadError, SettingsError) as e:  # (after the model's thread began: end here, as below)
        click.echo(f"mlx-spec: {e}", err=True)
        end_process(1)
    # Shut down cleanly: the answers are stopped and the model's thread has ended. End the
    # process here rather than in the interpreter's teardown, where destroying MLX's streams of
    # that thread can abort the process (seen: "terminate called without an active exception").
    end_process()


def read_by_rank_0(engine, path: str) -> bytes:
    data = shared_file(engine.lockstep, path)
    if data is None:
        raise SettingsError(f"{path}: {UNSHARED}")
    return data


def follow_group(engine, cache_bytes: int) -> None:
    """`serve` on a rank other than 0: no server; the requests rank 0's scheduler admits, run
    beside it, until its server stops (or the group loses a rank: a GroupError)."""
    from ..server.agreement import follow

    follow_quietly(engine)
    with group_faults(engine):
        follow(engine, cache_bytes)
    end_process()


def end_process(status: int = 0) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.argument("table", required=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(table, args):
    """Measure the seed's tables on this machine: TABLE is positions, acceptance, draft-length,
    controlled, overhead, media, batch, group, or all (`--skip A,B` leaves tables out). `mlx-spec bench TABLE
    --help` lists its options."""
    from .. import bench as tables

    if table in (None, "-h", "--help"):
        click.echo(click.get_current_context().get_help())
    elif table == "all":
        tables.run_all(args)
    else:
        tables.run(table, args)


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point: problems become one line on standard error and a non-zero exit."""
    try:
        cli.main(args=argv, prog_name="mlx-spec", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.UsageError as e:
        click.echo(f"mlx-spec: {e.format_message()}", err=True)
        sys.exit(2)
    except (LoadError, SettingsError) as e:
        click.echo(f"mlx-spec: {e}", err=True)
        sys.exit(1)
    except GroupError as e:  # other ranks may be stuck in a collective: end at once, not at teardown
        click.echo(f"mlx-spec: {e}", err=True)
        sys.stderr.flush()
        os._exit(1)
    except RuntimeError as e:
        if not lost_peer(e):  # (a rank lost while the group joins or loads, before group_faults)
            raise
        click.echo(f"mlx-spec: the group lost a rank ({e}); this rank stops too", err=True)
        sys.stderr.flush()
        os._exit(1)
    except (BrokenPipeError, PipeClosed):  # (at once: a flush of the closed stdout at exit would fail again)
        os._exit(0)


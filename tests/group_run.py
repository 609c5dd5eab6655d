"""Run by the tests on every rank of a group (tests/test_distributed.py, under mlx.launch or
started by hand): load a target and drafter split over the group, generate each setting's
answer, print one JSON line of what this rank saw. `experts` in the settings: "whole" or
"split" (a mixture's experts divided between the ranks). `die_after=N`: rank 1
leaves the process after N tokens (a rank that dies mid-answer), rank 0 reports the error.
Several checkpoints in one group, one after another (a launch costs a good share of a test's
time here): a line each, in order.

    python group_run.py TARGET DRAFTER SETTINGS_JSON [TARGET DRAFTER SETTINGS_JSON ...]
"""

import json
import os
import sys

import mlx_spec
from mlx_spec.cli.group import group_faults
from mlx_spec.decoding.lockstep import launched_group
from mlx_spec.errors import GroupError
from mlx_spec.options import Options


def first_drafts(engine, prompt, g: int = 4) -> list:
    """The MTP drafter's first g guesses after the prompt, over a sequence's own caches (the
    drafts, not only the tokens, must be the one process's: a wrong split of the drafter changes
    no token, only its guesses)."""
    import mlx.core as mx

    from mlx_spec.drafting import DraftContext
    from mlx_spec.sampling.settings import SamplingSettings

    target, cache = engine.target, engine.target.make_cache(0)
    hidden = target.prefill(mx.array([prompt[:-1]]), cache, 64)
    context = DraftContext(tokens=list(prompt), last_token=mx.array([[prompt[-1]]], mx.int32), hidden=hidden,
                           kv=target.drafter_buffers(cache), settings=SamplingSettings(), uniforms=mx.zeros((g, 2)))
    return engine.mtp_drafter.draft(context, g).tokens.tolist()


def held_bytes(engine) -> int:
    """Bytes of the weights this process holds: the target's and a drafter's of its own."""
    from mlx.utils import tree_flatten

    parts = [engine.target.model.parameters()]
    if engine.pair.assistant is not None:
        parts.append(engine.pair.assistant.parameters())
    return sum(v.nbytes for part in parts for _, v in tree_flatten(part))


def main(target: str, drafter: str, settings: dict, group) -> None:
    engine = mlx_spec.load(target, drafter, group=group, experts=settings.get("experts", "whole")).with_stop_tokens([])
    prompt, runs = settings["prompt"], settings["runs"]
    out = {"rank": group.rank(), "size": group.size(), "group": engine.lockstep.describe(),
           "q_rows": next(l for l in engine.target.text_model.layers if hasattr(l, "self_attn")).self_attn.q_proj.weight.shape[0]}
    out["weight_bytes"] = held_bytes(engine)
    layer = engine.target.text_model.layers[0]
    if getattr(layer, "enable_moe", False):
        out["experts_held"] = layer.experts.switch_glu.gate_proj.weight.shape[0]
    if settings.get("drafts"):
        out["drafts"] = first_drafts(engine, prompt)
    die_after = settings.get("die_after")
    for name, options in runs.items():
        try:
            with group_faults(engine):
                tokens = []
                for report in engine.stream(prompt, Options(**options)):
                    tokens.append(report.token)
                    if die_after is not None and group.rank() == 1 and len(tokens) == die_after:
                        os._exit(9)
                out[name] = tokens
        except GroupError as e:
            out[name] = {"error": str(e)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    joined = launched_group()  # as the commands join it
    jobs = sys.argv[1:]
    for first in range(0, len(jobs), 3):
        main(jobs[first], jobs[first + 1], json.loads(jobs[first + 2]), joined)

"""What rolling a Gated DeltaNet layer back costs, two ways: replaying what a row kept of its last
pass (ours, models/qwen3_5/recurrent.py: the pass keeps its inputs, and the next one first runs
the recurrence again over the positions kept), or keeping the state after every position and
taking the row's own (vLLM's and mlx-vlm's way). Per pass of one layer, by rows and positions:
each way's device time (its run over the positions and its rollback, every position kept: the
replay's worst case) and the memory it keeps per row. The layer is one of a Qwen size's, with
random weights: `--model` a Qwen folder's, else `--shape qwen...`, else Qwen3.6-27B's.

    mlx-spec bench rollback                          # Qwen3.6-27B's layer, nothing downloaded
    mlx-spec bench rollback --shape qwen3.6-35b-a3b

On the CPU both run mlx-lm's recurrence one position at a time; on a Mac its Metal kernel writes
the final state only, so keeping every position's would need a kernel of our own.
"""

import copy
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.gated_delta import _gated_delta_step_ops, compute_g, gated_delta_update

from ..errors import SettingsError
from ..models.qwen3_5.recurrent import Stash, convolve, empty_state, replay
from ..models.qwen3_5.shapes import SHAPES
from .checks import whole_numbers
from .common import TableSkipped, arguments, header, machine, markdown, median_ms, parse, write_json

DEFAULT_SHAPE = "qwen3.6-27b"


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench rollback")
    parser.add_argument("--rows", type=whole_numbers(1, 64), default="1,4,8", help="rows of a pass, comma separated [1,4,8]")
    parser.add_argument("--positions", type=whole_numbers(1, 16), default="2,4,8",
                        help="positions of a pass (g + 1), comma separated [2,4,8]")
    args = parse(parser, argv, quick=dict(rows="1,4", positions="2,4"))
    name, text = layer_config(args)
    layer = gated_deltanet(text)
    info = machine()
    # (like for like on the CPU only: on a Mac the replay runs mlx-lm's kernel, the other way ops)
    paths = ("mlx-lm's Metal kernel (replay) against its ops, one position at a time (per position)"
             if mx.metal.is_available() else "mlx-lm's ops, one position at a time (both)")
    results = {"machine": info, "layer": name, "recurrence": paths, "by_rows_positions": []}
    print(header("Rolling back a Gated DeltaNet layer", info, {"layer": name, "recurrence": paths, "repeats": args.repeats}))
    rows = []
    for batch in args.rows:
        for positions in args.positions:
            entry = measure(layer, batch, positions, args.repeats)
            results["by_rows_positions"].append(entry)
            rows.append([batch, positions, f"{entry['replay_ms']:.2f}", f"{entry['per_position_ms']:.2f}",
                         f"{entry['per_position_ms'] / entry['replay_ms']:.2f}",
                         f"{entry['replay_bytes'] / 2**20:.2f}", f"{entry['per_position_bytes'] / 2**20:.2f}"])
    print(markdown(["rows", "positions", "replay ms", "per-position ms", "per-position / replay",
                    "replay MB per row", "per-position MB per row"], rows))
    print("\nA pass's time: its recurrence over its positions (from their projected inputs, the same either way) "
          "and the rollback of all of them. Memory: what a row keeps for it, per layer (replay: the state as "
          "the pass began and its inputs; per position: a state each). On a Mac, ours runs mlx-lm's Metal kernel "
          "and the per-position way its ops: that column is what a kernel of our own would have to beat.\n")
    print(f"JSON: {write_json('rollback', args, results)}")


def layer_config(args) -> tuple:
    """(the layer's name, its text config): --model's (a Qwen folder, or a size with a shape),
    --shape's, or the default. A model that is not a Qwen folder here skips the table (`bench
    all` runs it beside every model); a folder that is not there, or whose config.json is not
    JSON, is a SettingsError naming it."""
    if args.model and args.model not in SHAPES:
        folder = Path(args.model).expanduser()
        if not folder.is_dir():
            if folder.is_absolute() or args.model.startswith((".", "~")):
                raise SettingsError(f"rollback: --model {args.model}: no such folder")
            raise TableSkipped(f"rollback: {args.model} is not a Qwen3.5 folder here (the table measures a Gated "
                               "DeltaNet layer: give a Qwen folder, or --shape qwen3.6-27b)")
        config = _config(folder / "config.json")
        text = config.get("text_config", config)
        if not isinstance(text, dict) or not str(text.get("model_type", "")).startswith("qwen3_5"):
            raise TableSkipped(f"rollback: {args.model} is not a Qwen3.5 model: it has no Gated DeltaNet layers")
        return args.model, text
    name = args.model or (args.shape if args.shape in SHAPES else DEFAULT_SHAPE)
    return name, copy.deepcopy(SHAPES[name])


def _config(file: Path) -> dict:
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise SettingsError(f"rollback: {file}: not a readable config.json ({e})") from None
    if not isinstance(config, dict):
        raise SettingsError(f"rollback: {file}: a config.json holds an object, not {type(config).__name__}")
    return config


def gated_deltanet(text: dict):
    """One Gated DeltaNet layer of mlx-lm's, of this config, with random bfloat16 weights."""
    from mlx_lm.models import qwen3_5

    layer = qwen3_5.GatedDeltaNet(qwen3_5.TextModelArgs.from_dict(text))
    layer.set_dtype(mx.bfloat16)
    mx.eval(layer.parameters())
    return layer


def measure(layer, batch: int, positions: int, repeats: int) -> dict:
    """Both ways at `batch` rows of `positions`, timed in turn. Both start from the pass's
    projected inputs: the projections before and after are the same either way."""
    window, state = empty_state(layer, batch, mx.bfloat16)
    state = mx.random.normal(state.shape) * 0.1
    qkv, a, b = ((mx.random.normal((batch, positions, n)) * 0.1).astype(mx.bfloat16)
                 for n in (layer.conv_dim, layer.num_v_heads, layer.num_v_heads))
    kept = mx.full((batch,), positions, mx.int32)
    keep = layer.conv_kernel_size - 1
    mx.eval(window, state, qkv, a, b)

    def ours():  # the pass runs, keeping only its inputs; the next one replays them
        q, k, v, _ = convolve(layer, window, qkv)
        y, _ = gated_delta_update(q, k, v, a, b, layer.A_log, layer.dt_bias, state, mx.ones((batch, positions), mx.bool_))
        mx.eval(y, replay(layer, window, state, Stash(qkv, a, b), kept))

    def per_position():  # the pass keeps the state after every position; the next one takes its row's
        y, states, conv_input = run_keeping_states(layer, qkv, a, b, window, state)
        chosen = mx.take_along_axis(states, (kept - 1).reshape(-1, 1, 1, 1, 1), axis=1)
        mx.eval(y, chosen, mx.take_along_axis(conv_input, (kept[:, None] + mx.arange(keep)[None])[..., None], axis=1))

    timed = {"replay_ms": [], "per_position_ms": []}
    for _ in range(3):  # interleaved: the machine's drift falls on both
        timed["replay_ms"].append(median_ms(ours, repeats))
        timed["per_position_ms"].append(median_ms(per_position, repeats))
    one_state, one_window = state[:1].nbytes, window[:1].nbytes  # (each way keeps a window too)
    stash = positions * (layer.conv_dim + 2 * layer.num_v_heads) * 2
    return {"rows": batch, "positions": positions, **{k: sorted(v)[1] for k, v in timed.items()},
            "replay_bytes": one_state + one_window + stash, "per_position_bytes": positions * one_state + one_window}


def run_keeping_states(layer, qkv: mx.array, a: mx.array, b: mx.array, window: mx.array, state: mx.array):
    """The recurrence over a pass's inputs as mlx-lm's ops run it, keeping the state after every
    position: (its output, the states [B, L, Hv, Dv, Dk], the convolution's input)."""
    q, k, v, conv_input = convolve(layer, window, qkv)
    repeat = layer.num_v_heads // layer.num_k_heads
    q, k = (mx.repeat(t, repeat, -2) if repeat > 1 else t for t in (q, k))
    beta, g = mx.sigmoid(b), compute_g(layer.A_log, a, layer.dt_bias)
    ys, states = [], []
    for t in range(qkv.shape[1]):
        y, state = _gated_delta_step_ops(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state, None)
        ys.append(y)
        states.append(state)
    return mx.stack(ys, axis=1), mx.stack(states, axis=1), conv_input

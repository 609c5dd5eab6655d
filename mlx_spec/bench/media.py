"""An image in the prompt: a bar chart the script draws itself, with a question about it. Time to
first token (the image's encoder and the prefill included), the encoder's time alone, and decode
speed after the media prefill with MTP off, with MTP (6 guesses) and with mlx-spec's default,
greedy and with Gemma's sampling; mlx-lm on the question alone (text only: it has no image path)
as the anchor.

    mlx-spec bench media                 # E2B (its vision tower) with its assistant
    mlx-spec bench media --model 12b     # the 12B's encoder-free embedder
"""

import mlx.core as mx
import numpy as np

from ..errors import SettingsError
from ..media.images import SOFT_TOKEN_BUDGETS
from .checks import at_least
from .common import arguments, header, machine, markdown, median_ms, parse, write_json
from .models import build_engine, describe_models
from .prefills import Prefills
from .runs import SAMPLING, TEMPLATE, run_mlx_lm, run_ours

QUESTION = "Which month had the highest sales in this chart, and how much higher was it than the lowest month?"
MONTHS, SALES = ["Jan", "Feb", "Mar", "Apr", "May", "Jun"], [42, 57, 38, 71, 64, 49]


def chart(width: int = 640, height: int = 400) -> np.ndarray:
    """A labelled bar chart as an RGB array (drawn with Pillow, no font file needed)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((20, 10), "Monthly sales (units)", fill="black")
    base, top, step = height - 40, 50, (width - 80) // len(MONTHS)
    draw.line([(50, top), (50, base), (width - 20, base)], fill="black", width=2)
    for i, (month, value) in enumerate(zip(MONTHS, SALES)):
        x = 60 + i * step
        y = base - (base - top) * value / max(SALES)
        draw.rectangle([x, y, x + step - 20, base], fill=(70, 110, 200))
        draw.text((x + 4, y - 14), str(value), fill="black")
        draw.text((x + 4, base + 8), month, fill="black")
    return np.asarray(image)


def main(argv=None):
    parser = arguments(__doc__.splitlines()[0], prog="mlx-spec bench media")
    parser.add_argument("--image-tokens", type=int, choices=SOFT_TOKEN_BUDGETS, default=280, help="soft tokens for the image [280]")
    parser.add_argument("--max-tokens", type=at_least(1), default=128, help="tokens per answer")
    args = parse(parser, argv, quick=dict(max_tokens=24, image_tokens=70))
    engine = build_engine(args)
    info = machine()
    settings_shown = {**describe_models(args), **TEMPLATE, "image tokens": args.image_tokens}
    results = {"machine": info, "models": describe_models(args), **TEMPLATE, "image_tokens": args.image_tokens,
               "runs": []}
    print(header("An image in the prompt", info, settings_shown))
    messages = [{"role": "user", "content": [{"type": "image", "image": chart()}, {"type": "text", "text": QUESTION}]}]
    try:
        tokens, spans = engine.prepare(messages, thinking=False, image_tokens=args.image_tokens)
    except SettingsError as e:  # random weights (no tokenizer), a text-only checkpoint
        print(f"Skipped: this model takes no image ({e}).\n")
        results["skipped"] = str(e)
        print(f"JSON: {write_json('media', args, results)}")
        return
    text_only = engine.encode([{"role": "user", "content": QUESTION}], thinking=False)
    encoder = engine.media.encoder()
    encoder_ms = median_ms(lambda: mx.eval(encoder.embed(spans[0].item)), args.repeats)
    rows, prefills = [], Prefills(engine)  # the first token's time alone counts the prefill
    for sampling in ("greedy", "gemma"):
        settings = SAMPLING[sampling]
        first = _first_token_ms(engine, tokens, spans, settings, args.repeats)
        off = run_ours(engine, tokens, settings, args.max_tokens, mtp=False, spans=spans, prefills=prefills)
        on = run_ours(engine, tokens, settings, args.max_tokens, draft_tokens=6, lookup=False, spans=spans,
                      prefills=prefills)
        default = run_ours(engine, tokens, settings, args.max_tokens, spans=spans, prefills=prefills)
        anchor = run_mlx_lm(engine, text_only, settings, args.max_tokens)
        same = "yes" if on["tokens"] == off["tokens"] == default["tokens"] else "NO"
        speedup = on["tps"] / off["tps"] if off["tps"] else 0.0
        kept = f"{on['kept']}/{on['drafted']}"
        rows.append([sampling, len(tokens), spans[0].item.tokens, f"{first:.0f}", f"{encoder_ms:.0f}",
                     f"{off['tps']:.1f}", f"{on['tps']:.1f}", kept, f"{speedup:.2f}x", f"{default['tps']:.1f}", same,
                     f"{anchor['tps']:.1f}"])
        strip = lambda r: {k: v for k, v in r.items() if k != "tokens"}  # noqa: E731
        results["runs"].append({"sampling": sampling, "prompt_tokens": len(tokens), "image_tokens": spans[0].item.tokens,
                                "first_token_ms": first, "encoder_ms": encoder_ms, "mtp_off": strip(off),
                                "mtp_on": strip(on), "default": strip(default), "speedup": speedup,
                                "same_tokens": same, "mlx_lm_text_only": strip(anchor)})
    print(markdown(["sampling", "prompt", "image tokens", "first token ms", "encoder ms", "MTP off tok/s",
                    "MTP (g=6) tok/s", "guesses kept", "speed-up", "default tok/s", "MTP on = off",
                    "mlx-lm, question alone, tok/s"], rows))
    print(f"\nJSON: {write_json('media', args, results)}")


def _first_token_ms(engine, tokens, spans, settings, repeats) -> float:
    """From nothing to the first token: the encoder, the prefill and one step (MTP off)."""
    return median_ms(lambda: run_ours(engine, tokens, settings, 1, mtp=False, spans=spans), repeats)

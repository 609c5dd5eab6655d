"""A cost model for a target split over Macs (models/gemma4/tensor_parallel.py), as overhead.py
models the host: tok/s predicted from what a cycle reads and sends.

A cycle with g guesses runs g drafter steps and one target pass over g + 1 positions. On a Mac a
pass of a few positions is bound by reading the weights (design.md, section 5: R close to 1), so
on each of N ranks a pass costs its share of the weights over the memory bandwidth, plus its
all-reduces: two per layer (attention and MLP), each a ring of 2 (N - 1) transfers of a 1/N
slice of the hidden states, each paying the link's latency. The drafter stays whole on every
rank, its attention split where the target's K/V heads are (one all-reduce per drafter layer
then), and every cycle adds one small all-reduce of the loop's own (decoding/lockstep.py). A
cycle settles E(g) = 1 + a + ... + a^g tokens at acceptance a.

The link: Thunderbolt 5, 80 Gb/s each way (Intel's Thunderbolt 5 specification). Its latency
with RDMA (JACCL, macOS 26.2+): Apple's TN3205 describes RDMA over Thunderbolt as
low-latency without a figure; a third-party summary of it gives "under 50 us" against about 300
us over TCP. The table shows 10 us and 50 us, so that the reader sees what the latency costs.
"""

from typing import Dict, List, Tuple

from ..models.gemma4.facts import kv_heads
from ..models.gemma4.sizes import SIZES
from ..models.gemma4.tensor_parallel import rank_share
from .runs import expected_tokens

LINK_GBPS = 80  # Thunderbolt 5, each way
LATENCIES_US = (10, 50)
ACCEPTANCES = (0.5, 0.7)
MAX_G = 8
# The 31B in bf16: 62.5 GB of target files; its assistant ~0.92 GB (460M parameters from its
# published config: the 262,144 x 1,024 head read at each step, 4 layers, the projections).
TARGET_BYTES = 62.5e9
DRAFTER_BYTES = 0.92e9
DRAFTER_LAYERS = 4
# Apple's figures for the M5 family (common.py, design.md section 5), GB/s.
MACS = {"M5 Pro (307 GB/s)": 307, "M5 Max (614 GB/s)": 614}


def cycle_seconds(g: int, ranks: int, bandwidth_gbs: float, latency_us: float, config: dict) -> float:
    """One cycle's time on each rank: the weights read, the drafter's steps, the all-reduces."""
    weights, _ = rank_share(config, ranks)
    read = (TARGET_BYTES * weights + g * DRAFTER_BYTES) / (bandwidth_gbs * 1e9)
    if ranks == 1:
        return read
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    drafter_split = any(n > 1 for n in kv_heads(config).values())
    payload = hidden * (g + 1) * 2  # bf16 hidden states of the pass's positions
    ring = 2 * (ranks - 1)  # transfers of one all-reduce on a ring

    def all_reduce(bytes_):
        return ring * (latency_us * 1e-6 + bytes_ / ranks / (LINK_GBPS / 8 * 1e9))

    send = 2 * layers * all_reduce(payload) + all_reduce(4)  # the pass, and the loop's own
    if drafter_split:
        send += g * DRAFTER_LAYERS * all_reduce(hidden * 2)
    return read + send


def best(ranks: int, bandwidth: float, latency: float, a: float, config: dict) -> Tuple[int, float]:
    """(g, tok/s) of the fastest draft length at acceptance a (g = 0: MTP off)."""
    rates = [(g, expected_tokens(a, g) / cycle_seconds(g, ranks, bandwidth, latency, config)) for g in range(MAX_G + 1)]
    return max(rates, key=lambda r: r[1])


def table() -> Tuple[List[str], List[List[str]], List[Dict]]:
    """(headers, rows, JSON rows) for the 31B in bf16 on 1, 2 and 4 Macs."""
    config = SIZES["31b"].text
    headers = ["Macs", "chip", "link latency", "GB per rank", "MTP off tok/s"] + [
        f"MTP at a = {a} tok/s (g)" for a in ACCEPTANCES] + [f"MTP / off at a = {ACCEPTANCES[-1]}"]
    rows, records = [], []
    for chip, bandwidth in MACS.items():
        for ranks in (1, 2, 4):
            for latency in (LATENCIES_US if ranks > 1 else (0,)):
                off = expected_tokens(0, 0) / cycle_seconds(0, ranks, bandwidth, latency, config)
                drafted = [best(ranks, bandwidth, latency, a, config) for a in ACCEPTANCES]
                per_rank = TARGET_BYTES * rank_share(config, ranks)[0] / 1e9
                rows.append([str(ranks), chip, f"{latency} us" if ranks > 1 else "-", f"{per_rank:.1f}", f"{off:.1f}"] +
                            [f"{tps:.1f} ({g})" for g, tps in drafted] + [f"{drafted[-1][1] / off:.2f}x"])
                records.append({"ranks": ranks, "chip": chip, "bandwidth_gbs": bandwidth, "latency_us": latency,
                                "gb_per_rank": per_rank, "mtp_off_tps": off,
                                "mtp": [{"acceptance": a, "g": g, "tps": tps} for a, (g, tps) in zip(ACCEPTANCES, drafted)]})
    return headers, rows, records

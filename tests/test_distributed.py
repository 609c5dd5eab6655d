"""The target split over a group of processes: 2 ranks of MLX's ring backend on localhost,
started by the real `mlx.launch` (or by hand, where a test needs a rank to die without the
launcher ending the others), against one process's answers token for token.

The tiny checkpoints: E2B's structure (one K/V head: every rank keeps it, the drafter stays
whole) and E4B's (two K/V heads: split, and the drafter's attention split with them).
"""

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from serving import ENV

import tiny
import tiny_qwen
from group_run import first_drafts, held_bytes
from mlx_spec import LoadError, load
from mlx_spec.models.qwen3_5.tensor_parallel import rank_share
from mlx_spec.options import Options

HERE = Path(__file__).parent
RUNS = {  # past the tiny window (12) in every run: a 30-token prompt, and answers of twice the window
    "g1": dict(max_tokens=24, draft_tokens=1, lookup=False),
    "g4": dict(max_tokens=24, draft_tokens=4, lookup=False),
    "g4_lookup": dict(max_tokens=24, draft_tokens=4),
    "adaptive": dict(max_tokens=24),
    "off": dict(max_tokens=24, mtp=False),
    "seeded": dict(max_tokens=24, temperature=1.0, top_p=0.9, seed=11, draft_tokens=3),
    "seeded_off": dict(max_tokens=24, temperature=1.0, top_p=0.9, seed=11, mtp=False),
}
# The split sizes beside E2B's: what their split changes (K/V heads, experts) meets every kind of
# target pass in these (1 position, 5, the adaptive length's mix, sampling); the draft lengths
# and prompt lookup, which the split does not touch, are E2B's to cover (a launch costs minutes here).
SPLIT_RUNS = {name: RUNS[name] for name in ("g4", "adaptive", "off", "seeded")}
# One thread of math per rank: two ranks share this machine's cores.
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

pytestmark = pytest.mark.skipif(shutil.which("mlx.launch") is None, reason="mlx.launch (installed with mlx) is missing")


def free_ports(n: int) -> int:
    """The first of n consecutive ports free on 127.0.0.1 (mlx.launch numbers them from it)."""
    for _ in range(50):
        start = int(np.random.default_rng().integers(20000, 60000))
        sockets = []
        try:
            for port in range(start, start + n):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                sockets.append(s)
            return start
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free ports")


def launcher(ranks: int = 2, env=None) -> list:
    """`mlx.launch --backend ring -n RANKS` on localhost, each rank with one math thread (and `env`)."""
    argv = [shutil.which("mlx.launch"), "--backend", "ring", "-n", str(ranks), "--starting-port", str(free_ports(ranks))]
    for name, value in {**THREADS, **(env or {})}.items():
        argv += ["--env", f"{name}={value}"]
    return argv


def launch(command, ranks: int = 2, timeout: float = 240, env=None) -> subprocess.CompletedProcess:
    """`mlx.launch --backend ring -n RANKS COMMAND` on localhost."""
    return subprocess.run(launcher(ranks, env) + command, capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **THREADS, **(env or {})})


def by_hand(command, ranks: int = 2, started=None, timeout: float = 120, env=None, extra=None, cwds=None):
    """The ranks started without mlx.launch (which would end the others when one dies): each
    with the environment mlx.launch gives it. `started`: the ranks to start (the others are
    never started); `extra`: arguments added to a rank's command, by rank; `cwds`: a rank's
    working folder, by rank. Returns each started
    rank's CompletedProcess-like (returncode, stdout, stderr)."""
    first = free_ports(ranks)
    hosts = json.dumps([[f"127.0.0.1:{first + r}"] for r in range(ranks)])
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    hostfile = folder / f"mlx-spec-hosts-{first}.json"
    hostfile.write_text(hosts)
    procs, results = {}, {}
    try:
        for rank in (started if started is not None else range(ranks)):
            procs[rank] = subprocess.Popen(command + (extra or {}).get(rank, []), cwd=(cwds or {}).get(rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           env={**ENV, **THREADS, **(env or {}), "MLX_HOSTFILE": str(hostfile),
                                                "MLX_RANK": str(rank)})
        deadline = time.monotonic() + timeout
        for rank, proc in procs.items():
            out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
            results[rank] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:  # a rank that timed out is killed, and the host file goes either way
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        hostfile.unlink(missing_ok=True)
    return results


def ranks_lines(stdout: str):
    return sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")), key=lambda d: d["rank"])


def alone(target, drafter, prompt, runs):
    engine = load(str(target), str(drafter)).with_stop_tokens([])
    return {name: engine.generate(prompt, Options(**options)).tokens for name, options in runs.items()}


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(5).integers(5, 300, 30).tolist()


SIZES = [("e2b", "whole"), ("e4b", "whole"), ("26b-a4b", "split")]


def test_two_ranks_give_one_process_s_tokens(checkpoints, family, prompt):
    """Greedy with several draft lengths, prompt lookup on and off, the adaptive length, MTP
    off and seeded sampling (the split sizes: SPLIT_RUNS): each rank's answer is the one
    process's, token for token, and the query heads are split (each rank holds half of
    q_proj's rows). E2B's one K/V head is kept by
    both ranks, E4B's two split (and the drafter's attention with them); the 26B-A4B's keys equal
    their values on full layers, and its experts are divided between the ranks. The three sizes
    load one after another in one group (one launch)."""
    jobs = []
    for variant, experts in SIZES:
        if variant == "e2b":
            target, drafter = checkpoints["text"], checkpoints["assistant"]
        else:
            target, drafter = family(variant)["target"], family(variant)["assistant"]
        runs = RUNS if variant == "e2b" else SPLIT_RUNS
        jobs.append((variant, experts, target, drafter, runs))
    arguments = [str(a) for _, experts, target, drafter, runs in jobs
                 for a in (target, drafter, json.dumps({"prompt": prompt, "runs": runs, "experts": experts}))]
    done = launch([sys.executable, str(HERE / "group_run.py"), *arguments], timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2 * len(jobs), done.stdout[-2000:]
    for (variant, experts, target, drafter, runs), ranks in zip(jobs, by_job(lines, len(jobs))):
        assert [r["rank"] for r in ranks] == [0, 1] and all(r["group"] == {"size": 2, "rank": r["rank"]} for r in ranks)
        whole = load(str(target), str(drafter)).target.text_model.layers[0].self_attn.q_proj.weight.shape[0]
        assert all(2 * r["q_rows"] == whole for r in ranks), variant
        if experts == "split":
            assert all(2 * r["experts_held"] == tiny.VARIANTS[variant]["num_experts"] for r in ranks)
        expected = alone(target, drafter, prompt, runs)
        for name in runs:
            for r in ranks:
                assert r[name] == expected[name], (variant, name, r["rank"])
        # MTP on gives MTP off's tokens, greedy and seeded (one uniform per output index)
        assert expected["g4"] == expected["off"] == expected["adaptive"], variant
        if "seeded_off" in runs:
            assert expected["seeded"] == expected["seeded_off"]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """Tiny Qwen3.5 checkpoints, dense and MoE, each its own drafter (its MTP layer)."""
    root = tmp_path_factory.mktemp("qwen-group")
    return {"dense": tiny_qwen.build(root / "dense"), "moe": tiny_qwen.build(root / "moe", moe=True)}


def test_two_ranks_give_one_process_s_qwen_tokens_and_drafts(qwen, prompt):
    """Qwen3.5 split over two ranks (mlx-lm's shard() for the target, the same code for its MTP
    layer), dense and MoE: greedy at a fixed length and the adaptive one, MTP off, and seeded
    sampling at temperature 1, each rank's answer is the one process's, and so are the MTP
    layer's guesses; each rank holds half the query heads, and rolls its own heads' Gated
    DeltaNet state back. With a top-p cut, the group's logits (summed in another order than one
    process's matmul) may put a token on the other side of the cut: there MTP on must give the
    group's own MTP off answer, on both ranks."""
    runs = {name: RUNS[name] for name in ("g4", "adaptive", "off", "seeded", "seeded_off")}
    runs["sampled"] = dict(max_tokens=24, temperature=1.0, seed=11, draft_tokens=3)
    settings = json.dumps({"prompt": prompt, "runs": runs, "drafts": True})
    arguments = [str(a) for folder in qwen.values() for a in (folder, folder, settings)]
    done = launch([sys.executable, str(HERE / "group_run.py"), *arguments], timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for (kind, folder), ranks in zip(qwen.items(), by_job(lines, len(qwen))):
        engine = load(str(folder)).with_stop_tokens([])
        whole = next(l for l in engine.target.text_model.layers if hasattr(l, "self_attn")).self_attn.q_proj
        expected = {name: engine.generate(prompt, Options(**options)).tokens for name, options in runs.items()}
        drafts = first_drafts(engine, prompt)
        # the memory check's share of the weights is what a rank holds (to the norms and biases it leaves out)
        share = rank_share(json.loads((folder / "config.json").read_text()), 2)[0]
        for r in ranks:
            assert r["weight_bytes"] == pytest.approx(share * held_bytes(engine), rel=0.02), kind
            assert 2 * r["q_rows"] == whole.weight.shape[0], kind
            assert r["drafts"] == drafts, (kind, r["rank"])
            for name in ("g4", "adaptive", "off", "sampled"):
                assert r[name] == expected[name], (kind, name, r["rank"])
            assert r["seeded"] == r["seeded_off"] == ranks[0]["seeded"], (kind, r["rank"])
        assert expected["g4"] == expected["off"] == expected["adaptive"], kind
        assert expected["seeded"] == expected["seeded_off"], kind


def by_job(lines: list, jobs: int) -> list:
    """Each job's two lines (rank 0's, rank 1's), from both ranks' lines as printed: each rank
    prints its jobs in order, and the ranks' output comes interleaved."""
    per_rank = [[line for line in lines if line["rank"] == rank] for rank in (0, 1)]
    assert all(len(mine) == jobs for mine in per_rank)
    return [[per_rank[0][job], per_rank[1][job]] for job in range(jobs)]


def test_generate_under_mlx_launch_prints_once_and_reports_the_group(checkpoints):
    """`mlx.launch ... mlx-spec generate --json`: rank 0 alone prints, its answer is the one
    process's, and the final line names the group."""
    args = ["generate", "--model", str(checkpoints["text"]), "--drafter", str(checkpoints["assistant"]), "--raw",
            "--prompt", "the group speaks once", "-m", "24", "--json"]
    mlx_spec = [sys.executable, "-m", "mlx_spec.cli"]
    done = launch(mlx_spec + args)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    single = subprocess.run(mlx_spec + args, capture_output=True, text=True, timeout=120, env={**ENV, **THREADS})
    reference = [json.loads(line) for line in single.stdout.splitlines() if line.startswith("{")]
    assert [d["token"] for d in lines[:-1]] == [d["token"] for d in reference[:-1]]
    assert lines[-1]["group"] == {"size": 2, "rank": 0} and reference[-1]["group"] == {"size": 1, "rank": 0}
    assert lines[-1]["text"] == reference[-1]["text"]


def test_chat_under_mlx_launch_follows_rank_0_s_lines(checkpoints):
    """`mlx.launch ... mlx-spec chat` with lines on standard input (mlx.launch hands them to
    every rank; rank 0 alone reads them and sends them on): one answer per line, printed once,
    and the commands between them run on every rank in step (the stats count both turns)."""
    lines = "the first line\nthe second line\n/stats\n/quit\n"
    command = [sys.executable, "-m", "mlx_spec.cli", "chat", "--model", str(checkpoints["text"]), "--drafter",
               str(checkpoints["assistant"]), "-m", "8"]
    done = subprocess.run(launcher() + command, input=lines, capture_output=True, text=True, timeout=240,
                          env={**ENV, **THREADS})
    assert "exited with code" not in done.stderr, done.stderr[-2000:]
    assert done.stdout.count("[session: 2 turns") == 1, done.stdout[-2000:]


def test_a_group_that_cannot_split_the_model_is_refused_by_name(checkpoints):
    """Three ranks cannot split four query heads: every rank says so before reading a weight."""
    done = launch([sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(checkpoints["text"]), "--drafter",
                   str(checkpoints["assistant"]), "--prompt", "hi", "-m", "4"], ranks=3, timeout=120)
    # (mlx.launch itself exits 0 whatever its ranks did: their own exit codes are in its warnings)
    assert "exited with code 1" in done.stderr
    assert "a group of 3 cannot split its 4 query heads" in done.stderr, done.stderr[-2000:]


def test_a_rank_that_dies_ends_the_others_with_a_clear_error(checkpoints, prompt):
    """Rank 1 leaves after 5 tokens; rank 0, mid-answer, ends with an error naming the lost
    rank, within seconds (the ranks are started by hand: mlx.launch would end rank 0 itself)."""
    settings = {"prompt": prompt, "runs": {"g4": RUNS["g4"]}, "die_after": 5}
    began = time.monotonic()
    results = by_hand([sys.executable, str(HERE / "group_run.py"), str(checkpoints["text"]),
                       str(checkpoints["assistant"]), json.dumps(settings)])
    assert results[1].returncode == 9
    assert results[0].returncode == 0, results[0].stderr[-2000:]
    error = ranks_lines(results[0].stdout)[0]["g4"]["error"]
    assert "the group of 2 lost a rank" in error and "this rank (0) stops too" in error
    assert time.monotonic() - began < 60


def test_a_rank_that_cannot_reach_the_others_gives_up_in_bounded_time(checkpoints):
    """Rank 0 of two, with rank 1 never started: MLX would wait for ever; the command ends after
    MLX_SPEC_GROUP_TIMEOUT seconds and says why."""
    began = time.monotonic()
    results = by_hand([sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(checkpoints["text"]),
                       "--prompt", "hi", "-m", "4"], started=[0], env={"MLX_SPEC_GROUP_TIMEOUT": "3"}, timeout=60)
    assert results[0].returncode != 0
    assert "rank 0 could not reach the other ranks of its group within 3 s" in results[0].stderr
    assert time.monotonic() - began < 30


LATE = """import os, sys, time
import mlx.core as mx
from mlx_spec.decoding.lockstep import launched_group
if os.environ["MLX_RANK"] == "0":
    time.sleep(float(sys.argv[1]))
group = launched_group()
print(mx.distributed.all_sum(mx.array([group.rank() + 1.0]), group=group).item(), flush=True)
"""


def test_a_rank_started_after_mlx_s_own_connect_budget_still_joins():
    """Rank 0 starts 35 s after rank 1 (a loaded machine): MLX's ring gives up connecting after
    about 31 s ("Couldn't connect (error: 111)", as a CI run once saw); the rank tries again
    and the group forms, within MLX_SPEC_GROUP_TIMEOUT."""
    results = by_hand([sys.executable, "-c", LATE, "35"], env={"MLX_SPEC_GROUP_TIMEOUT": "90"}, timeout=120)
    for rank in (0, 1):
        assert results[rank].returncode == 0, results[rank].stderr[-2000:]
        assert results[rank].stdout.strip() == "3.0"


def test_joining_tries_again_with_a_pause_and_raises_other_failures(monkeypatch):
    """A neighbour that refuses (or does not answer) is tried again, a pause between tries, so
    that a backend failing at once does not spin; any other failure is the caller's."""
    from mlx_spec.decoding import lockstep

    outcomes = [RuntimeError("[ring] Couldn't connect (error: 111)"), RuntimeError("[ring] (error: 110)"), "joined"]
    pauses = []

    def init():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(lockstep.mx.distributed, "init", init)
    monkeypatch.setattr(lockstep.time, "sleep", pauses.append)
    assert lockstep.join() == "joined" and pauses == [lockstep.RETRY_PAUSE] * 2
    outcomes[:] = [RuntimeError("[ring] some other failure")]
    with pytest.raises(RuntimeError, match="some other failure"):
        lockstep.join()


def test_a_rank_that_cannot_load_its_share_stops_every_rank(checkpoints, tmp_path):
    """Rank 1's memory check refuses (its command asks for a context no machine holds, of a copy
    of the target whose config allows it: the check counts no more than the model's own): it
    says why, and rank 0 stops too, naming rank 1, instead of waiting for it at the first
    collective."""
    long = tmp_path / "long-context"
    long.mkdir()
    for item in checkpoints["text"].iterdir():
        (long / item.name).symlink_to(item)
    config = json.loads((checkpoints["text"] / "config.json").read_text())
    (long / "config.json").unlink()
    (long / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2_000_000_000}))
    results = by_hand([sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(checkpoints["text"]),
                       "--drafter", str(checkpoints["assistant"]), "--prompt", "hi", "-m", "4"],
                      extra={1: ["--model", str(long), "--context", "2000000000"]}, timeout=90)
    assert results[1].returncode == 1 and "needs about" in results[1].stderr, results[1].stderr[-2000:]
    assert results[0].returncode == 1, results[0].stderr[-2000:]
    assert "rank 1 of the group of 2 could not load its share" in results[0].stderr


def test_a_rank_whose_load_fails_otherwise_stops_every_rank_by_name(checkpoints):
    """Rank 1's load fails with an error of its own machine that is no LoadError (its disk is
    full): it says so, and rank 0 stops naming rank 1. Both were tracebacks (found by a review):
    rank 1's OSError, and rank 0's lost peer at the agreement on the load."""
    results = by_hand([sys.executable, str(HERE / "faulty_rank.py"), "1:load", "generate", "--model",
                       str(checkpoints["text"]), "--drafter", str(checkpoints["assistant"]), "--prompt", "hi", "-m", "4"],
                      timeout=90)
    for rank in (0, 1):
        assert results[rank].returncode == 1 and "Traceback" not in results[rank].stderr, results[rank].stderr[-2000:]
    assert "rank 1 of the group could not load its share: OSError: [Errno 28] No space left" in results[1].stderr
    assert "rank 1 of the group of 2 could not load its share" in results[0].stderr


def test_generate_with_media_under_a_group_reads_the_files_on_rank_0_alone(multimodal, tmp_path):
    """`generate --image --audio` over 2 ranks, each in its own folder, the files given by
    relative paths that only rank 0's folder holds: rank 0 reads them and every rank takes
    their bytes, and the answer is the single process's."""
    from test_media_prompt import clip, wav_bytes
    from test_server_media import png_bytes

    here, elsewhere = tmp_path / "rank0", tmp_path / "rank1"
    here.mkdir()
    elsewhere.mkdir()
    (here / "picture.png").write_bytes(png_bytes(seed=6))
    (here / "clip.wav").write_bytes(wav_bytes(clip(seed=3)))
    command = [sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(multimodal["text"]), "--drafter",
               str(multimodal["assistant"]), "--image", "picture.png", "--audio", "clip.wav", "--image-tokens", "70",
               "--prompt", "What is in this picture and this sound?", "-m", "16", "--json"]
    single = subprocess.run(command, cwd=here, capture_output=True, text=True, timeout=180, env={**ENV, **THREADS})
    assert single.returncode == 0, single.stderr[-2000:]
    results = by_hand(command, cwds={0: here, 1: elsewhere}, timeout=240)
    assert results[1].returncode == 0 and results[0].returncode == 0, (results[0].stderr[-2000:], results[1].stderr[-2000:])
    reference = [json.loads(line) for line in single.stdout.splitlines() if line.startswith("{")]
    lines = [json.loads(line) for line in results[0].stdout.splitlines() if line.startswith("{")]
    assert [d["token"] for d in lines[:-1]] == [d["token"] for d in reference[:-1]] and len(lines) > 4
    assert lines[-1]["group"] == {"size": 2, "rank": 0} and results[1].stdout == ""


class RankZeroOf:
    """What the load's checks see of a group of `n` (no collective runs before them)."""

    def __init__(self, n):
        self.n = n

    def size(self):
        return self.n

    def rank(self):
        return 0


def test_a_split_that_cannot_be_is_refused_before_any_download(checkpoints, monkeypatch):
    """A hub id three ranks cannot split: refused from the config the memory check read, before
    the weights are downloaded (each rank downloaded the whole checkpoint first: a review)."""
    from mlx_spec import loading, memory
    from mlx_spec.decoding.lockstep import Lockstep
    from mlx_spec.models import FAMILIES

    config = json.loads((checkpoints["text"] / "config.json").read_text())
    monkeypatch.setattr(memory, "_files_and_config", lambda name, registry: (10**6, config))
    monkeypatch.setattr(loading, "read", lambda *args: pytest.fail("the checkpoint was downloaded"))

    with pytest.raises(LoadError, match="someone/gemma-4-variant: a group of 3 cannot split its 4 query heads"):
        loading._load("someone/gemma-4-variant", None, None, None, 8192, False, False, FAMILIES, Lockstep(RankZeroOf(3)),
                      "whole")


def test_a_drafter_that_cannot_be_split_is_refused_before_any_weight_loads(checkpoints, monkeypatch):
    """E4B splits over 8 ranks, but its assistant's 4 query heads cannot read the K/V heads the
    ranks split: refused from the config.json files, before any download where the memory check
    read them, and before the target's weights load where only the checkpoints tell (it was
    refused after loading both)."""
    from mlx_spec import loading, memory
    from mlx_spec.decoding.lockstep import Lockstep
    from mlx_spec.models import FAMILIES, Checkpoint, Registry
    from mlx_spec.models.gemma4.sizes import SIZES

    target = {"model_type": "gemma4_text", **SIZES["e4b"].config}
    drafter = json.loads((checkpoints["assistant"] / "config.json").read_text())
    drafter["text_config"] = {**drafter["text_config"], "num_attention_heads": 4, "num_key_value_heads": 2}
    configs = {"someone/e4b": target, "someone/e4b-assistant": drafter}
    monkeypatch.setattr(memory, "_files_and_config", lambda name, registry: (10**6, configs[name]))
    monkeypatch.setattr(loading, "read", lambda *args: pytest.fail("the checkpoint was downloaded"))
    why = "drafter someone/e4b-assistant: its 4 query heads cannot be split over a group of 8"
    with pytest.raises(LoadError, match=why):
        loading._load("someone/e4b", "someone/e4b-assistant", None, None, 8192, False, False, FAMILIES,
                      Lockstep(RankZeroOf(8)), "whole")

    # Sizes unknown offline: the checkpoints are read, and the drafter refused before a weight loads.
    monkeypatch.setattr(memory, "_files_and_config", lambda name, registry: (None, None))
    monkeypatch.setattr(loading, "read", lambda name, role: Checkpoint(Path(name), configs[name], {}))
    gemma4 = dataclasses.replace(FAMILIES.families[0], load_target=lambda checkpoint: pytest.fail("the target loaded"))
    with pytest.raises(LoadError, match=why):
        loading._load("someone/e4b", "someone/e4b-assistant", None, None, 8192, False, False, Registry([gemma4]),
                      Lockstep(RankZeroOf(8)), "whole")
    # Four ranks divide the drafter's heads: past the checks, to the target's weights.
    with pytest.raises(pytest.fail.Exception, match="the target loaded"):
        loading._load("someone/e4b", "someone/e4b-assistant", None, None, 8192, False, False, Registry([gemma4]),
                      Lockstep(RankZeroOf(4)), "whole")


def test_splitting_experts_a_model_does_not_have_is_refused(checkpoints, monkeypatch):
    """`--experts split` was taken and did nothing on a dense target, or in one process (a
    review): each is refused by name, as is a value that is neither."""
    from mlx_spec import loading, memory
    from mlx_spec.decoding.lockstep import Lockstep
    from mlx_spec.models import FAMILIES

    with pytest.raises(LoadError, match="this process runs alone, with every expert"):
        load(str(checkpoints["text"]), str(checkpoints["assistant"]), experts="split")
    with pytest.raises(LoadError, match="experts must be \"whole\" or \"split\", got 'halves'"):
        load(str(checkpoints["text"]), str(checkpoints["assistant"]), experts="halves")
    config = json.loads((checkpoints["text"] / "config.json").read_text())
    monkeypatch.setattr(memory, "_files_and_config", lambda name, registry: (10**6, config))
    monkeypatch.setattr(loading, "read", lambda *args: pytest.fail("the checkpoint was downloaded"))

    with pytest.raises(LoadError, match="has no experts to split: .*for a mixture of experts, such as 26b-a4b"):
        loading._load("someone/dense", None, None, None, 8192, False, False, FAMILIES, Lockstep(RankZeroOf(2)), "split")


@pytest.mark.parametrize("extra", [["--draft-tokens", "4"], ["--prompt", "something else"]])
def test_ranks_given_other_flags_are_refused_not_left_waiting(checkpoints, extra):
    """Rank 1 given another draft length, or another prompt, than rank 0: the ranks ran other
    cycles and waited on each other's collectives for ever (found by a review). Every rank now
    ends at once, naming the fault. (The checkpoints' folders may differ: they lie elsewhere on
    each host.)"""
    results = by_hand([sys.executable, "-m", "mlx_spec.cli", "generate", "--model", str(checkpoints["text"]),
                       "--drafter", str(checkpoints["assistant"]), "--prompt", "hi", "-m", "4", "--draft-tokens", "2"],
                      extra={1: extra}, timeout=90)
    for rank in (0, 1):
        assert results[rank].returncode == 1, results[rank].stderr[-2000:]
        assert results[rank].stderr.startswith("mlx-spec: the ranks of the group were not started alike: their flags "
                                               "differ from"), results[rank].stderr[-2000:]
    assert "from those of rank 1" in results[1].stderr and "from rank 0's" in results[0].stderr


def test_a_host_file_that_does_not_parse_is_one_line():
    """Ranks started by hand read MLX_HOSTFILE themselves: a file that is not JSON was MLX's
    traceback, and a port taken read "the group lost a rank" (found by a review)."""
    hostfile = Path(os.environ.get("TMPDIR", "/tmp")) / f"mlx-spec-bad-hosts-{os.getpid()}.json"
    hostfile.write_text("not json")
    try:
        out = subprocess.run([sys.executable, "-c", "from mlx_spec.decoding.lockstep import launched_group\n"
                              "from mlx_spec.errors import GroupError\n"
                              "try:\n    launched_group()\nexcept GroupError as e:\n    print(e)"],
                             capture_output=True, text=True, timeout=60,
                             env={**ENV, "MLX_HOSTFILE": str(hostfile), "MLX_RANK": "0", "MLX_SPEC_GROUP_TIMEOUT": "20"})
    finally:
        hostfile.unlink()
    assert out.returncode == 0 and out.stdout.startswith("rank 0 could not join its group: "), out.stdout + out.stderr


def test_the_watch_ends_with_its_rank():
    """A rank ended while it waits for the others (mlx.launch ends one by SIGTERM, which runs no
    `finally`) left its watch behind, which later printed its message and signalled the rank's
    old process id (found by a review). The watch now ends with its rank."""
    ports = free_ports(2)
    hostfile = Path(os.environ.get("TMPDIR", "/tmp")) / f"mlx-spec-hosts-{ports}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{ports}"], [f"127.0.0.1:{ports + 1}"]]))
    try:
        rank = subprocess.Popen([sys.executable, "-c", "from mlx_spec.decoding.lockstep import launched_group\n"
                                 "launched_group()"], stderr=subprocess.PIPE, text=True,
                                env={**ENV, "MLX_HOSTFILE": str(hostfile), "MLX_RANK": "0", "MLX_SPEC_GROUP_TIMEOUT": "6"})
        time.sleep(2)
        rank.terminate()
        _, err = rank.communicate(timeout=30)  # (the pipe ends when the rank and its watch have both ended)
    finally:
        hostfile.unlink()
    assert "could not reach the other ranks" not in err, err


def test_a_group_that_cannot_split_qwen_is_refused_by_name(qwen):
    """Before any weight is read: three ranks cannot split the tiny Qwen's four query heads (nor
    its Gated DeltaNet heads), and its experts are never divided between ranks."""
    from mlx_spec.models.qwen3_5.tensor_parallel import check_split

    config = json.loads((qwen["moe"] / "config.json").read_text())
    with pytest.raises(LoadError, match="cannot split its 4 query heads, its 2 Gated DeltaNet key heads"):
        check_split(config, 3, qwen["moe"])
    with pytest.raises(LoadError, match="experts stay on every rank"):
        check_split(config, 2, qwen["moe"], "split")
    check_split(config, 2, qwen["moe"])  # two ranks split it

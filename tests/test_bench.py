"""`mlx-spec bench` runs every table end to end on the tiny checkpoints, through the installed
console script, and writes its JSON, markdown and report; the figures the report shows are the
JSON's. (They check that the figures are produced and agree, never what they are: timings here
are noise.)"""

import html
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import mlx_spec
from mlx_spec.errors import SettingsError
import tiny
from serving import WITHOUT_TORCH

BENCH = Path(__file__).resolve().parent.parent / "bench"  # the repository's own tools (ab, lookup)


# The console script pip installed beside this interpreter: what a user types.
MLX_SPEC = Path(sys.executable).with_name("mlx-spec")
# Not serving.ENV: that puts this checkout first, and bench/ab.py's older revision runs its own.
WITHOUT_TORCH_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([WITHOUT_TORCH, os.environ.get("PYTHONPATH", "")]))


def mlx_spec_bench(*args, cwd):
    """`mlx-spec bench ...` in a process of its own, as a user runs it."""
    assert MLX_SPEC.is_file(), f"the package is not installed with its console script beside {sys.executable}"
    proc = subprocess.run([str(MLX_SPEC), "bench", *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=WITHOUT_TORCH_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def report_rows(folder: Path, table: str, column: str):
    """The rows of every markdown table in `table`'s section of report.html that has `column`,
    as {column: cell}: the figures a reader of the report sees."""
    page = (folder / "report.html").read_text()
    section = page.split(f"<h2>{table.replace('_', ' ')}</h2>", 1)[1].split("<h2>", 1)[0]
    text = html.unescape(section.split("<pre>", 1)[1].split("</pre>", 1)[0])
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = [cell.strip() for cell in line.strip("|").split("|")]
        elif not line.startswith("|---"):
            cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
            if column in cells:
                rows.append(cells)
    return rows


def assert_shown(rows, records, columns):
    """Each report row shows its JSON record's figures: columns maps a column to (the record's
    value, as the table formats it)."""
    assert rows and len(rows) == len(records), (len(rows), len(records))
    for row, record in zip(rows, records):
        for column, shown in columns.items():
            assert row[column] == shown(record), (column, row[column], record)


def run_script(name, *args, tmp_path):
    """One table into `tmp_path / "results"`: its stdout and JSON (the markdown and the report
    are written beside it)."""
    out = tmp_path / "results"
    if name == "ab":  # a repository tool, not a table of the package
        proc = subprocess.run([sys.executable, str(BENCH / "ab.py"), *args, "--out", str(out / "ab.json")],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path, env=WITHOUT_TORCH_ENV)
        assert proc.returncode == 0, proc.stderr[-2000:]
    else:
        proc = mlx_spec_bench(name.replace("_", "-"), *args, "--out", str(out), cwd=tmp_path)
        assert (out / f"{name}.md").read_text().startswith("## ")
        assert f"Markdown: {out / f'{name}.md'}" in proc.stdout  # the files written are named
        assert "<img" in (out / "report.html").read_text()  # matplotlib is a test dependency
    assert "| " in proc.stdout and "Machine:" in proc.stdout and "BLAS: " in proc.stdout
    data = json.loads((out / f"{name}.json").read_text())
    assert {"chip", "memory_gb", "os", "mlx", "mlx_lm", "mlx_vlm", "blas", "matmul_gflops"} <= set(data["machine"])
    if name != "ab":  # the figures name the commit they were measured at (the tests run from a checkout)
        commit = subprocess.run(["git", "-C", str(BENCH.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        assert f"mlx-spec {mlx_spec.__version__} ({commit}" in proc.stdout and commit in data["machine"]["mlx_spec"]
    assert data["machine"]["matmul_gflops"] > 0
    return proc.stdout, data


@pytest.fixture
def tiny_models(checkpoints):
    return ["--model", str(checkpoints["text"]), "--drafter", str(checkpoints["assistant"])]


def test_positions(tiny_models, tmp_path):
    stdout, data = run_script("positions", *tiny_models, "--contexts", "16,40", "--repeats", "1", tmp_path=tmp_path)
    assert [row["positions"] for row in data["target"]] == [1, 2, 3, 4, 5, 6, 7, 8, 16] * 2
    assert [row["steps"] for row in data["drafter"]] == list(range(1, 9))
    assert data["weight_bytes_per_pass"] > 0
    folder = tmp_path / "results"
    assert_shown(report_rows(folder, "positions", "ratio to 1"), data["target"],
                 {"context": lambda r: str(r["context"]), "positions": lambda r: str(r["positions"]),
                  "ms": lambda r: f"{r['ms']:.2f}", "ratio to 1": lambda r: f"{r['ratio']:.2f}",
                  "weights GB/s": lambda r: f"{r['gb_per_s']:.1f}"})
    assert_shown(report_rows(folder, "positions", "C_g"), data["drafter"],
                 {"g": lambda r: str(r["steps"]), "ms": lambda r: f"{r['ms']:.2f}", "C_g": lambda r: f"{r['c_g']:.2f}"})


def test_positions_with_random_weights_small_shape(tmp_path):
    _, data = run_script("positions", "--random-weights", "--shape", "small", "--contexts", "8", "--repeats", "1", tmp_path=tmp_path)
    assert data["models"]["target"] == "random weights, small shape"
    assert len(data["target"]) == 9 and len(data["drafter"]) == 8


def test_acceptance(tiny_models, tmp_path):
    stdout, data = run_script("acceptance", *tiny_models, "--max-tokens", "6", "--workloads", "tool call,long Chinese text", tmp_path=tmp_path)
    assert {(r["workload"], r["sampling"]) for r in data["runs"]} == {
        (w, s) for w in ("tool call", "long Chinese text") for s in ("gemma", "greedy")
    }
    for run in data["runs"]:
        assert run["mtp_on"]["drafted"] > 0 and run["mlx_lm"]["how"] == "stream_generate"
        assert run["same_tokens"] == "yes"
        # Device time alone over wall time: a ratio of two timings, which a busy machine moves
        # past 1 (a cycle timed alone while another process had the cores): only its presence.
        assert run["loop_efficiency"] > 0
        if run["sampling"] == "greedy":  # float32 tiny model: no rounding of log-probs to speak of
            assert run["same_as_mlx_lm"] == "yes"
    assert_shown(report_rows(tmp_path / "results", "acceptance", "MTP off tok/s"), data["runs"], {
        "workload": lambda r: r["workload"], "mlx-lm tok/s": lambda r: f"{r['mlx_lm']['tps']:.1f}",
        "MTP off tok/s": lambda r: f"{r['mtp_off']['tps']:.1f}", "MTP (g=6) tok/s": lambda r: f"{r['mtp_on']['tps']:.1f}",
        "guesses kept": lambda r: f"{r['mtp_on']['kept']}/{r['mtp_on']['drafted']} "
                                  f"({100 * r['mtp_on']['kept'] / max(r['mtp_on']['drafted'], 1):.0f}%)",
        "speed-up": lambda r: f"{r['speedup']:.2f}x", "loop efficiency": lambda r: f"{r['loop_efficiency']:.2f}",
        "default tok/s": lambda r: f"{r['default']['tps']:.1f}", "MTP on = off": lambda r: r["same_tokens"]})


def test_acceptance_beside_mlx_vlm(tmp_path):
    """mlx-vlm's Gemma 4 MTP on the same prompts in the same run (E2B's tiny google-layout pair):
    its tok/s, guesses kept, mlx-spec over it, and its greedy output against ours without MTP."""
    pytest.importorskip("mlx_vlm", reason="mlx-vlm (the peers extra) is not installed")
    target = tiny.stated_head_size(tiny.build_target(tmp_path / "target", layout="google"))
    drafter = tiny.stated_head_size(tiny.build_family_assistant(tmp_path / "assistant", "e2b"))
    stdout, data = run_script("acceptance", "--model", str(target), "--drafter", str(drafter), "--max-tokens", "24",
                              "--workloads", "tool call", tmp_path=tmp_path)
    assert "mlx_vlm" in data["machine"] and data["machine"]["mlx_vlm"]
    for run in data["runs"]:
        vlm = run["mlx_vlm"]
        assert vlm["tps"] > 0 and 0 <= vlm["kept"] <= vlm["drafted"] and vlm["drafted"] > 0
        # Its greedy output is the target's too (a float32 model: no near ties to round apart).
        assert vlm["same_tokens"] == ("yes" if run["sampling"] == "greedy" else "-")
    assert "mlx-spec g=6 / mlx-vlm" in stdout and "mlx-vlm is not installed" not in stdout
    assert_shown(report_rows(tmp_path / "results", "acceptance", "mlx-vlm MTP tok/s"), data["runs"], {
        "mlx-vlm MTP tok/s": lambda r: f"{r['mlx_vlm']['tps']:.1f}",
        "mlx-vlm kept": lambda r: f"{r['mlx_vlm']['kept']}/{r['mlx_vlm']['drafted']}",
        "mlx-spec g=6 / mlx-vlm": lambda r: f"{r['mtp_on']['tps'] / r['mlx_vlm']['tps']:.2f}x",
        "mlx-spec default / mlx-vlm": lambda r: f"{r['default']['tps'] / r['mlx_vlm']['tps']:.2f}x",
        "mlx-vlm = off": lambda r: r["mlx_vlm"]["same_tokens"]})


@pytest.mark.parametrize("table, argv, flag", [
    ("controlled", ["--acceptance", "1.5"], "--acceptance"),
    ("controlled", ["--acceptance", "abc"], "--acceptance"),
    ("controlled", ["--max-tokens", "0"], "--max-tokens"),
    ("controlled", ["--fixed-lengths", "0,17"], "--fixed-lengths"),
    ("positions", ["--repeats", "0"], "--repeats"),
    ("positions", ["--contexts", "abc"], "--contexts"),
    ("positions", ["--contexts", "0"], "--contexts"),
    ("acceptance", ["--sampling", "bogus"], "--sampling"),
    ("acceptance", ["--workloads", "bogus"], "--workloads"),
    ("draft-length", ["--lengths", "1,99"], "--lengths"),
    ("batch", ["--concurrency", "0"], "--concurrency"),
    ("batch", ["--rounds", "0"], "--rounds"),
    ("batch", ["--answer-tokens", "48,16"], "--answer-tokens"),
    ("overhead", ["--positions", "/no/such/positions.json"], "--positions"),
    ("group", ["--ranks", "1"], "--ranks"),
    ("media", ["--image-tokens", "100"], "--image-tokens"),
])
def test_a_bad_flag_is_one_line_naming_it_before_anything_runs(table, argv, flag, capsys):
    """Found by a review: these were tracebacks (ZeroDivisionError, KeyError, numpy's low >=
    high) after minutes of runs, or ran on nonsense (an acceptance of 1.5, an unknown workload,
    a missing positions file) and exited 0."""
    from mlx_spec.bench import run

    with pytest.raises(SystemExit) as ended:
        run(table, argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert ended.value.code == 2 and f"argument {flag}: " in error and "Traceback" not in error, error


def test_an_out_that_names_a_file_is_refused_before_the_table_runs(tmp_path, capsys):
    from mlx_spec.bench import run

    taken = tmp_path / "afile"
    taken.write_text("")
    with pytest.raises(SystemExit) as ended:
        run("positions", ["--out", str(taken)])
    assert ended.value.code == 2 and f"argument --out: {taken} is a file" in capsys.readouterr().err


def test_a_peer_that_fails_mid_table_leaves_its_columns_empty_not_the_table_unwritten():
    from mlx_spec.bench.acceptance import peer_run

    class Broken:
        def run(self, prompt, settings, max_tokens):
            raise TypeError("hidden_states is None")

    assert peer_run(Broken(), [1, 2], None, 4) == (None, "TypeError: hidden_states is None")
    assert peer_run(None, [1, 2], None, 4) == (None, None)


def test_without_mlx_vlm_the_table_says_how_to_add_it(monkeypatch):
    from mlx_spec.bench import peers

    monkeypatch.setattr(peers, "available", lambda: False)
    assert peers.open_peer(object(), random_weights=False) == (None, peers.MISSING)
    assert 'pip install "mlx-spec[peers]"' in peers.MISSING
    assert "random weights" in peers.open_peer(object(), random_weights=True)[1]


def test_draft_length(tiny_models, tmp_path):
    # (--quick measures a few lengths up to 8, but a --max-g given wins)
    _, data = run_script("draft_length", *tiny_models, "--quick", "--max-g", "2", "--max-tokens", "6", "--workloads", "English code", "--repeats", "1", tmp_path=tmp_path)
    (workload,) = data["workloads"]
    assert [e["g"] for e in workload["by_g"]] == [0, 1, 2]
    assert workload["best_g"] in (0, 1, 2)
    assert all(e["loop_efficiency"] > 0 for e in workload["by_g"])
    assert_shown(report_rows(tmp_path / "results", "draft_length", "tokens/cycle"), workload["by_g"], {
        "g": lambda e: str(e["g"]), "tok/s": lambda e: f"{e['tps']:.1f}", "acceptance": lambda e: f"{100 * e['acceptance']:.0f}%",
        "tokens/cycle": lambda e: f"{e['tokens_per_cycle']:.2f}", "R_g": lambda e: f"{e['R']:.2f}",
        "predicted E/(R+C)": lambda e: f"{e['predicted_speedup']:.2f}x", "measured": lambda e: f"{e['measured_speedup']:.2f}x"})


def test_batch(tiny_models, tmp_path):
    """Several requests at once: every configuration at every concurrency, the same tokens as
    MTP off (greedy), and the table shows the JSON's figures."""
    stdout, data = run_script("batch", *tiny_models, "--concurrency", "1,3", "--prompt-tokens", "8,40",
                              "--answer-tokens", "6,16", "--rounds", "2", "--trace", tmp_path=tmp_path)
    levels = data["levels"]
    assert [r["concurrency"] for r in levels] == [1, 3]
    for r in levels:
        assert all(r["same_tokens"].values()), r["same_tokens"]
        for key in ("default", "mtp_off", "g = 6", "mlx_lm", "one_after_another"):
            assert r[key]["total_tps"] > 0 and r[key]["generated"] > 0
        assert r["default"]["generated"] == r["mtp_off"]["generated"] == r["mlx_lm"]["generated"]
    assert_shown(report_rows(tmp_path / "results", "batch", "default tok/s"), levels, {
        "at once": lambda r: str(r["concurrency"]), "default tok/s": lambda r: f"{r['default']['total_tps']:.1f}",
        "mlx-lm batched": lambda r: f"{r['mlx_lm']['total_tps']:.1f}",
        "default / off": lambda r: f"{r['ratios']['default / off']['median']:.2f}"})
    assert data["step_ms"]  # the cost model's step times, by rows x positions
    # Interleaved rounds: each figure the median of its rounds, each ratio the median of the
    # rounds' ratios; a bar for each batch size against MTP off and mlx-lm.
    for r in levels:
        for key in ("default", "mtp_off", "mlx_lm"):
            assert len(r[key]["rounds_tps"]) == 2 and r[key]["total_tps"] == sum(r[key]["rounds_tps"]) / 2
        ratios = [a / b for a, b in zip(r["default"]["rounds_tps"], r["mtp_off"]["rounds_tps"])]
        assert r["ratios"]["default / off"]["median"] == pytest.approx(sum(ratios) / 2)
        # The prompts alone take part of every run; the decoding ratio leaves them out of both.
        # (Each a separate timed run: their order is the machine's to decide, so it is not asserted.)
        assert r["prompts_s"] > 0
        assert len(r["ratios"]["decoding: default / one after another"]["rounds"]) == 2
    assert [b["bar"] for b in data["bars"]] == [f"{c} at once: default / {p} >= 1" for c in (1, 3) for p in ("off", "mlx-lm")]
    # The trace (--trace): the default's steps of both rounds, each shape's steps counted, the
    # steps with guesses and their time a part of the whole, and the report shows the figures.
    for r in levels:
        trace = r["trace"]
        c = r["concurrency"]  # (a step settles at most 9 tokens a row; each row's first cycle runs alone, untraced)
        assert trace["steps"] >= 2 * (r["default"]["generated"] - c) / (9 * c) > 0 and trace["with_guesses"] <= trace["steps"]
        assert sum(shape["steps"] for shape in trace["shapes"].values()) <= trace["steps"]
        assert all(int(shape.split("x")[0]) <= r["concurrency"] for shape in trace["shapes"])
        assert trace["guess_seconds"] + trace["plain_seconds"] == pytest.approx(trace["seconds"])
    assert "The trace (--trace)" in stdout
    assert_shown(report_rows(tmp_path / "results", "batch", "extra / steps' time"), levels, {
        "at once": lambda r: str(r["concurrency"]), "steps": lambda r: str(r["trace"]["steps"]),
        "with guesses": lambda r: str(r["trace"]["with_guesses"]),
        "extra / steps' time": lambda r: f"{100 * r['trace']['guess_extra_share']:.1f}%"})



def test_batch_at_set_acceptances(tiny_models, tmp_path):
    """`--acceptance 0,1`: each request's guesses are its own MTP off answer's, kept at the set
    chance, while the real assistant runs: at 1 every guess the default and each fixed g
    (`--fixed-g 2,6`) draft is kept (but those past a request's budget), at 0 none; every answer
    is MTP off's; each row and bar names its acceptance, and where guesses are kept the default is
    also set against the fastest fixed g."""
    _, data = run_script("batch", *tiny_models, "--concurrency", "2", "--prompt-tokens", "8,24", "--fixed-g", "2,6",
                         "--answer-tokens", "16,24", "--rounds", "1", "--acceptance", "0,1", tmp_path=tmp_path)
    levels = data["levels"]
    assert [(r["acceptance"], r["concurrency"]) for r in levels] == [(0.0, 2), (1.0, 2)]
    for r in levels:
        assert all(r["same_tokens"].values()), r["same_tokens"]
        for config in ("g = 2", "g = 6", "default"):
            drafted, kept = r[config]["drafted"], r[config]["kept"]
            if r["acceptance"] == 0:
                assert kept == 0, config
            else:  # (a request's last cycle may draft past its budget: those guesses are cut, not kept)
                assert drafted - 2 * 6 <= kept <= drafted and kept > 0, (config, drafted, kept)
        assert r["g = 2"]["drafted"] > 0 and r["g = 6"]["drafted"] > 0
        best = r["best_fixed_g"]
        assert r[f"g = {best}"]["total_tps"] == max(r[f"g = {g}"]["total_tps"] for g in (2, 6))
        assert r["ratios"]["default / best fixed g"]["median"] == pytest.approx(
            r["default"]["rounds_tps"][0] / r[f"g = {best}"]["rounds_tps"][0])
    assert levels[1]["default"]["drafted"] > 0  # every guess kept: the default drafts
    assert [b["bar"] for b in data["bars"]] == [
        "2 (a = 0) at once: default / off >= 0.97", "2 (a = 0) at once: default / mlx-lm >= 1",
        "2 (a = 1) at once: default / off >= 1", "2 (a = 1) at once: default / mlx-lm >= 1",
        f"2 (a = 1) at once: default / best fixed g (g = {levels[1]['best_fixed_g']}) >= 1"]
    assert_shown(report_rows(tmp_path / "results", "batch", "default tok/s"), levels, {
        "at once": lambda r: f"2 (a = {r['acceptance']:g})", "g = 2": lambda r: f"{r['g = 2']['total_tps']:.1f}",
        "best fixed g": lambda r: str(r["best_fixed_g"]),
        "default / best fixed g": lambda r: f"{r['ratios']['default / best fixed g']['median']:.2f}"})


# The group table: tests/test_bench_anywhere.py, from a fresh install called by its path.


def test_group_cost_model_reads_its_share_and_pays_its_latency():
    """One rank of two reads its share of the 31B's weights (about half: the embeddings stay
    whole) and pays two all-reduces per layer; a slower link costs MTP off more per token
    than MTP, which spreads a pass's latency over the tokens it settles."""
    from mlx_spec.bench.group_cost import TARGET_BYTES, best, cycle_seconds, expected_tokens
    from mlx_spec.models.gemma4.sizes import SIZES
    from mlx_spec.models.gemma4.tensor_parallel import rank_share

    config = SIZES["31b"].text
    assert cycle_seconds(0, 1, 614, 10, config) == pytest.approx(TARGET_BYTES / 614e9)
    alone_read = TARGET_BYTES * rank_share(config, 2)[0] / 614e9
    slow, fast = cycle_seconds(0, 2, 614, 50, config), cycle_seconds(0, 2, 614, 10, config)
    assert alone_read < fast < slow and (slow - fast) == pytest.approx(2 * 60 * 2 * 40e-6 + 2 * 40e-6, rel=1e-3)
    g, tps = best(2, 614, 50, 0.7, config)
    per_token_latency_off = slow - fast
    per_token_latency_mtp = (cycle_seconds(g, 2, 614, 50, config) - cycle_seconds(g, 2, 614, 10, config)) / expected_tokens(0.7, g)
    assert g > 0 and per_token_latency_mtp < per_token_latency_off / 2


def test_controlled(tiny_models, tmp_path):
    _, data = run_script("controlled", *tiny_models, "--max-tokens", "12", "--prompt-tokens", "20", "--repeats", "1",
                         "--trials", "3", "--best-of", "2", "--fixed-lengths", "2,6", tmp_path=tmp_path)
    assert [s["acceptance"] for s in data["sweep"]] == [0.0, 0.3, 0.5, 0.7, 0.9, 1.0]
    assert data["text_seeds"] == [0, 1, 2]  # each round its own text (controlled_bars.py)
    assert (tmp_path / "results" / "plots" / "controlled-1.png").is_file()
    assert 'alt="Controlled acceptance against its prediction' in (tmp_path / "results" / "report.html").read_text()
    # What each adaptive run drafted, one per run (3 rounds of the fastest of 2), 12 tokens each.
    lengths = data["adaptive_cycles_by_g"]
    assert set(lengths) == {"copy (free guesses), adaptive", *(f"adaptive, a = {a:g}" for a in (0, 0.3, 0.5, 0.7, 0.9, 1))}
    assert all(len(runs) == 6 for runs in lengths.values())
    assert all(sum(n * (int(g) + 1) for g, n in run.items()) >= 12 for run in lengths["adaptive, a = 1"])
    # With every guess right, every cycle but the last emits g + 1 = 7 tokens.
    assert data["sweep"][-1]["tokens_per_cycle"] > 5
    # Every cycle after the first is built ahead, whatever the acceptance; none waits for the host.
    for point in data["sweep"]:
        assert point["prebuilt_share"] == point["adaptive_prebuilt_share"] == 1.0
        assert point["exposed_host_ms"] == point["adaptive_exposed_host_ms"] == 0.0
        assert point["build_ms"] > 0 and point["launch_ms"] > 0
    assert {bar["bar"].split(" ")[0] for bar in data["bars"]} >= {"pre-built", "exposed"}
    # The machine's noise: MTP off against its second run in each round, and what it means for
    # each bar of rounds (`test_the_machine_s_noise_is_one_configuration_against_itself`).
    noise = data["noise"]
    assert noise["ratios"] == pytest.approx([a / b for a, b in zip(data["trials"]["MTP off"], data["trials"]["MTP off, again"])])
    assert 0 < noise["low_median"] <= 1
    for bar in data["bars"]:
        if "needed" in bar and not bar["bar"].startswith("pre-built"):
            assert bar["inside_noise"] == (bar["needed"] * noise["low_median"] <= bar["ratio"] < bar["needed"])
    folder = tmp_path / "results"
    assert_shown(report_rows(folder, "controlled", "g=6 tok/s"), data["sweep"], {
        "acceptance": lambda s: str(s["acceptance"]), "g=6 tok/s": lambda s: f"{s['tps']:.1f}",
        "MTP off tok/s": lambda s: f"{s['mtp_off_tps']:.1f}",
        "predicted E/(R+C)": lambda s: f"{s['predicted_speedup']:.2f}x", "measured": lambda s: f"{s['measured_speedup']:.2f}x",
        "pre-built": lambda s: f"{100 * s['prebuilt_share']:.0f}%", "adaptive tok/s": lambda s: f"{s['adaptive_tps']:.1f}",
        "adaptive speed-up": lambda s: f"{s['adaptive_speedup']:.2f}x"})
    # Each acceptance's speed-ups are over the MTP off run measured beside it.
    for point in data["sweep"]:
        assert point["measured_speedup"] == point["tps"] / point["mtp_off_tps"]
        assert point["adaptive_speedup"] == point["adaptive_tps"] / point["mtp_off_tps"]
    assert_shown(report_rows(folder, "controlled", "met"), data["bars"], {
        "bar": lambda b: b["bar"], "figure": lambda b: f"{b.get('ratio', b.get('value')):.2f}",
        "met": lambda b: "yes" if b["met"] else ("NO, inside the noise" if b.get("inside_noise") else "NO")})
    # A bar is the median of its rounds, shown with their middle half; the prediction bars
    # divide each round by the R + C timed in that round.
    rounds = len(data["trials"]["MTP off"])
    assert len(data["costs"]) == rounds and all(cost > 1 for cost in data["costs"])
    mlx_lm_bar = next(b for b in data["bars"] if b["bar"] == "MTP off >= 0.95 x mlx-lm")
    ratios = [a / b for a, b in zip(data["trials"]["MTP off"], data["trials"]["mlx-lm"])]
    assert mlx_lm_bar["ratio"] == pytest.approx(statistics.median(ratios))
    assert list(mlx_lm_bar["middle_half"]) == pytest.approx(
        [q for i, q in enumerate(statistics.quantiles(ratios, n=4, method="inclusive")) if i != 1])
    # Each configuration ran twice in each round, and the round took its fastest run.
    assert data["best_of"] == 2 and rounds == 3
    for name, passes in data["runs"].items():
        assert [len(p) for p in passes] == [2, 2, 2]
        assert data["trials"][name] == [max(p) for p in passes]
    assert len(data["loop_efficiency"]["rounds"]) == rounds
    efficiency = sorted(e["efficiency"] for e in data["loop_efficiency"]["rounds"])
    assert data["loop_efficiency"]["median"] == efficiency[rounds // 2]
    assert next(b for b in data["bars"] if "loop efficiency" in b["bar"])["ratio"] == data["loop_efficiency"]["median"]
    a0 = next(b for b in data["bars"] if b["bar"].startswith("a = 0, g = 6"))
    ratios = sorted(on / off * cost for on, off, cost in zip(data["trials"]["g = 6, a = 0"], data["trials"]["MTP off, a = 0"], data["costs"]))
    assert a0["ratio"] == pytest.approx(ratios[rounds // 2] if rounds % 2 else (ratios[rounds // 2 - 1] + ratios[rounds // 2]) / 2)
    assert report_rows(folder, "controlled", "met")[0][f"middle half of the {rounds} rounds"] == "{:.2f}-{:.2f}".format(
        *data["bars"][0]["middle_half"])
    assert "The bars, and the spread of their rounds" in (folder / "report.html").read_text()
    # At every acceptance the adaptive length is set against the best of MTP off (a run of it
    # timed next to the adaptive run, in either order of the round) and every fixed g timed in
    # the same rounds: each round against the one the other two rounds rank first, and (beside
    # it) against the best over all three.
    order = list(data["trials"])
    for a in ("0", "0.3", "0.5", "0.7", "0.9", "1"):
        assert order.index(f"MTP off, a = {a}") + 1 == order.index(f"adaptive, a = {a}")
        rivals = (f"MTP off, a = {a}", f"g = 2, a = {a}", f"g = 6, a = {a}")
        best = data["best"][a]
        assert best in rivals
        assert data["median_tps"][best] == max(data["median_tps"][n] for n in rivals)
        bar = next(b for b in data["bars"] if b["bar"].startswith(f"a = {a}: adaptive >= 0.95 x the best"))
        adaptive = data["trials"][f"adaptive, a = {a}"]
        held_out = []
        for i in range(rounds):
            chosen = max(rivals, key=lambda n: sum(t for j, t in enumerate(data["trials"][n]) if j != i))
            held_out.append(adaptive[i] / data["trials"][chosen][i])
        assert bar["ratio"] == pytest.approx(sorted(held_out)[rounds // 2])
        in_sample = sorted(x / y for x, y in zip(adaptive, data["trials"][best]))
        assert bar["in_sample_ratio"] == pytest.approx(in_sample[rounds // 2])


def test_the_adaptive_length_is_set_against_the_rival_the_other_rounds_rank_first():
    """A rival whose lead over the median comes from one fast round is the best over all the
    rounds, and the reference in that very round; chosen from the other rounds, the round that
    made its lead is set against the rival those rounds rank first instead."""
    from mlx_spec.bench.controlled_bars import against_held_out_best

    trials = {"adaptive": [100.0, 100.0, 100.0], "steady": [100.0, 100.0, 100.0], "lucky": [95.0, 104.0, 130.0]}
    # Over all three rounds "lucky" leads (median 104), so every round would be set against it:
    # 100/95, 100/104, 100/130, median 0.96. Held out: rounds 1 and 2 see lucky's 130 beside its
    # other round (medians 117 and 112.5: lucky); round 3 sees 95 and 104 (99.5: steady).
    assert against_held_out_best(trials, "adaptive", ["steady", "lucky"]) == pytest.approx([100 / 95, 100 / 104, 1.0])
    # One round has no others: it is set against its own best.
    assert against_held_out_best({"adaptive": [90.0], "a": [100.0], "b": [80.0]}, "adaptive", ["a", "b"]) == [0.9]


def test_the_machine_s_noise_is_one_configuration_against_itself():
    """MTP off over its second run in each round: their median, and how low a median of that
    many rounds falls one time in 20, relative to it. A bar missed by less than that reads as
    inside the noise, a bar missed by more as a miss, and on a quiet machine every miss is one."""
    from mlx_spec.bench.controlled_bars import AGAIN, noise, verdict

    noisy = noise({"MTP off": [100.0, 90.0, 110.0, 100.0, 95.0], AGAIN: [100.0, 100.0, 100.0, 80.0, 100.0]})
    assert noisy["ratios"] == pytest.approx([1.0, 0.9, 1.1, 1.25, 0.95])
    assert noisy["median"] == pytest.approx(1.0) and noisy["middle_half"] == pytest.approx((0.95, 1.1))
    # A bootstrap median of five of these is 0.9 where three or more draws are 0.9: about 6%.
    assert noisy["low_median"] == pytest.approx(0.9)
    quiet = noise({"MTP off": [100.0] * 5, AGAIN: [100.0] * 5})
    assert quiet["low_median"] == 1.0
    assert verdict({"met": True}) == "yes"
    assert verdict({"met": False, "inside_noise": True}) == "NO, inside the noise"
    assert verdict({"met": False, "inside_noise": False}) == "NO"
    # Found by a review: one round's "low median" is that round's own ratio over itself, 1.00,
    # whatever the machine did (a quick run read MTP off at 0.44 of itself).
    once = noise({"MTP off": [160.5], AGAIN: [365.9]})
    assert once["low_median"] is None and once["median"] == pytest.approx(160.5 / 365.9)
    assert verdict({"met": False, "inside_noise": None}) == "NO, noise not measured"
    assert verdict({"met": False, "ratio": 0.9, "middle_half": (0.9, 0.9)}) == "NO"  # a counted bar: no noise in it


def test_interleaved_rounds_turn_the_order_every_pass_and_keep_each_pass():
    """Every configuration runs best_of times a round, the order reversed on every pass; the
    loop efficiency takes the fastest alone time and the fastest loop of the round."""
    from mlx_spec.bench.controlled_bars import interleaved_rounds

    order, speeds = [], iter(range(1, 100))

    def config(name):
        def run():
            order.append(name)
            tps = next(speeds)
            return {"tps": tps, "ms_per_cycle": 1000 / tps, "prebuilt_share": 1.0, "exposed_host_ms": 0.0,
                    "build_ms": 1.0, "launch_ms": 2.0, "waited_ms": 3.0}
        return run

    alone = iter([10.0, 12.0, 8.0, 8.0, 30.0, 30.0, 5.0, 7.0])
    configs = {name: config(name) for name in ("a", "b", "c")}
    done = []
    begun = []
    runs, efficiency, costs = interleaved_rounds(configs, 2, 2, "b", lambda: next(alone),
                                                 lambda trial: begun.append((trial, len(order))) or 3.5, done.append)
    assert order == ["a", "b", "c", "c", "b", "a"] * 2
    assert runs == {"a": [[1, 6], [7, 12]], "b": [[2, 5], [8, 11]], "c": [[3, 4], [9, 10]]}
    assert costs == [3.5, 3.5] and done == [0, 1]
    assert begun == [(0, 0), (1, 6)]  # each round begun before its first run
    # Round 1: alone (10 + 12) / 2 = 11 and (8 + 8) / 2 = 8; the fastest loop ran 5 tok/s.
    assert efficiency[0]["device_ms"] == 8.0 and efficiency[0]["loop_ms"] == pytest.approx(200.0)
    assert efficiency[1]["device_ms"] == 6.0 and efficiency[1]["loop_ms"] == pytest.approx(1000 / 11)


def test_media_with_an_image_the_script_draws(checkpoints, tmp_path):
    """`mlx-spec bench media` on a tiny E2B in google's layout (its vision tower): the encoder's
    time, the first token's, and MTP on equal to off after the image; a text-only model is
    skipped with the reason."""
    target = tiny.build_target(tmp_path / "target", layout="google")
    out = tmp_path / "media"
    proc = mlx_spec_bench("media", "--model", str(target), "--drafter", str(checkpoints["assistant"]), "--quick",
                          "--out", str(out), cwd=tmp_path)
    data = json.loads((out / "media.json").read_text())
    assert [r["sampling"] for r in data["runs"]] == ["greedy", "gemma"]
    for run in data["runs"]:
        assert run["encoder_ms"] > 0 and run["first_token_ms"] > 0 and run["image_tokens"] > 0
        assert run["same_tokens"] == "yes" and run["mtp_on"]["drafted"] > 0 and run["mlx_lm_text_only"]["tps"] > 0
    assert_shown(report_rows(out, "media", "encoder ms"), data["runs"], {
        "sampling": lambda r: r["sampling"], "image tokens": lambda r: str(r["image_tokens"]),
        "first token ms": lambda r: f"{r['first_token_ms']:.0f}", "encoder ms": lambda r: f"{r['encoder_ms']:.0f}",
        "MTP off tok/s": lambda r: f"{r['mtp_off']['tps']:.1f}", "MTP (g=6) tok/s": lambda r: f"{r['mtp_on']['tps']:.1f}",
        "speed-up": lambda r: f"{r['speedup']:.2f}x", "MTP on = off": lambda r: r["same_tokens"]})
    assert "| greedy |" in proc.stdout and "first token ms" in proc.stdout
    assert 'alt="Decoding with a ' in (out / "report.html").read_text() and (out / "plots" / "media-1.png").is_file()
    skipped = mlx_spec_bench("media", "--model", str(checkpoints["text"]), "--drafter", str(checkpoints["assistant"]),
                             "--quick", "--out", str(tmp_path / "skipped"), cwd=tmp_path)
    assert "Skipped: this model takes no image" in skipped.stdout and "text-only checkpoint" in skipped.stdout


# The loop before every cycle was built ahead, against which the README measures the pipeline:
# older than `mlx_spec.bench`, its benchmarks lie in bench/ (ab.py's worker takes either).
LOOP_BEFORE = "40c6751"


@pytest.mark.parametrize("base", ["HEAD", LOOP_BEFORE])
def test_two_revisions_side_by_side(tiny_models, tmp_path, base):
    """bench/ab.py: an older revision and the working tree, each in its own process running its
    own code (the package is installed editable from the working tree, whose import hook must
    not hand the old revision the new benchmarks)."""
    known = subprocess.run(["git", "-C", str(BENCH.parent), "cat-file", "-e", f"{base}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"revision {base} is not in this clone's history (a shallow clone?)")
    stdout, data = run_script("ab", "--base", base, "--rounds", "2", "--runs", "0.5:2,0:off", "--max-tokens", "8",
                              "--prompt-tokens", "16", *tiny_models, tmp_path=tmp_path)
    assert [(r["acceptance"], r["g"]) for r in data["runs"]] == [(0.5, "2"), (0.0, "off")]
    for run in data["runs"]:
        assert len(run["old"]) == len(run["new"]) == 2 and run["ratio"] > 0


def test_random_weights_quantized_like_the_default_model():
    """--random-weights builds E2B's shapes at 4 bits; the same builder at small widths must give
    a quantized target and drafter that decode (E2B itself is too slow for MLX on a CPU)."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_spec.bench.models import SMALL, SMALL_ASSISTANT, random_drafter, random_target

    from mlx_spec.engine import Engine

    shape = dict(SMALL, hidden_size=128, vocab_size=4096,
                 vocab_size_per_layer_input=4096, intermediate_size=256)
    target = random_target(shape, bits=4)
    drafter = random_drafter(dict(SMALL_ASSISTANT, vocab_size=4096), backbone=128)
    assert isinstance(target.text_model.embed_tokens, nn.QuantizedEmbedding)
    assert isinstance(target.text_model.embed_tokens_per_layer, nn.QuantizedEmbedding)
    assert isinstance(target.text_model.layers[0].mlp.gate_proj, nn.QuantizedLinear)
    engine = Engine.of(target, drafter)
    result = engine.generate(list(range(1, 40)), max_tokens=12, draft_tokens=3)
    assert len(result.tokens) == 12 and result.stats.drafted > 0
    assert result.tokens == engine.generate(list(range(1, 40)), max_tokens=12, mtp=False).tokens
    mx.clear_cache()


def test_workloads_render_as_the_seed_measured(checkpoints):
    """Thinking off (the empty thought ends the prompt), and the tool round trip as Google's
    template renders it: the results inside the model turn, as mappings, nothing after them."""
    from mlx_spec.bench.runs import workloads

    from mlx_spec import load

    engine = load(str(checkpoints["text"]), drafter=None)
    prompts = {name: engine.tokenizer.decode(prompt) for name, prompt, _ in workloads(engine)}
    assert prompts["tool call"].endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert "<|think|>" not in "".join(prompts.values())
    assert prompts["answer from tool result"].endswith(
        '<|tool_response>response:get_current_time{city:<|"|>New York<|"|>,time:<|"|>2026-11-29 08:04<|"|>,'
        'timezone:<|"|>America/New_York<|"|>}<tool_response|>'
    )


def test_agreement_and_first_difference(checkpoints):
    from mlx_spec.bench.runs import agreement, first_difference

    from mlx_spec import load

    assert agreement([1, 2, 3], [1, 2, 3]) == "yes"
    assert agreement([1, 2, 3], [1, 2]) == "yes (first 2)"
    assert agreement([1, 5, 3], [1, 2]) == "no (first 2)"
    engine = load(str(checkpoints["text"]), drafter=None)
    prompt = list(range(10, 40))
    greedy = engine.generate(prompt, max_tokens=12, mtp=False).tokens
    other = greedy[:5] + [(greedy[5] + 1) % 384] + greedy[6:]
    index, gap = first_difference(engine, prompt, greedy, other)
    assert index == 5 and gap > 0  # the greedy token had the higher logit
    assert first_difference(engine, prompt, greedy, greedy[:4]) is None


@pytest.mark.parametrize("name", ["e4b", "26b-a4b", "31b", "12b"])
def test_random_weights_of_each_size_at_small_width(name):
    """--shape e4b|26b-a4b|31b|12b: each size's published structure (layer pattern and count, K/V
    sharing, experts, keys equal to values, the assistant's head) with random 4-bit weights. The
    real widths take minutes and gigabytes; here the same builder runs at small widths and the
    pair runs (4-bit matmuls are slow on MLX's CPU backend: a few tokens only; test_family checks
    these structures' exactness against transformers)."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlx_spec.bench.models import family_shape, random_drafter, random_target

    from mlx_spec.engine import Engine
    from mlx_spec.models.gemma4.sizes import SIZES as FAMILY
    from mlx_spec.models.gemma4.facts import kv_source_layers

    target_shape, drafter_shape, ordered = family_shape(name)
    small = dict(hidden_size=128, vocab_size=4096, vocab_size_per_layer_input=4096, intermediate_size=256,
                 head_dim=64, global_head_dim=128, sliding_window=16)
    if target_shape.get("hidden_size_per_layer_input"):
        small["hidden_size_per_layer_input"] = 64
    if target_shape.get("enable_moe_block"):
        small.update(num_experts=8, top_k_experts=2, moe_intermediate_size=64)
    target = random_target(dict(target_shape, **small), bits=4)
    drafter_small = {k: small[k] for k in ("vocab_size", "head_dim", "global_head_dim", "sliding_window")}
    drafter = random_drafter(dict(drafter_shape, hidden_size=64, intermediate_size=128, **drafter_small),
                             backbone=128, bits=4, ordered=ordered)
    args = target.args
    assert args.num_hidden_layers == FAMILY[name].text["num_hidden_layers"]
    assert target.kv_layers == kv_source_layers(FAMILY[name].text)
    assert args.enable_moe_block == (name == "26b-a4b") and args.attention_k_eq_v == (name != "e4b")
    assert isinstance(target.text_model.layers[0].mlp.gate_proj, nn.QuantizedLinear)
    if args.enable_moe_block:
        assert type(target.text_model.layers[0].experts.switch_glu.gate_proj).__name__ == "QuantizedSwitchLinear"
    assert drafter.config.use_ordered_embeddings == ordered
    engine = Engine.of(target, drafter)
    prompt = list(range(1, 21))  # past the window of 16
    result = engine.generate(prompt, max_tokens=4, draft_tokens=3, lookup=False, report=False)
    assert len(result.tokens) == 4 and result.stats.drafted > 0
    mx.clear_cache()


def test_all_tables_in_one_folder_with_a_block_to_paste(tiny_models, tmp_path):
    """`mlx-spec bench all --quick`: every table into one folder (JSON, markdown), the report with
    a plot per table, a progress bar per table on standard error, and the block to paste last.
    The group, batch and controlled tables, three of its slowest minutes here, are left out with
    `--skip` (test_bench_anywhere, test_batch and test_controlled run them into their folder, as `all`
    does), and rollback (Qwen's: test_rollback)."""
    out = tmp_path / "all"
    proc = mlx_spec_bench("all", *tiny_models, "--quick", "--workloads", "tool call", "--skip", "group,batch,controlled,rollback,structured",
                          "--out", str(out), cwd=tmp_path)
    assert not any((out / f"{table}.json").exists() for table in ("group", "batch", "controlled"))
    assert "[5/5] media" in proc.stderr  # five tables, counted as such
    for table in ("positions", "acceptance", "draft_length", "overhead"):
        assert json.loads((out / f"{table}.json").read_text())["machine"]["chip"]
        assert (out / f"{table}.md").read_text().startswith("## ")
    page = (out / "report.html").read_text()
    assert {p.name for p in (out / "plots").iterdir()} >= {"positions-1.png", "draft_length-1.png"}
    for title in ("The cost of N positions against one", "tok/s per workload", "Acceptance by guess position",
                  "Speed-up by draft length"):
        assert f'alt="{title}' in page
    for table in ("positions", "acceptance", "draft-length"):
        assert f"{table} [" in proc.stderr and "s left" in proc.stderr
    block = proc.stdout[proc.stdout.rindex("```\nmlx-spec bench"):]
    assert "machine: " in block and "7 positions / 1 at context 128" in block
    # (found by a review: the block named neither mlx-spec's version nor why mlx-vlm's columns were empty)
    why_not = json.loads((out / "acceptance.json").read_text()).get("mlx_vlm")
    assert "mlx-spec 0." in block and (why_not is None or f"mlx-vlm: {why_not}" in block)
    assert "tool call (greedy): MTP g=6" in block and f"report: {out / 'report.html'}" in block
    assert {r["workload"] for r in json.loads((out / "acceptance.json").read_text())["runs"]} == {"tool call"}
    assert "takes no image" in (out / "media.md").read_text()  # random weights: no tokenizer, no towers
    # The overhead table (E2B's structure at narrow widths), predicting from this run's positions.
    data = json.loads((out / "overhead.json").read_text())
    assert sorted(int(g) for g in data["build_ms"]) == list(range(9)) and data["mlx_lm_build_ms"] > 0
    assert 0 <= data["queued_share"] <= 1
    nodes = data["nodes"]
    assert nodes["target pass, plain"] > nodes["target pass, compiled"] > nodes["draft step, plain"] > nodes["draft step, compiled"] > 0
    assert nodes["sampling + acceptance + reports, plain"] > nodes["sampling + acceptance + reports, compiled"] > 0
    cases = [row["case"] for row in data["predicted"]]
    assert cases[:-1] == ["acceptance 0, g = 0"] + [f"acceptance {a}, g = 6" for a in ("0.3", "0.5", "0.7", "1")]
    # Each case from this run's positions table and build times: pipelined, a cycle takes the
    # longer of its build and its device time; serial, their sum.
    positions = json.loads((out / "positions.json").read_text())
    context = min(r["context"] for r in positions["target"])
    device = {r["positions"]: r["ms"] for r in positions["target"] if r["context"] == context}
    draft = {r["steps"]: r["ms"] for r in positions["drafter"]}
    for row, g, tokens in zip(data["predicted"], [0, 6, 6, 6, 6], [1.0] + [sum(a**i for i in range(7)) for a in (0.3, 0.5, 0.7, 1.0)]):
        dev, build = device[g + 1] + draft.get(g, 0.0), data["build_ms"][str(g)]
        assert row["device_ms"] == pytest.approx(dev)
        assert row["pipelined_tps"] == pytest.approx(1000 * tokens / max(build, dev))
        assert row["gain"] == pytest.approx((build + dev) / max(build, dev))
    assert "pipelined tok/s" in proc.stdout
    builds = [{"g": g, "ms": ms} for g, ms in data["build_ms"].items()]
    assert_shown(report_rows(out, "overhead", "host build ms")[:9], builds,
                 {"g": lambda b: b["g"], "host build ms": lambda b: f"{b['ms']:.2f}"})
    assert_shown(report_rows(out, "overhead", "nodes"), list(data["nodes"].items()),
                 {"graph": lambda n: n[0], "nodes": lambda n: str(n[1])})
    assert_shown(report_rows(out, "overhead", "pipelined / serial"), data["predicted"], {
        "case": lambda r: r["case"], "device ms": lambda r: f"{r['device_ms']:.2f}",
        "pipelined tok/s": lambda r: f"{r['pipelined_tps']:.1f}",
        "pipelined / serial": lambda r: f"{r['gain']:.2f}x" if "gain" in r else ""})


def test_results_go_to_a_dated_folder_under_the_current_one(tiny_models, tmp_path):
    mlx_spec_bench("positions", *tiny_models, "--contexts", "8", "--repeats", "1", cwd=tmp_path)
    (folder,) = tmp_path.glob("mlx-spec-bench-*")
    assert (folder / "positions.json").is_file() and (folder / "report.html").is_file()


def test_all_takes_the_shared_options_only(tmp_path):
    from mlx_spec.bench import run_all

    with pytest.raises(SettingsError, match=r"`mlx-spec bench all` takes .*--workloads and --skip; give --contexts to one table instead"):
        run_all(["--contexts", "8", "--out", str(tmp_path)])
    with pytest.raises(SettingsError, match=r"--skip: unknown table 'speed'; the tables are positions, "):
        run_all(["--skip", "group,speed", "--out", str(tmp_path)])
    from mlx_spec.bench import without_skip

    assert without_skip(["--quick", "--skip=group", "--skip", "batch,media", "--out", "x"]) == (
        ["--quick", "--out", "x"], {"group", "batch", "media"})
    with pytest.raises(SettingsError, match=r"unknown table 'speed'"):
        __import__("mlx_spec.bench", fromlist=["run"]).run("speed", [])
    with pytest.raises(SystemExit) as helped:  # (found by a review: it said "give --help to one table" and exited 1)
        run_all(["--help"])
    assert helped.value.code == 0


def test_without_matplotlib_the_report_has_the_tables_and_says_how_to_get_plots(tiny_models, tmp_path, monkeypatch):
    from mlx_spec.bench import report

    out = tmp_path / "results"
    mlx_spec_bench("positions", *tiny_models, "--contexts", "8", "--repeats", "1", "--out", str(out), cwd=tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    assert not report.have_plots()
    page = report.write(out).read_text()
    assert "<img" not in page and 'pip install &quot;mlx-spec[bench]&quot;' in page
    assert "| context | positions | ms |" in page


def test_the_header_names_the_model_files_by_their_sha256(checkpoints, tmp_path):
    import hashlib
    import os

    from mlx_spec.bench.files import model_files, sha256

    files = {f["file"]: f for f in model_files(checkpoints["text"])}
    weights = checkpoints["text"] / "model.safetensors"
    assert files["model.safetensors"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert files["model.safetensors"]["bytes"] == weights.stat().st_size and "config.json" in files
    # A download in huggingface-hub's cache: the blob's name is its sha256, taken as it is.
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir(), snapshot.mkdir(parents=True)
    name = "0123456789abcdef" * 4
    (blobs / name).write_bytes(b"not read")
    os.symlink(blobs / name, snapshot / "model.safetensors")
    assert sha256(snapshot / "model.safetensors") == name
    # A local file is read once per process, and again once it changes.
    local = tmp_path / "local.safetensors"
    local.write_bytes(b"one")
    assert sha256(local) == sha256(local) == hashlib.sha256(b"one").hexdigest()
    local.write_bytes(b"other, longer")
    assert sha256(local) == hashlib.sha256(b"other, longer").hexdigest()


def test_decode_rate_leaves_out_the_first_batch_and_its_tokens():
    """A cycle's tokens arrive at once: the first cycle's count no more than its time does. One
    token a step is mlx-lm's figure, (tokens - 1) / (last - first)."""
    from mlx_spec.bench.runs import rate

    assert rate([0.0, 1.0, 2.0, 4.0]) == 0.75
    # A first cycle of 9 tokens, then three of 9 a second apart: 27 tokens in 3 s.
    cycles = [c for c in range(4) for _ in range(9)]
    assert rate([float(c) for c in cycles], cycles) == 9.0
    # A short first cycle (3 tokens) loses nothing either: 18 tokens in 2 s.
    cycles = [0] * 3 + [1] * 9 + [2] * 9
    assert rate([float(c) for c in cycles], cycles) == 9.0
    assert rate([0.0] * 7, [0] * 7) == 0.0  # one cycle: no rate


def test_our_runs_are_timed_from_their_first_cycle(checkpoints, monkeypatch):
    """run_ours hands rate() each token's cycle: with every guess kept at g = 6 the first batch
    is a whole cycle of 7 tokens."""
    from mlx_spec import load
    from mlx_spec.bench import runs
    from scripted import ScriptedDrafter

    engine = load(str(checkpoints["text"]), str(checkpoints["assistant"]))
    prompt = list(range(10, 40))
    reference = prompt + engine.generate(prompt, max_tokens=20, mtp=False).tokens
    seen = []
    monkeypatch.setattr(runs, "rate", lambda times, batches=None: seen.append((len(times), batches)) or 1.0)
    drafter = ScriptedDrafter(reference, tiny.VOCAB)
    run = runs.run_ours(engine, prompt, runs.SAMPLING["greedy"], 20, drafter=drafter, draft_tokens=6, lookup=False)
    assert run["tokens"] == reference[len(prompt):]
    (count, batches), = seen
    assert count == 20 and batches[:8] == [batches[0]] * 7 + [batches[0] + 1]


def test_runs_resumed_from_the_prompt_s_sequence_give_the_tokens_of_fresh_ones(checkpoints):
    """A table's runs share one prefill of each prompt (bench/prefills.py): past the sliding
    window, greedy and seeded, MTP on and off, each resumed run gives a fresh run's tokens, and
    only the prompt's last token goes through the target again."""
    from mlx_spec import load
    from mlx_spec.bench import runs
    from mlx_spec.bench.prefills import Prefills

    engine = load(str(checkpoints["text"]), str(checkpoints["assistant"])).with_stop_tokens([])
    prompt = [(7 * i) % (tiny.VOCAB - 1) + 1 for i in range(3 * tiny.WINDOW)]
    prefills = Prefills(engine)
    for sampling in ("greedy", "gemma"):
        settings = runs.SAMPLING[sampling]
        for kwargs in (dict(mtp=False), dict(draft_tokens=4), {}):
            fresh = runs.run_ours(engine, prompt, settings, 40, **kwargs)
            resumed = [runs.run_ours(engine, prompt, settings, 40, prefills=prefills, **kwargs) for _ in range(2)]
            assert resumed[0]["tokens"] == resumed[1]["tokens"] == fresh["tokens"], (sampling, kwargs)
    (state,) = prefills.sequences.values()
    assert state.tokens[: len(prompt)] == prompt
    decoder = engine.decoder(mtp=False)
    with prefills.sequence(decoder, prompt):
        pass
    assert decoder.stats.prompt_tokens == 1 and decoder.stats.prompt_reused == len(prompt) - 2


def test_the_machine_line_names_the_blas_mlx_calls(monkeypatch):
    """On Linux the mlx-cpu wheel's BLAS is netlib's reference one (every batched CPU figure is
    bent by it), named as such; a preloaded BLAS, which the dynamic linker puts first, is named
    instead."""
    from mlx_spec.bench.blas import blas_library, matmul_gflops

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    found = blas_library()
    if sys.platform == "darwin":
        assert found == "Accelerate"
    else:
        assert found != "unknown" and "blas" in found.lower()
    monkeypatch.setenv("LD_PRELOAD", "/opt/x/libjemalloc.so.2 /usr/lib/libopenblas.so.0")
    assert blas_library() == ("Accelerate" if sys.platform == "darwin" else "libopenblas.so.0 (preloaded)")
    assert matmul_gflops(64, repeats=1) > 0


def test_per_request_rate_gives_a_burst_s_tokens_no_free_time():
    """A request whose first cycle hands over three tokens at once (two kept guesses), then one
    every 0.2 s: its rate is the two later tokens over 0.4 s, not four (the first cycle's kept
    guesses were counted as made in no time, found by a review)."""
    from mlx_spec.bench.batch_runs import figures

    got = figures(0.0, [[0.1, 0.1, 0.1, 0.3, 0.5]])
    assert got["per_request_tps"] == pytest.approx(2 / 0.4)
    assert got["total_tps"] == pytest.approx(5 / 0.5) and got["first_token_s"] == pytest.approx(0.1)


def test_the_block_to_paste_names_only_this_run_s_tables(tmp_path):
    """`all --skip controlled --out FOLDER` into a folder holding an earlier controlled table:
    the block to paste took its machine and figures as this run's (found by a review); it now
    names it as an earlier run's, and quotes none of it."""
    from mlx_spec.bench import summary

    machine = {"chip": "an earlier Mac", "memory_gb": 16, "os": "macOS", "mlx": "0", "device": "gpu", "mlx_lm": "0"}
    sweep = [{"acceptance": 0.5, "measured_speedup": 1.5, "predicted_speedup": 1.6}]
    (tmp_path / "controlled.json").write_text(json.dumps({"machine": machine, "sweep": sweep}))
    block = summary(tmp_path, ["positions", "acceptance"])
    assert "an earlier Mac" not in block and "controlled a = 0.5" not in block
    assert "(in the report from an earlier run, not this one: controlled)" in block
    assert "controlled a = 0.5: 1.50x measured" in summary(tmp_path)


def test_the_progress_bar_to_a_file_is_plain_lines(capsys):
    """Into a log file the bar wrote a carriage return and an erase-line escape before each
    figure (found by a review); a terminal still gets the one rewritten line."""
    from mlx_spec.bench.common import Progress

    progress = Progress("controlled", 2)
    progress.step("acceptance 0")
    progress.step("bars, round 1")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["controlled [############------------] 1/2 acceptance 0",
                                                      "controlled [########################] 2/2 bars, round 1"]
    assert not any("\r" in line or "\x1b" in line for line in lines)

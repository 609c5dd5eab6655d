"""`mlx-spec bench rollback`: a Gated DeltaNet layer's rollback, replay against a state kept per
position, on a tiny Qwen3.5 folder; and the per-position way it times leaves the states the
replay leaves (the two columns time the same result)."""

import mlx.core as mx
import pytest

import tiny_qwen
from test_bench import mlx_spec_bench, run_script


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    return tiny_qwen.build(tmp_path_factory.mktemp("rollback") / "qwen")


def test_rollback_table_on_a_qwen_folder(qwen_folder, tmp_path):
    stdout, data = run_script("rollback", "--model", str(qwen_folder), "--quick", tmp_path=tmp_path)
    assert [(e["rows"], e["positions"]) for e in data["by_rows_positions"]] == [(1, 2), (1, 4), (4, 2), (4, 4)]
    for entry in data["by_rows_positions"]:
        assert entry["replay_ms"] > 0 and entry["per_position_ms"] > 0
        # 16 x 16 float32 per value head, four heads: a state is 4 KiB; a position's inputs 272
        # bytes; the convolution's window 3 x 128 bfloat16
        assert entry["per_position_bytes"] == entry["positions"] * 4096 + 768
        assert entry["replay_bytes"] == 4096 + 768 + entry["positions"] * 272
    assert "per-position / replay" in stdout and data["layer"] == str(qwen_folder)


def test_rollback_table_skips_a_model_without_gated_deltanet_layers(tmp_path, checkpoints):
    proc = mlx_spec_bench("all", "--model", str(checkpoints["text"]), "--quick", "--skip",
                          "positions,acceptance,draft-length,controlled,overhead,media,batch,group,structured",
                          "--out", str(tmp_path / "all"), cwd=tmp_path)
    assert "rollback skipped" in proc.stderr and "has no Gated DeltaNet layers" in proc.stderr


@pytest.mark.parametrize("kept", [[0, 3], [1, 2]])
def test_the_state_taken_per_position_is_the_replayed_one(qwen_folder, kept):
    from mlx_spec import load
    from mlx_spec.bench.rollback import run_keeping_states
    from mlx_spec.models.qwen3_5.recurrent import Stash, empty_state, replay

    layer = next(l for l in load(str(qwen_folder)).target.text_model.layers if l.is_linear).linear_attn
    window, state = empty_state(layer, 2, mx.float32)
    state = mx.random.normal(state.shape, key=mx.random.key(1)) * 0.1
    qkv, a, b = (mx.random.normal((2, 3, n), key=mx.random.key(n)) for n in (layer.conv_dim, layer.num_v_heads,
                                                                               layer.num_v_heads))
    rows = mx.array(kept, mx.int32)
    want_window, want_state = replay(layer, window, state, Stash(qkv, a, b), rows)
    _, states, conv_input = run_keeping_states(layer, qkv, a, b, window, state)
    every = mx.concatenate([state[:, None], states], axis=1)  # (the state after 0 positions first)
    taken = mx.take_along_axis(every, rows.reshape(-1, 1, 1, 1, 1), axis=1)[:, 0]
    assert mx.allclose(taken, want_state, atol=1e-5).item()
    keep = layer.conv_kernel_size - 1
    window_taken = mx.take_along_axis(conv_input, (rows[:, None] + mx.arange(keep)[None])[..., None], axis=1)
    assert mx.array_equal(window_taken, want_window).item()


def test_rollback_table_names_a_missing_folder_or_a_broken_config(tmp_path):
    import subprocess

    from test_bench import MLX_SPEC, WITHOUT_TORCH_ENV

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    for model, said in ((str(tmp_path / "nowhere"), "no such folder"), (str(broken), "not a readable config.json")):
        proc = subprocess.run([str(MLX_SPEC), "bench", "rollback", "--model", model, "--out", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=120, env=WITHOUT_TORCH_ENV)
        assert proc.returncode != 0 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-800:]

"""`mlx-spec bench structured`: answers held to a JSON schema or a regex, MTP off, the default and
mlx-lm under the same llguidance mask, on the tiny target trained to speak Gemma 4's chat format;
random weights (no tokenizer) skip it by name."""

from test_bench import mlx_spec_bench, run_script


def test_structured_table_on_a_checkpoint_with_a_tokenizer(trained, checkpoints, tmp_path):
    stdout, data = run_script("structured", "--model", str(trained), "--drafter", str(checkpoints["assistant"]), "--quick",
                              tmp_path=tmp_path)
    cases = {c["case"]: c for c in data["cases"]}
    assert set(cases) == {"record", "tool arguments", "any JSON object", "date (regex)"}
    assert all(c["same_tokens"] for c in cases.values())  # MTP off, the default and mlx-lm agree
    record = cases["record"]
    assert record["tokens"] > 20 and record["forced_kept"] > 5  # the keys, drafted as forced guesses
    assert record["default_tps"] > 0 and record["mlx_lm_tps"] > 0 and record["off_tps"] > 0
    assert "Bar (default >= MTP off" in stdout and "mlx-lm + llguidance" in stdout


def test_structured_table_skips_random_weights_by_name(tmp_path):
    proc = mlx_spec_bench("all", "--random-weights", "--shape", "small", "--quick", "--skip",
                          "positions,acceptance,draft-length,controlled,overhead,media,batch,group,rollback",
                          "--out", str(tmp_path / "all"), cwd=tmp_path)
    assert "structured skipped" in proc.stderr and "no tokenizer" in proc.stderr
    assert not (tmp_path / "all" / "structured.json").exists()
    assert (tmp_path / "all").is_dir()

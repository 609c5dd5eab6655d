"""Qwen3.5 and Qwen3.6 (dense and mixture of experts), with the MTP layer in the target's own
checkpoint: the second family (issue: Qwen).

- loader.py: the target through mlx-lm's own network, and the MTP layer from the checkpoint's
  `mtp.` weights (mtp.py), each checked against transformers;
- recurrent.py and storage.py: the Gated DeltaNet layers' state, rolled back per row of the
  loop's storage when guesses are rejected (a pass replays what its rows kept of the last one);
- target.py: the target behind models/protocol.py's `TargetModel`, its batch pass compiled.

The loop decodes it exactly (tests/test_qwen_rows.py: transformers' greedy answers with every
count of kept guesses, rows of a batch, marks). Not in the registry yet: its chat format and
its MTP drafter (a layer with K/V of its own, in the storage beside the target's) come next.
"""

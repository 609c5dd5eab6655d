"""Qwen3.5 and Qwen3.6 (dense and mixture of experts), with the MTP layer in the target's own
checkpoint: the second family (issue: Qwen).

What is here so far: the target through mlx-lm's own network (loader.py) and the MTP layer
(mtp.py), each checked against transformers. The family is not in the registry yet: its Gated
DeltaNet layers' recurrent state must first roll back per row of the loop's batch storage when a
guess is rejected, which the storage (models/batch_cache.py) does not do yet.
"""

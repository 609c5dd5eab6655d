"""The published text configs of the Qwen sizes whose whole config.json could be read here (the
hub is unreachable from the machine this was written on): the shapes `bench --random-weights
--shape` builds. docs/models.md says where each was read. Nothing loaded from a checkpoint
reads these: a real model's config is its own."""

from typing import Any, Dict

_COMMON = dict(
    head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    full_attention_interval=4, vocab_size=248320, rms_norm_eps=1e-6, max_position_embeddings=262144,
    attn_output_gate=True, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
)

SHAPES: Dict[str, Dict[str, Any]] = {
    # Qwen/Qwen3.5-0.8B's config.json, read whole
    "qwen3.5-0.8b": dict(_COMMON, model_type="qwen3_5_text", hidden_size=1024, num_hidden_layers=24,
                         intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2,
                         linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True),
    # Qwen/Qwen3.6-27B's config.json at revision 6a9e13bd, read whole
    "qwen3.6-27b": dict(_COMMON, model_type="qwen3_5_text", hidden_size=5120, num_hidden_layers=64,
                        intermediate_size=17408, num_attention_heads=24, num_key_value_heads=4,
                        linear_num_key_heads=16, linear_num_value_heads=48, tie_word_embeddings=False),
    # Qwen/Qwen3.6-35B-A3B's text config, as two checks of the official checkpoint hold it
    "qwen3.6-35b-a3b": dict(_COMMON, model_type="qwen3_5_moe_text", hidden_size=2048, num_hidden_layers=40,
                            moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=256,
                            num_experts_per_tok=8, num_attention_heads=16, num_key_value_heads=2,
                            linear_num_key_heads=16, linear_num_value_heads=32, tie_word_embeddings=False),
}

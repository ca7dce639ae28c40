"""Tiny seeded random targets of the decoder families users bring, from each family's own config class.

Each is built small (2-3 layers, hidden 64, vocabulary 128) with the family's distinctive parts
kept: GQA and rope scaling (Llama-3), q/k/v biases (Qwen-2.5), q/k norms (Qwen-3, OLMo-2), a
sliding window on every layer (Mistral) or on some (Gemma-2, Gemma-3, Qwen-2 with
use_sliding_window), soft-capping and scaled, tied embeddings (Gemma), fused qkv (Phi-3). The
window is made tiny (4) so that prompts and decodes cross it.
"""

from __future__ import annotations

import torch
import transformers as tf

WINDOW = 4
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)

FAMILIES = {
    "llama3": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
        **COMMON, num_hidden_layers=2, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 64})),
    "qwen25": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, num_hidden_layers=2)),  # q/k/v biases
    "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=16)),
    "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=WINDOW)),
    "qwen2_sliding": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, num_hidden_layers=2, sliding_window=WINDOW,
                                                               use_sliding_window=True, max_window_layers=1)),
    "gemma2": lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(**COMMON, num_hidden_layers=2, head_dim=16,
                                                           sliding_window=WINDOW)),
    "gemma3": lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**COMMON, num_hidden_layers=3, head_dim=16,
                                                               sliding_window=WINDOW, sliding_window_pattern=2)),
    "phi3": lambda: tf.Phi3ForCausalLM(tf.Phi3Config(**COMMON, num_hidden_layers=2, sliding_window=WINDOW)),
    "olmo2": lambda: tf.Olmo2ForCausalLM(tf.Olmo2Config(**COMMON, num_hidden_layers=2)),
}
SLIDING = ("mistral", "qwen2_sliding", "gemma2", "gemma3", "phi3")


def family_target(name: str, seed: int = 0, coupling: float | None = None, vocab_size: int = 128) -> torch.nn.Module:
    """A seeded random target of the family, in eval mode. `coupling` scales
    every attention and MLP output, so the next token mostly follows the current one (a
    bigram-like target that a simple head drafts well: long accepted paths get exercised)."""
    torch.manual_seed(seed)
    COMMON["vocab_size"] = vocab_size
    try:
        model = FAMILIES[name]()
    finally:
        COMMON["vocab_size"] = 128  # transformers' default attention for the family (Gemma-2 soft-caps: eager)
    # OLMo-2 normalizes each branch's output (post-norms), so its norms carry the scale there
    scaled = ("post_attention_layernorm", "post_feedforward_layernorm") if name == "olmo2" else ("self_attn.o_proj",
                                                                                                 "mlp.down_proj")
    if coupling is not None:
        with torch.no_grad():
            for module_name, module in model.named_modules():
                if module_name.endswith(scaled):
                    module.weight.mul_(coupling)
    return model.eval()

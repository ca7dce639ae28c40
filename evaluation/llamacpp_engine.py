"""llama.cpp as benchmark methods, plain decoding in its own venv: `llamacpp` (the same weights as a GGUF,
unquantized) and `llamacpp-q4` (those weights in llama.cpp's Q4_1, the format the embedded default ships in).

`make consumers` builds llama-cpp-python from source for this CPU into .consumers/llamacpp and keeps
its release's converter (convert_hf_to_gguf.py with gguf-py). The bench converts the target once
(`gguf_of`, unquantized, in `gguf_dtype`: bf16 where the run is bf16 or the checkpoint's weights are bf16,
else f32) into `EAGLE_CACHE/gguf/`, and for
`llamacpp-q4` quantizes that file once with llama.cpp's own quantizer (scripts/consumers/llamacpp_quantize.py);
then scripts/consumers/llamacpp_server.py answers one prompt at a time, greedy, with the bench's threads.
llama.cpp times its own generation; its model load is reported apart as `startup_seconds`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from eagle.common.child_process import JsonLineChild, child_env, rss_mb, run_logged
from eagle.targets.resolve import cache_dir

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".consumers" / "llamacpp"
PYTHON = HOME / "bin" / "python"
CONVERTER = HOME / "src" / "convert_hf_to_gguf.py"
SERVER = ROOT / "scripts" / "consumers" / "llamacpp_server.py"
QUANTIZE = ROOT / "scripts" / "consumers" / "llamacpp_quantize.py"
QUANTIZED = {"llamacpp": None, "llamacpp-q4": "q4_1"}  # method -> llama.cpp quantization type
OUTTYPE = {torch.bfloat16: "bf16", torch.float32: "f32"}


class LlamaCppEngine:
    """llama.cpp in a subprocess: `generate(ids, max_new)` -> (new ids [n], steps, seconds, accepts)."""

    def __init__(self, target: Path, dtype: torch.dtype, threads: int, quantization: str | None = None,
                 prefix_cache: bool = False):
        """prefix_cache: keep the KV cache between prompts (llama.cpp evaluates only a prompt's tokens after its
        common prefix with the previous one); else every prompt is evaluated whole."""
        if not PYTHON.exists() or not CONVERTER.exists():
            raise FileNotFoundError(f"{HOME} incomplete: the llamacpp methods need `make consumers` "
                                    "(llama-cpp-python built from source, and its converter)")
        gguf = gguf_of(target, gguf_dtype(target, dtype))
        config = {"gguf": str(gguf if quantization is None else quantized(gguf, quantization)), "threads": threads,
                  "extra_buffers": quantization is None,  # a Q4_1 file in llama.cpp's AMX buffers crashes here
                  "keep_prefix": prefix_cache}
        self.child = JsonLineChild([str(PYTHON), str(SERVER), json.dumps(config)], child_env(threads, foreign=True),
                                   "llama.cpp engine", log=True)
        self.startup_seconds, self.version = self.child.ready["startup_seconds"], self.child.ready["llama_cpp"]

    def generate(self, ids: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, int, float, list[int]]:
        r = self.child.ask({"prompt": ids[0].tolist(), "max_tokens": max_new_tokens})
        return torch.tensor(r["tokens"], dtype=torch.long), max(len(r["tokens"]) - 1, 0), r["seconds"], []

    def rss_mb(self) -> float:
        return rss_mb(self.child.proc.pid)

    def close(self) -> None:
        self.rss_at_close_mb = self.rss_mb()
        self.child.close(timeout=30)


def gguf_dtype(target: Path, dtype: torch.dtype) -> torch.dtype:
    """The dtype llama.cpp reads the weights in for a run in `dtype`: bf16 also for an fp32 run over a checkpoint
    stored in bf16 (the same values; llama.cpp widens them in registers, as our fp32 decoding does through its
    GEMV, eagle/compiled/gemv.py), where it reads half the bytes: 1.38x f32's tok/s on an AVX512F Xeon without
    bf16 arithmetic (docs/speed.md)."""
    config = json.loads((Path(target) / "config.json").read_text())
    stored = config.get("dtype") or config.get("torch_dtype")
    return torch.bfloat16 if dtype == torch.bfloat16 or stored == "bfloat16" else dtype


def gguf_of(target: Path, dtype: torch.dtype) -> Path:
    """The target folder's weights as an unquantized GGUF in `dtype`, written once by llama.cpp's own
    converter (keyed by the folder's path and its files' sizes and times)."""
    if dtype not in OUTTYPE:
        raise ValueError(f"llama.cpp runs bf16 or fp32 here, not {dtype}")
    files = sorted(p for p in Path(target).iterdir() if p.is_file())
    key = hashlib.sha256(json.dumps([str(Path(target).resolve())] + [[p.name, p.stat().st_size, p.stat().st_mtime_ns]
                                                                   for p in files]).encode()).hexdigest()[:12]
    out = cache_dir() / "gguf" / f"{Path(target).name}-{key}-{OUTTYPE[dtype]}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp-{os.getpid()}")
        run_logged([sys.executable, str(CONVERTER), str(target), "--outtype", OUTTYPE[dtype], "--outfile", str(tmp)],
                   out.with_suffix(".log"), child_env(None), ROOT)
        os.replace(tmp, out)
    return out


def quantized(gguf: Path, kind: str) -> Path:
    """`gguf` quantized to `kind` (e.g. q4_1) by llama.cpp's quantizer, written once beside it."""
    out = gguf.with_name(f"{gguf.stem}-{kind}.gguf")
    if not out.exists():
        tmp = out.with_suffix(f".tmp-{os.getpid()}")
        run_logged([str(PYTHON), str(QUANTIZE), str(gguf), str(tmp), kind], out.with_suffix(".log"),
                   child_env(None, foreign=True), ROOT)
        os.replace(tmp, out)
    return out

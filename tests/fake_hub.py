"""A Hugging Face cache folder built by hand: what a cluster node holds after `hf download`.

    cache/models--org--tiny/refs/main               -> the commit hash `main` points at
    cache/models--org--tiny/snapshots/<commit>/     -> config.json, model.safetensors

`offline_cache(monkeypatch, folder)` makes `folder` the HF cache of this process and turns the
Hub off (HF_HUB_OFFLINE=1), as on a compute node without network.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny import tiny_llama

REPO = "org/tiny"
COMMIT_A = "a1" * 20  # 40 hex digits, as a Hub commit
COMMIT_B = "b2" * 20


def repo_folder(cache: Path, repo_id: str = REPO) -> Path:
    return Path(cache) / f"models--{repo_id.replace('/', '--')}"


def add_snapshot(cache: Path, commit: str, repo_id: str = REPO, main: bool = True, seed: int = 0) -> Path:
    """A snapshot of a tiny random Llama (save_pretrained) under `commit`; `main`: refs/main names it."""
    folder = repo_folder(cache, repo_id) / "snapshots" / commit
    tiny_llama(seed=seed).save_pretrained(folder)
    if main:
        (repo_folder(cache, repo_id) / "refs").mkdir(parents=True, exist_ok=True)
        (repo_folder(cache, repo_id) / "refs" / "main").write_text(commit)
    return folder


def offline_cache(monkeypatch, cache: Path) -> Path:
    """HF_HUB_CACHE=cache and HF_HUB_OFFLINE=1, in the environment and in huggingface_hub's
    constants (read once, at import, in a real process)."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache

"""Hub targets: a repo id and a revision → a snapshot folder of the local Hugging Face cache.

    folder = hub_snapshot("meta-llama/Meta-Llama-3-8B-Instruct", revision=None)   # None: main
    snapshot_commit(folder)    # the commit hash the folder holds (its name in the HF cache)

Online, the config, the tokenizer and the weights in one format (`hub_patterns`) download into
the HF cache (HF_HUB_CACHE). With HF_HUB_OFFLINE=1 (the usual compute node), or when the Hub
cannot be reached, the snapshot already in the cache serves: the commit `refs/<revision>` names,
or `snapshots/<revision>` for a commit hash; without one the error names the repo, the revision
and the cache folder looked in. A pinned revision (a commit hash) makes every node read the same
weights and chat template whatever its cache's `main` points at.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("eagle.targets")

CONFIG_AND_TOKENIZER = ["*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken", "tokenizer*"]
WEIGHTS = ("*.safetensors", "*.bin")
OFFLINE_VALUES = {"1", "ON", "YES", "TRUE"}


def hub_patterns(files: list[str]) -> list[str]:
    """What to download of a Hub model repo listing `files`: config, tokenizer (SentencePiece
    `tokenizer.model` included) and the weights in one format, safetensors when the repo has
    them, else PyTorch `.bin` (e.g. lmsys/vicuna-*-v1.3 on its main branch)."""
    if any(f.endswith(".safetensors") for f in files):
        return CONFIG_AND_TOKENIZER + ["*.safetensors"]
    if any(f.endswith(".bin") for f in files):
        return CONFIG_AND_TOKENIZER + ["*.bin"]
    raise FileNotFoundError(f"no model weights (*.safetensors or *.bin) among the repo's {len(files)} files")


def hub_cache() -> Path:
    """The HF cache folder: HF_HUB_CACHE as this process's environment says now, else huggingface_hub's."""
    from huggingface_hub import constants

    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()


def offline() -> bool:
    """HF_HUB_OFFLINE is on (in the environment, or in huggingface_hub's constants)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in OFFLINE_VALUES


def repo_cache(repo_id: str) -> Path:
    """The cache folder of a model repo: HF_HUB_CACHE/models--ORG--NAME."""
    return hub_cache() / f"models--{repo_id.replace('/', '--')}"


def snapshot_commit(folder: str | os.PathLike) -> str | None:
    """The commit a HF cache snapshot folder (…/models--ORG--NAME/snapshots/COMMIT) holds; None
    for any other folder (a local model folder, a converted GGUF)."""
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.name
    return None


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The snapshot folder of `repo_id` at `revision` (None: main), downloaded when needed and
    possible, else from the local HF cache."""
    if offline():
        return cached_snapshot(repo_id, revision, "HF_HUB_OFFLINE=1")
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError

    try:
        patterns = hub_patterns(HfApi().list_repo_files(repo_id, revision=revision))
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, cache_dir=hub_cache()))
    except Exception as e:  # offline, unreachable, gated, missing: the cache may still hold it
        failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        found = find_snapshot(repo_id, revision)
        if found is not None:
            log.warning("target %s: the Hub download failed (%s); using the cached snapshot %s", repo_id, failure, found)
            return found
        if isinstance(e, GatedRepoError):
            raise FileNotFoundError(
                f"target {repo_id!r} is gated on the Hub: accept its license on its Hub page with your account, "
                "then set HF_TOKEN (or run `hf auth login`)"
            ) from None
        raise FileNotFoundError(
            f"target {repo_id!r} (revision {revision or 'main'}): the Hub download failed ({failure}) and the local "
            f"HF cache has no snapshot of it ({repo_cache(repo_id)}). Offline? Pass a local folder, or download it "
            "where there is network into the HF_HUB_CACHE this node reads"
        ) from None


def find_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The complete cached snapshot of `repo_id` at `revision`, without any network; else None."""
    try:
        return cached_snapshot(repo_id, revision, "looking in the cache only")
    except FileNotFoundError:
        return None


def cached_snapshot(repo_id: str, revision: str | None, why: str) -> Path:
    """The cached snapshot of `repo_id` at `revision` with a config and its weights; a
    FileNotFoundError naming the repo, the revision and the cache folder when there is none.
    `why`: what the error says kept the Hub out (e.g. "HF_HUB_OFFLINE=1")."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=hub_cache(), local_files_only=True,
                                        allow_patterns=CONFIG_AND_TOKENIZER))
    except Exception as e:  # LocalEntryNotFoundError, IncompleteSnapshotError, a malformed repo id
        raise FileNotFoundError(
            f"target {repo_id!r} (revision {revision or 'main'}) is not in the local HF cache ({why}): no snapshot "
            f"in {repo_cache(repo_id)} ({type(e).__name__}). Download it where there is network "
            f"(`hf download {repo_id}{f' --revision {revision}' if revision else ''}`) into the HF_HUB_CACHE this "
            "node reads, or pass a local folder"
        ) from None
    missing = _missing_files(folder)
    if missing:
        raise FileNotFoundError(f"target {repo_id!r}: the cached snapshot {folder} is incomplete ({missing}); "
                                "download it again where there is network")
    return folder


def _missing_files(folder: Path) -> str | None:
    """What a cached snapshot lacks to load as a model (config, weights, a shard its index names), else None."""
    import json

    if not (folder / "config.json").is_file():
        return "no config.json"
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
            absent = [s for s in shards if not (folder / s).is_file()]
            return f"{len(absent)} of {len(shards)} weight shards missing, e.g. {absent[0]}" if absent else None
    if not any(any(folder.glob(p)) for p in WEIGHTS):
        return "no weights: neither *.safetensors nor *.bin"
    return None

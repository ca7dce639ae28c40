"""Upload an exported head to the Hugging Face Hub.

    python -m train.publish checkpoints/runs/NAME/head --repo-id USER/eagle-NAME [--private]

Uses huggingface_hub's create_repo + upload_folder. The endpoint is HF_ENDPOINT (or
--endpoint); the token is HF_TOKEN or the one saved by `hf auth login`. Failures (no token,
no network, refused) end in one line, not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REQUIRED = ("config.json", "model.safetensors")
UPLOADED = ["*.json", "*.safetensors", "*.md"]


class PublishError(RuntimeError):
    """A publishing failure explained in one line."""


def check_head_dir(directory: str | Path) -> Path:
    directory = Path(directory)
    missing = [f for f in REQUIRED if not (directory / f).exists()]
    if not directory.is_dir() or missing:
        raise PublishError(f"{directory}: not an exported head (missing {', '.join(missing) or 'directory'})")
    return directory


def publish(directory: str | Path, repo_id: str, private: bool = False, endpoint: str | None = None,
            token: str | None = None, commit_message: str = "Upload EAGLE draft head") -> str:
    """create_repo (exist_ok) + upload_folder; return the repo URL. Raises PublishError."""
    from huggingface_hub import HfApi, get_token

    directory = check_head_dir(directory)
    token = token or get_token()
    if not token:
        raise PublishError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (needs write access)")
    api = HfApi(endpoint=endpoint, token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(folder_path=str(directory), repo_id=repo_id, repo_type="model",
                          allow_patterns=UPLOADED, commit_message=commit_message)
    except Exception as e:  # HTTP errors, connection refused, DNS, timeouts: one line each
        raise PublishError(f"upload of {directory} to {repo_id} at {api.endpoint} failed: {_one_line(e)}") from None
    return str(url)


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.publish", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt_dir", help="an exported head folder (config.json + model.safetensors)")
    parser.add_argument("--repo-id", required=True, help="USER/NAME on the Hub")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or the public Hub)")
    parser.add_argument("--message", default="Upload EAGLE draft head")
    args = parser.parse_args(argv)
    try:
        url = publish(args.ckpt_dir, args.repo_id, private=args.private, endpoint=args.endpoint,
                      commit_message=args.message)
    except PublishError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())

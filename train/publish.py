"""Write an exported head in a serving engine's layout, and upload it to the Hugging Face Hub.

    python -m train.publish checkpoints/runs/NAME/head --format sglang             # writes .../head-sglang
    python -m train.publish HEAD --format eagle --out DIR --draft-vocab 12288     # its 12,288 most frequent tokens
    python -m train.publish HEAD --format speculators --target ORG/MODEL   # another name for the target
    python -m train.publish checkpoints/runs/NAME/head --repo-id USER/eagle-NAME [--format vllm] [--private]

`--format` is one of eagle/heads/formats.py's layouts (eagle, vllm, sglang, speculators); the folder
written gets a model card with that engine's serve command. Uploads use huggingface_hub's
create_repo + upload_folder. The endpoint is HF_ENDPOINT (or --endpoint); the token is HF_TOKEN
or the one saved by `hf auth login`. Failures (no token, no network, refused, a layout the head
cannot take) end in one line, not a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from eagle.heads.formats import FORMATS

REQUIRED = ("config.json", "model.safetensors")
UPLOADED = ["*.json", "*.safetensors", "*.md", "*.pt"]


class PublishError(RuntimeError):
    """A publishing failure explained in one line."""


def check_head_dir(directory: str | Path) -> Path:
    directory = Path(directory)
    missing = [f for f in REQUIRED if not (directory / f).exists()]
    if not directory.is_dir() or missing:
        raise PublishError(f"{directory}: not an exported head (missing {', '.join(missing) or 'directory'})")
    return directory


def convert(directory: str | Path, fmt: str, out: str | Path, repo_id: str | None = None,
            embedding_from: str | None = None, target: str | None = None, draft_vocab: int | None = None) -> Path:
    """The head of `directory` written to `out` in layout `fmt`, its card given the serve commands
    (its training stages, train/stages.py, go along).
    `target`: the name engines load the target by (a Hub id), recorded in the config (speculators'
    verifier) and used by the card's commands; default: the Hub id of the one the head was trained
    with (eagle/targets/resolve.py `hub_id`: a packaged alias becomes the Hub model it ships).
    `draft_vocab`: keep only the head's first N draft tokens (eagle/heads/draft_vocab.py `narrow`)."""
    from eagle.heads.checkpoint import load_head, save_head
    from eagle.heads.formats import FormatError
    from eagle.targets.resolve import hub_id
    from train.export import serving_card
    from train.stages import STAGES_FILE

    directory = check_head_dir(directory)
    head = load_head(directory)
    head.config.target = target or hub_id(head.config.target)  # config.target is a str ("" when unknown)
    card_path = directory / "README.md"
    card = card_path.read_text() if card_path.exists() else ""
    if draft_vocab is not None:
        card = _narrowed(head, draft_vocab, card, directory)
    card = serving_card(card, head, fmt, repo_id)
    extra = _target_embedding(embedding_from) if embedding_from else None
    stages = directory / STAGES_FILE
    files = {STAGES_FILE: stages.read_text()} if stages.is_file() else None
    try:
        return save_head(out, head, dtype=next(head.parameters()).dtype, card=card, fmt=fmt, extra=extra, files=files)
    except FormatError as e:
        raise PublishError(f"{directory} as {fmt}: {e}") from None


def _narrowed(head, size: int, card: str, directory: Path) -> str:
    """Narrow `head` to its first `size` draft tokens; the card's vocabulary lines say so."""
    from eagle.heads.draft_vocab import narrow

    before = None if head.draft_ids is None else head.draft_ids.numel()
    try:
        narrow(head, size)
    except ValueError as e:
        raise PublishError(f"{directory}: {e}") from None
    card = card.replace(f"{before}-token draft vocabulary", f"{size}-token draft vocabulary")
    line = (f"- Draft vocabulary: {size:,} tokens, the first (most frequent) of the {before:,} it trained with "
            f"(`python -m train.publish --draft-vocab {size}`)")
    return re.sub(r"^- Draft vocabulary: .*$", line, card, count=1, flags=re.M)


def _target_embedding(base: str) -> dict:
    """{"embed_tokens.weight": the target's input embedding}, for consumers that want it in the head."""
    from eagle.targets.resolve import load_target, resolve_target

    target = load_target(resolve_target(base), None)
    return {"embed_tokens.weight": target.get_input_embeddings().weight.detach()}


def publish(directory: str | Path, repo_id: str, private: bool = False, endpoint: str | None = None,
            token: str | None = None, commit_message: str = "Upload EAGLE draft head", fmt: str | None = None) -> str:
    """create_repo (exist_ok) + upload_folder, of the head in layout `fmt` (None: as it is);
    return the repo URL. Raises PublishError."""
    from huggingface_hub import HfApi, get_token

    directory = check_head_dir(directory)
    if fmt is not None and fmt != _format_of(directory):
        with tempfile.TemporaryDirectory() as tmp:
            out = convert(directory, fmt, Path(tmp) / "head", repo_id)
            return publish(out, repo_id, private, endpoint, token, commit_message)
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


def _format_of(directory: Path) -> str:
    import json

    return json.loads((directory / "config.json").read_text()).get("format", "eagle")


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.publish", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt_dir", help="an exported head folder (config.json + model.safetensors)")
    parser.add_argument("--repo-id", default=None, help="USER/NAME on the Hub (without it: only write the folder)")
    parser.add_argument("--format", default=None, choices=FORMATS,
                        help="serving layout (default: the folder's own); eagle/heads/formats.py says what each holds")
    parser.add_argument("--out", default=None, help="where to write the converted folder (default: CKPT_DIR-FORMAT)")
    parser.add_argument("--embedding-from", default=None, metavar="BASE",
                        help="speculators: also store the target's embedding (its own model does not take it "
                             "from the verifier)")
    parser.add_argument("--target", default=None, metavar="NAME",
                        help="the target's name in the written config and serve commands, e.g. its Hub id "
                             "(default: the Hub id of the one it was trained for)")
    parser.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                        help="keep only the head's N most frequent draft tokens (an EAGLE-3 head: and their lm_head "
                             "rows), for a smaller file; decoding drafts as with draft_vocab=N")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or the public Hub)")
    parser.add_argument("--message", default="Upload EAGLE draft head")
    args = parser.parse_args(argv)
    if args.repo_id is None and args.format is None:
        parser.error("say --format NAME (write a folder), --repo-id USER/NAME (upload), or both")
    try:
        if args.repo_id is None or args.out or args.embedding_from or args.target or args.draft_vocab is not None:
            fmt = args.format or _format_of(Path(args.ckpt_dir))
            out = args.out or f"{str(args.ckpt_dir).rstrip('/')}-{fmt}"
            written = convert(args.ckpt_dir, fmt, out, args.repo_id, args.embedding_from, args.target, args.draft_vocab)
            print(written)
            if args.repo_id is None:
                return 0
            args.ckpt_dir, args.format = written, None
        url = publish(args.ckpt_dir, args.repo_id, private=args.private, endpoint=args.endpoint,
                      commit_message=args.message, fmt=args.format)
    except PublishError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())

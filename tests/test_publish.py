"""Publishing through the real huggingface_hub client against a loopback fake of the Hub.

The fake implements the few endpoints create_repo + upload_folder use (repo creation,
preupload, commit with base64 "regular" files) on 127.0.0.1 and keeps what it receives.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle.common.distributed import free_port
from eagle.heads.checkpoint import save_head
from eagle.heads.eagle2 import DraftConfig, DraftHead
from train.publish import PublishError, main, publish

TOKEN = "hf_test_token_0123456789"


class FakeHub(BaseHTTPRequestHandler):
    """Minimal Hub API: POST /api/repos/create, /api/validate-yaml, /api/models/{repo}/preupload|commit/{rev}."""

    repos: dict[str, dict[str, bytes]]
    cards: list[str]
    unknown: list[str]

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        body = self._body()
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._reply(401, {"error": "Invalid credentials in Authorization header"})
        base = f"http://{self.headers['Host']}"
        if self.path == "/api/validate-yaml":  # model card metadata check
            self.cards.append(json.loads(body)["content"])
            return self._reply(200, {"errors": [], "warnings": []})
        if self.path == "/api/repos/create":
            req = json.loads(body)
            repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            self.repos.setdefault(repo, {})
            return self._reply(200, {"url": f"{base}/{repo}", "name": repo, "id": repo})
        parts = self.path.split("?")[0].split("/")  # ['', 'api', 'models', ns, name, op, rev]
        if len(parts) == 7 and parts[1:3] == ["api", "models"] and parts[5] in ("preupload", "commit"):
            repo = f"{parts[3]}/{parts[4]}"
            if repo not in self.repos:
                return self._reply(404, {"error": f"Repository {repo} not found"})
            if parts[5] == "preupload":
                files = json.loads(body)["files"]
                return self._reply(200, {"files": [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    self.repos[repo][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            return self._reply(200, {"commitUrl": f"{base}/{repo}/commit/{'a' * 40}", "commitOid": "a" * 40,
                                     "pullRequestUrl": None})
        self.unknown.append(f"POST {self.path}")
        return self._reply(404, {"error": "not implemented by the fake hub"})

    def do_GET(self) -> None:  # noqa: N802
        self.unknown.append(f"GET {self.path}")
        self._reply(404, {"error": "not implemented by the fake hub"})


@pytest.fixture
def hub():
    handler = type("Hub", (FakeHub,), {"repos": {}, "cards": [], "unknown": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.fixture
def head_dir(tmp_path) -> Path:
    cfg = DraftConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                      vocab_size=50, target="tiny")
    return save_head(tmp_path / "head", DraftHead(cfg), card="# tiny head\n")


@pytest.fixture
def no_saved_token(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def test_publish_uploads_head_through_hub_client(hub, head_dir, monkeypatch):
    endpoint, server = hub
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    url = publish(head_dir, "alice/eagle-tiny", endpoint=endpoint)
    assert url.endswith("alice/eagle-tiny")
    files = server.repos["alice/eagle-tiny"]
    assert sorted(files) == ["README.md", "config.json", "model.safetensors"], server.unknown
    assert files["model.safetensors"] == (head_dir / "model.safetensors").read_bytes()
    assert json.loads(files["config.json"])["target"] == "tiny"
    assert server.cards == ["# tiny head\n"]  # the client validated the model card


def test_cli_publish(hub, head_dir, monkeypatch, capsys):
    endpoint, server = hub
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert main([str(head_dir), "--repo-id", "bob/head", "--endpoint", endpoint]) == 0
    assert "bob/head" in capsys.readouterr().out
    assert "config.json" in server.repos["bob/head"]


def test_clear_error_without_token(head_dir, no_saved_token, capsys):
    with pytest.raises(PublishError, match="no Hugging Face token"):
        publish(head_dir, "alice/x", endpoint="http://127.0.0.1:9")
    assert main([str(head_dir), "--repo-id", "alice/x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no Hugging Face token") and len(err.strip().splitlines()) == 1


def test_clear_error_when_unreachable(head_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main([str(head_dir), "--repo-id", "alice/x", "--endpoint", dead]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: upload of") and "failed" in err and len(err.splitlines()) == 1


def test_rejected_token_is_one_line(hub, head_dir, monkeypatch, capsys):
    endpoint, _ = hub
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert main([str(head_dir), "--repo-id", "alice/x", "--endpoint", endpoint]) == 1
    err = capsys.readouterr().err.strip()
    assert "401" in err and len(err.splitlines()) == 1


def test_not_a_head_dir(tmp_path, capsys):
    assert main([str(tmp_path), "--repo-id", "alice/x"]) == 1
    assert "not an exported head" in capsys.readouterr().err


def test_training_with_hub_push_uploads_the_exported_head(hub, tmp_path, monkeypatch):
    """`hub.push=true hub.repo_id=...`: the run ends by uploading output_dir/head."""
    from hydra import compose, initialize_config_dir

    from tests.tiny import tiny_llama, write_tiny_store
    from train.run import run

    endpoint, server = hub
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    model = tiny_llama(seed=1)
    model.save_pretrained(tmp_path / "target")
    write_tiny_store(model, tmp_path / "store", records=12)
    conf = Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "+model=smollm2_135m", f"model.path={tmp_path / 'target'}", f"store_dir={tmp_path / 'store'}",
            f"output_dir={tmp_path / 'run'}", "wandb.mode=disabled", "train.max_steps=2", "train.batch_tokens=128",
            "train.progress=false", "train.tau_every=0", "hub.push=true", "hub.repo_id=carol/eagle-tiny",
            f"hub.endpoint={endpoint}",
        ])
    result = run(cfg)
    files = server.repos["carol/eagle-tiny"]
    assert files["model.safetensors"] == (result.head_dir / "model.safetensors").read_bytes()
    assert "carol/eagle-tiny" in files["README.md"].decode()  # the card's usage names the repo


def test_publish_narrows_a_head_to_its_most_frequent_draft_tokens(tmp_path, capsys):
    """`--draft-vocab N`: the written head keeps its first N draft tokens and, EAGLE-3, their lm_head rows, so
    it scores every state as the full head does with the decoder's draft_vocab=N; the card says so. More
    tokens than the head holds is a one-line error."""
    import torch

    from eagle.heads.checkpoint import load_head
    from eagle.heads.draft_vocab import DraftVocabulary
    from tests.tiny import random_eagle3_head, subset, tiny_llama

    target = tiny_llama(5, layers=4)
    save_head(tmp_path / "full", random_eagle3_head(target, layers=(1, 2, 3), vocab_ids=subset(128, 80, 2), seed=3),
              card="# head\n\nAn EAGLE-3 draft head (80-token draft vocabulary)\n\n- Draft vocabulary: 80 tokens\n")
    assert main([str(tmp_path / "full"), "--format", "eagle", "--out", str(tmp_path / "narrow"), "--draft-vocab", "48"]) == 0
    full, narrow = (load_head(tmp_path / d, dtype=torch.float32) for d in ("full", "narrow"))
    assert torch.equal(narrow.draft_ids, full.draft_ids[:48]) and narrow.config.draft_vocab_size == 48
    states = torch.randn(5, target.config.hidden_size)
    lm_head = target.get_output_embeddings()
    with torch.no_grad():
        torch.testing.assert_close(DraftVocabulary.of(narrow, lm_head).logp(states),
                                   DraftVocabulary.of(full, lm_head, 48).logp(states), rtol=0, atol=0)
    card = (tmp_path / "narrow" / "README.md").read_text()
    assert "(48-token draft vocabulary)" in card and "- Draft vocabulary: 48 tokens, the first (most frequent) of the 80" in card

    assert main([str(tmp_path / "full"), "--format", "eagle", "--out", str(tmp_path / "x"), "--draft-vocab", "81"]) == 1
    err = capsys.readouterr().err.strip()
    assert "draft_vocab=81" in err and len(err.splitlines()) == 1

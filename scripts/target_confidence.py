"""How sure is the target of its own greedy tokens, per prompt set? (docs/recipes.md, session 7)

    .venv/bin/python scripts/target_confidence.py [--per-category 2] [--sharegpt 16] [--max-new-tokens 128]

For MT-bench first turns and held-out ShareGPT first turns: decode greedily, then read the
target's top-1 probability at each new token. A flat target distribution would cap any
draft's acceptance; this tells whether a prompt set is harder for the target or for the head.
It also counts the new tokens that copy the prompt: the token follows the same two tokens
somewhere in the prompt (what a head, or prompt lookup, predicts easily).
"""

import argparse
import statistics

import torch

from eagle.bench import first_per_category, load_questions, sharegpt_heldout
from eagle.targets import load_target, load_tokenizer, resolve_target


@torch.inference_mode()
def reply_stats(model, tok, prompt: str, max_new_tokens: int) -> tuple[list[float], list[bool]]:
    """Per new token: the target's top-1 probability, and whether it copies a prompt trigram."""
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]  # [1, P]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)  # [1, P + N]
    probs = model(out).logits[0, ids.shape[1] - 1:-1].float().softmax(-1)  # [N, V]: the step that chose each new token
    seq, P = out[0].tolist(), ids.shape[1]
    trigrams = {tuple(seq[i:i + 3]) for i in range(P - 2)}
    copied = [tuple(seq[j - 2:j + 1]) in trigrams for j in range(P, len(seq))]
    return probs.max(-1).values.tolist(), copied


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="smollm2-135m-instruct")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--sharegpt", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = resolve_target(args.base)
    tok, model = load_tokenizer(target_dir), load_target(target_dir, "bfloat16")
    sets = {"mtbench": first_per_category(load_questions("mtbench"), args.per_category),
            "sharegpt-heldout": sharegpt_heldout(args.sharegpt)}
    for name, questions in sets.items():
        stats = [reply_stats(model, tok, q.turns[0], args.max_new_tokens) for q in questions]
        p = [x for probs, _ in stats for x in probs]
        copied = [c for _, cs in stats for c in cs]
        print(f"{name}: {len(questions)} prompts, {len(p)} tokens; top-1 probability mean {statistics.mean(p):.3f}, "
              f"median {statistics.median(p):.3f}; share > 0.9: {sum(x > 0.9 for x in p) / len(p):.3f}; "
              f"share < 0.5: {sum(x < 0.5 for x in p) / len(p):.3f}; copies a prompt trigram: {sum(copied) / len(copied):.3f}")


if __name__ == "__main__":
    main()

"""How sure is the target of its own greedy tokens, per prompt set? (docs/findings.md)

    python -m experiments.target_confidence [--per-category 2] [--sharegpt 16] [--max-new-tokens 128]

For MT-bench first turns and held-out ShareGPT first turns: decode greedily, then read the
target's top-1 probability at each new token. A flat target distribution would cap any
draft's acceptance; this tells whether a prompt set is harder for the target or for the head.
It also counts the new tokens that copy the prompt: the token follows the same two tokens
somewhere in the prompt (what a head, or prompt lookup, predicts easily).
"""

from __future__ import annotations

import statistics

import torch

from experiments.diagnostic_prompts import first_turn_ids, parser, setup


@torch.inference_mode()
def reply_stats(model, tok, question, max_new_tokens: int) -> tuple[list[float], list[bool]]:
    """Per new token: the target's top-1 probability, and whether it copies a prompt trigram."""
    ids = first_turn_ids(tok, question)  # [1, P]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)  # [1, P + N]
    probs = model(out).logits[0, ids.shape[1] - 1:-1].float().softmax(-1)  # [N, V]: the step that chose each new token
    seq, P = out[0].tolist(), ids.shape[1]
    trigrams = {tuple(seq[i:i + 3]) for i in range(P - 2)}
    copied = [tuple(seq[j - 2:j + 1]) in trigrams for j in range(P, len(seq))]
    return probs.max(-1).values.tolist(), copied


def main() -> None:
    args = parser(__doc__, "python -m experiments.target_confidence").parse_args()
    tok, model, sets = setup(args)
    for name, questions in sets.items():
        stats = [reply_stats(model, tok, q, args.max_new_tokens) for q in questions]
        p = [x for probs, _ in stats for x in probs]
        copied = [c for _, cs in stats for c in cs]
        print(f"{name}: {len(questions)} prompts, {len(p)} tokens; top-1 probability mean {statistics.mean(p):.3f}, "
              f"median {statistics.median(p):.3f}; share > 0.9: {sum(x > 0.9 for x in p) / len(p):.3f}; "
              f"share < 0.5: {sum(x < 0.5 for x in p) / len(p):.3f}; copies a prompt trigram: {sum(copied) / len(copied):.3f}")


if __name__ == "__main__":
    main()

"""Training-time test: pass i of the unrolled head equals a depth-(i+1) draft at inference."""

import pytest
import torch

from eagle.heads.eagle2 import DraftConfig, DraftHead
from tests.tiny import tiny_llama
from train.unroll import unroll_mask, unrolled_forward


def test_mask_pattern():
    allowed = unroll_mask(4, 2, torch.float32)[0, 0] == 0  # [4, 12]
    # row 3, pass 2: K0 rows <= 1, K1 row 2, K2 row 3
    assert allowed[3].nonzero().flatten().tolist() == [0, 1, 4 + 2, 8 + 3]
    assert allowed[0].nonzero().flatten().tolist() == [8]  # row 0 sees only itself (no committed rows)


def head_and_inputs(kind: str):
    """(head, width of its committed-row inputs): EAGLE-1/2 reads H-wide features, EAGLE-3 the
    three fused layers (3H wide) on committed rows and its own H-wide states on draft rows."""
    torch.manual_seed(0)
    if kind.startswith("eagle2"):  # "eagle2x2": two decoder layers
        cfg = DraftConfig.from_target_config(tiny_llama(0).config)
        cfg.num_hidden_layers = int(kind.partition("x")[2] or 1)
        head = DraftHead(cfg).eval()
        return head, head.config.hidden_size
    from tests.tiny import random_eagle3_head

    head = random_eagle3_head(tiny_llama(0), layers=(0, 1, 2), seed=1, num_hidden_layers=int(kind.partition("x")[2] or 1))
    return head, 3 * head.config.hidden_size


@pytest.mark.parametrize("kind", ["eagle2", "eagle2x2", "eagle3", "eagle3x2"])
@pytest.mark.parametrize("steps", [2, 3])
def test_unrolled_pass_equals_inference_chain(steps, kind):
    head, width = head_and_inputs(kind)
    b, s, h = 2, 9, head.config.hidden_size
    feats, embeds = torch.randn(b, s, width), torch.randn(b, s, h)
    pos = torch.arange(s).expand(b, -1)
    with torch.no_grad():
        outs = unrolled_forward(head, feats, embeds, pos, steps, detach=not kind.startswith("eagle3"))
        for i in range(1, steps):
            for j in range(i, s):
                c = j - i + 1  # committed rows 0 .. j-i (true features)
                out, past = head(feats[:, :c], embeds[:, :c], pos[:, :c])
                cur = out[:, -1:]  # depth-1 prediction of the feature at row c
                for r in range(c, j + 1):  # draft rows of depth 2 .. i+1, each on the previous prediction
                    cur, past = head(cur, embeds[:, r:r + 1], pos[:, r:r + 1], None, past)
                torch.testing.assert_close(outs[i][:, j], cur[:, 0], rtol=1e-5, atol=1e-5)

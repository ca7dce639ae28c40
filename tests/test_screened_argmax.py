"""experiments.screened_argmax: the screen by quantized rows keeps the exact argmax, near-ties included, and the
decoder's screened lm_head (where the CPU screens) picks the same argmax at a near-tie."""

import pytest
import torch

from experiments.screened_argmax import candidates, decoder_screen, quantize, rounded_inputs


def _rows(vocab: int = 512, width: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16-valued lm_head [V, H] with rows 1 and 2 a rounding step apart, and hidden states [M, H] that make
    rows 1 and 2 the two best for the first half of them."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(vocab, width, generator=gen) * 0.05).bfloat16().float()
    w[2] = w[1]
    w[2, 0] += w[1, 0].abs() * 2 ** -7  # about one bf16 step on the first input
    hidden = torch.randn(16, width, generator=gen)
    hidden[:8] += 40 * w[1]  # rows 1 and 2 lead by far; between them, the first input decides
    return w, hidden


@pytest.mark.parametrize("bits,group", [(8, None), (8, 16), (4, 16)])
def test_the_screen_keeps_the_argmax_and_drops_most_rows(bits, group):
    w, hidden = _rows()
    q, scale = quantize(w, bits, group)
    kept = candidates(hidden, w, q, scale)  # [M, V]
    exact = (hidden @ w.T).argmax(-1)
    assert bool(kept[torch.arange(len(hidden)), exact].all())
    assert bool(kept[:8, 1].all() and kept[:8, 2].all())  # the near-tie stays for the exact logits to decide
    if bits == 8:
        assert float(kept.sum(-1).float().mean()) < w.shape[0] / 4


@pytest.mark.parametrize("bits,apart", [(16, 0), (7, 4)])
def test_rounded_inputs_keep_the_argmax(bits, apart):
    w, hidden = _rows()
    hidden[8:, 5] *= 30  # an outlier channel in the rows without the near-tie
    q, scale = quantize(w, 8, None)
    kept = rounded_inputs(hidden, w, q, scale[:, 0], bits, apart)
    assert bool(kept[torch.arange(len(hidden)), (hidden @ w.T).argmax(-1)].all())
    assert bool(kept[:8, 1].all() and kept[:8, 2].all())


def test_the_decoders_screen_picks_the_exact_argmax_at_a_near_tie():
    w, hidden = _rows()
    call = decoder_screen(w)
    if call is None:
        pytest.skip("the decoder screens on AVX2 CPUs without bf16 arithmetic, the GEMV kernel built")
    for m in (1, 2):
        exact = call(hidden[:m].contiguous(), False)  # [m, V]
        logits = call(hidden[:m].contiguous(), True)
        assert torch.equal(logits.argmax(-1), exact.argmax(-1))
        assert torch.equal(logits.argmax(-1), (hidden[:m] @ w.T).argmax(-1))
        finite = logits.isfinite()
        assert finite[:, 1].all() and finite[:, 2].all() and torch.equal(logits[finite], exact[finite])

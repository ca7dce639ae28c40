"""experiments.screened_argmax: the screen by quantized rows keeps the exact argmax, near-ties included, and the
prototype kernel (where it builds) picks the same argmax from its int8 pairs."""

import pytest
import torch

from experiments.screened_argmax import candidates, prototype, prototype_args, quantize, rounded_inputs


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


def test_the_prototype_kernel_picks_the_exact_argmax():
    ext = prototype()
    if ext is None:
        pytest.skip("the prototype is AVX2 code for CPUs without bf16 arithmetic, built by a compiler")
    w, hidden = _rows()
    for form, rest in prototype_args(w).items():
        for m in (1, 3, 8, 16):
            logits = getattr(ext, form)(hidden[:m].contiguous(), *rest)  # [m, V]
            assert torch.equal(logits.argmax(-1), (hidden[:m] @ w.T).argmax(-1)), form
            finite = logits.isfinite()
            assert torch.allclose(logits[finite], (hidden[:m] @ w.T)[finite], rtol=1e-5, atol=1e-5)

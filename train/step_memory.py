"""Device memory per rank of one training step, for plan=true (train/training_plan.py).

    shape = StepShape(...)        # the sizes a step's memory depends on
    memory = step_memory(shape)   # StepMemory: bytes by what holds them, and the peak

A micro-step peaks where the forward over `train.ttt_steps` passes has ended and the losses run
(train/trainer.py micro_step): every pass keeps its saved tensors for the one backward (train/unroll.py).
Over T = batch_tokens rows, S = model.max_len, compute element e (bf16: 2), fp32 f = 4:

- the head's states: bf16 weights and gradients, fp32 master weights, Adam's two moments (DeepSpeed's
  bf16 optimizer at ZeRO-0: 16 bytes per parameter, fp32 alike; Muon's matrices keep one moment: 12);
  ZeRO-1/2 shard the fp32 master weights and moments over `plan_gpu.ranks`, ZeRO-3 all of it (plus
  the gathered weights and their gradients while it runs); a frozen lm_head holds its weights only;
- frozen matrices: the target's embed and lm_head (online: inside the target's weights when its
  dtype is the compute dtype) and the copy of the draft vocabulary's lm_head rows;
- the micro-batch: the head's input features, the target's last layer, the token embeddings;
- per pass: each RMSNorm's fp32 input and normed rows (EAGLE-3: the feature's and the
  post-attention one, and the embedding's normed rows; EAGLE-1/2: the post-attention one), the
  layer's input, the rotated queries, the attention output, the MLP's four I-wide tensors, the
  pass's output; its keys and values (pass i >= 1: repeated per query head over
  (i+1)·S keys, eagle/heads/eagle2.py `attend`) and its additive mask [S, (i+1)·S];
- the loss over (at most) T rows: the target's distribution over the draft rows (fp32), then the
  larger of its working set (bf16 logits over the whole vocabulary, before any pass's loss) and what
  the passes' losses save (the draft's fp32 log-softmax and its normed states; EAGLE-1/2: the fp32
  SmoothL1 operands) with the two fp32 gradients of one pass's logits at the start of the backward.

The optimizer step comes after the backward freed the activations: its fp32 gradients and foreach
temporaries (12 bytes per parameter) are compared with the activations, not added. Online, the
target's forward (inference mode) runs before the head's and is compared in the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

FP32 = 4
STEP_BYTES = 12  # per parameter during the optimizer step: fp32 gradients and Adam's foreach temporaries


@dataclass
class StepShape:
    tokens: int  # T: train.batch_tokens
    seq: int  # S: model.max_len, the longest row
    passes: int  # train.ttt_steps
    hidden: int
    intermediate: int
    attention_width: int  # heads x head_dim
    kv_width: int  # key/value heads x head_dim
    input_width: int  # the head's input features: H (EAGLE-1/2) or K·H (EAGLE-3's fused layers)
    store_width: int  # features a batch carries: the last layer and EAGLE-3's fused ones
    draft_rows: int  # rows of the token loss: the draft vocabulary
    frozen_rows: int  # rows of the target's lm_head plus embedding (one matrix when tied: V, else 2V)
    loss_copy_rows: int  # the draft vocabulary's lm_head rows the trainer copies (0: it uses the whole matrix)
    vocab: int  # V: the target distribution is computed over the whole vocabulary first
    head_params: int
    eagle3: bool
    noise: bool  # train.noise > 0: the noised copy of the input features
    element: int  # compute dtype bytes
    store_element: int  # the features' dtype bytes
    zero_stage: int
    ranks: int  # plan_gpu.ranks: what ZeRO-1/2/3 shard over
    frozen_head_params: int = 0  # of head_params, out of the optimizer (a frozen EAGLE-3 lm_head)
    muon_params: int = 0  # of head_params, stepped by Muon (one fp32 moment, not Adam's two)


@dataclass
class StepMemory:
    """Bytes per rank of one training step; `peak` adds the larger working set to what stays."""

    states: float  # head weights, gradients, optimizer states
    frozen: float  # embed/lm_head and the loss's lm_head rows
    target: float  # online: the target's weights
    batch: float
    passes: float  # saved activations of all passes, with...
    keys_values: float  # ...their keys/values and
    masks: float  # ...their masks
    loss: float  # saved by the losses, and the largest transient of the loss or the backward's start
    optimizer_step: float  # the optimizer step's extra (compared with batch + passes + loss)
    target_forward: float = 0.0  # online: the target's forward before the head's (compared likewise)

    @property
    def working(self) -> float:
        return max(self.batch + self.passes + self.loss, self.optimizer_step, self.batch + self.target_forward)

    @property
    def peak(self) -> float:
        return self.states + self.frozen + self.target + self.working


def state_bytes(s: StepShape) -> float:
    """Head weights, gradients and optimizer states per rank: 16 bytes per trained parameter unsharded
    (12 under Muon), and the weights alone of frozen ones."""
    trained = s.head_params - s.frozen_head_params
    optimizer = 12 * trained - FP32 * s.muon_params  # fp32 master weights and the moments
    frozen = s.frozen_head_params * s.element
    if s.zero_stage >= 3:
        return (4 * trained + optimizer + frozen) / s.ranks + 4 * trained
    if s.zero_stage >= 1:
        return 4 * trained + optimizer / s.ranks + frozen
    return 4 * trained + optimizer + frozen


def step_memory(s: StepShape) -> StepMemory:
    e, t = s.element, s.tokens
    keys_values = sum(_kv_bytes(s, i) for i in range(s.passes))
    masks = sum(s.seq * (i + 1) * s.seq * e for i in range(1, s.passes))
    passes = s.passes * t * _per_pass_width(s) + keys_values + masks
    batch = t * (s.store_width * s.store_element + s.hidden * e + (s.input_width * e if s.noise else 0))
    frozen = (s.frozen_rows + s.loss_copy_rows) * s.hidden * e
    step = (s.head_params - s.frozen_head_params) * STEP_BYTES / (1 if s.zero_stage == 0 else s.ranks)
    return StepMemory(state_bytes(s), frozen, 0.0, batch, passes, keys_values,
                      masks, _loss_bytes(s), step)


def _per_pass_width(s: StepShape) -> int:
    """Bytes per row that one pass saves for the backward, keys/values and mask aside."""
    e, h = s.element, s.hidden
    norms = (FP32 + e) * h  # the post-attention norm
    if s.eagle3:  # the feature's norm, and the embedding's (no gradient into its input: only the normed rows)
        norms += (FP32 + e) * h + e * h
    layer_input = (2 * h if s.eagle3 else 3 * h) * e  # EAGLE-3: [embedding | feature]; else fc's input and output
    attention = 2 * s.attention_width * e  # rotated queries, the output (its [B, S, heads·D] view feeds o_proj)
    mlp = 4 * s.intermediate * e
    outputs = 2 * h * e  # the post-attention norm's output, the pass's output
    return norms + layer_input + attention + mlp + outputs


def _kv_bytes(s: StepShape, i: int) -> int:
    """Keys and values pass i keeps: grouped over its own rows (pass 0, causal), else per query head over (i+1)·S."""
    if i == 0:
        return 2 * s.tokens * s.kv_width * s.element
    return 2 * (i + 1) * s.tokens * s.attention_width * s.element


def _loss_bytes(s: StepShape) -> float:
    e, n, d = s.element, s.tokens, s.draft_rows
    target = n * d * FP32  # the target distribution over the draft rows
    per_pass = n * d * FP32 + n * s.hidden * ((FP32 + 2 * e) if s.eagle3 else (e + 2 * FP32))
    forming = n * d * (e + FP32)  # the logits over the draft rows and their fp32 copy
    if s.eagle3:  # its distribution starts over the whole vocabulary (the target's argmax) and keeps the draft rows
        forming += n * s.vocab * e
    backward = n * d * 2 * FP32  # the backward starts at the last pass's loss: fp32 gradients of logp and logits
    return target + max(forming, s.passes * per_pass + backward)  # the distribution comes before the passes' losses

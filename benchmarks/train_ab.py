"""qkv's training step with and without one of its CPU speed-ups, interleaved.

Two copies of the benchmark model with the same initial weights take turns, step by step, on
the same Multi30k-shaped batches (who goes first alternates) and the same dropout masks, each
with its own optimiser; everything else is qkv's training step (`QkvSystem.loss`, fused
AdamW, `tune_allocator`). The "off" way undoes one change (`--change`):

- `linear`: every linear layer is `F.linear` (MKL) instead of oneDNN's products
  (`qkv.model.linear`);
- `attention`: attention in training always takes the fused kernel,
  `F.scaled_dot_product_attention`, instead of two matmuls and a softmax for short
  sentences (`qkv.model.attention.short_attention`);
- `optimizer`: AdamW's `foreach` path instead of its fused kernel
  (`qkv.training.optimizer.adamw`);
- `packed`: packed rows at exactly the real-token count, and attention through autograd's
  unpacking around `short_attention`, instead of rows rounded up to the linear layers' counts
  (`qkv.model.packing`) and attention from rows to rows (`qkv.model.packed_attention`);
- `grouped`: attention over one grid padded to the batch's longest sentence instead of
  sentences sorted by length into groups, each padded to its own longest (`qkv.model.grid`);
- `dropout`: dropout's multiplier made as a bool mask, then cast, instead of the comparison
  writing floats (`qkv.model.dropout`; both ways with torch's words, not hashed ones);
- `draws`: dropout's random words drawn from a range one short of 2⁶⁴ (a modulo per draw)
  instead of the full 64-bit range (`qkv.model.dropout._slices`; both ways with torch's
  words);
- `hashed`: dropout's words from torch's generator and its multiplier kept for the backward,
  instead of SplitMix64's words hashed from one seed inside a compiled loop, twice
  (`qkv.model.dropout._HashedDropout`);
- `loss`: `F.cross_entropy` instead of the label-smoothed loss's two compiled kernels
  (`qkv.training.fused_loss`);
- `ffn`: the feed-forward network's first linear layer, ReLU and dropout as three layers
  instead of one step each way (`qkv.model.fused_ffn`);
- `transpose`: the operand that the weights' gradients take transposed copied by eager torch
  instead of a compiled loop (`qkv.model.linear.transposed`);
- `wide`: the input's gradient of a layer of `WIDE` outputs or more (the output layer)
  multiplied by a transposed view of the weight instead of a transposed copy
  (`qkv.model.linear._as_input_grad_weight`);
- `rounding`: row counts rounded up to 8 steps per doubling instead of 16
  (`qkv.model.linear.padded_rows`);
- `overwrite`: the loss's backward writes the logits' gradient into a new block instead of
  over the logits (`qkv.training.fused_loss`, `overwrite`);
- `softmax`: attention's softmax and its gradient over rows shorter than a vector by torch's
  kernels instead of compiled loops (`qkv.model.short_softmax`).

Prints the target tokens per second of each way, their ratio, the median ratio of paired
steps, and each way's last loss (equal up to float rounding).

    python benchmarks/train_ab.py --change linear [--threads 2] [--steps 20] [--shape base]
        [--bucketed]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from phases import build, n_targets, train_batches
from qkv_side import bucketed_batches
from workload import SHAPES

import qkv.model.attention as qkv_attention
import qkv.model.dropout as qkv_dropout
import qkv.model.fused_ffn as qkv_fused_ffn
import qkv.model.grid as qkv_grid
import qkv.model.linear as qkv_linear
import qkv.model.packed_attention as qkv_packed_attention
import qkv.model.packing as qkv_packing
import qkv.model.short_softmax as qkv_short_softmax
from qkv.training import fused_loss as qkv_fused_loss
from qkv.training.speed import tune_allocator

CHANGES = {
    "linear": "oneDNN linear layers (off: F.linear)",
    "attention": "unfused attention for short sentences (off: the fused kernel)",
    "optimizer": "AdamW's fused kernel (off: its foreach path)",
    "packed": "rounded packed rows, attention from rows to rows (off: exact rows, autograd's)",
    "dropout": "dropout's mask compared into floats (off: a bool mask, then cast)",
    "grouped": "attention grouped by sentence length (off: one group, padded to the longest)",
    "draws": "dropout's words over the full 64-bit range (off: a range one short, a modulo)",
    "loss": "the smoothed loss as two compiled kernels (off: F.cross_entropy)",
    "ffn": "the first linear layer, ReLU and dropout as one step each way (off: three layers)",
    "hashed": "dropout hashed in a compiled loop (off: torch's words, a kept multiplier)",
    "transpose": "weight gradients' operands transposed in a compiled loop (off: eager copies)",
    "wide": "the output layer's input gradient by a transposed copy of the weight (off: a view)",
    "rounding": "row counts rounded to 16 steps per doubling (off: 8)",
    "overwrite": "the logits' gradient written over the logits (off: into a new block)",
    "softmax": "short rows' softmax in compiled loops (off: torch's kernels)",
}


@contextmanager
def _swapped(owner: Any, **values: Any) -> Iterator[None]:
    """`owner`'s attributes set to `values` for the duration, then put back."""
    kept = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in kept.items():
            setattr(owner, name, value)


@contextmanager
def _packed_off() -> Iterator[None]:
    with (
        _swapped(qkv_packing, padded_rows=_exact),
        _swapped(qkv_attention, packed_attention_applies=_never),
    ):
        yield


def _dropout_through_bools(x: torch.Tensor, p: float) -> torch.Tensor:
    """`qkv.model.dropout.dropout` with the same draws, its multiplier a bool mask cast."""
    levels, all_levels = qkv_dropout.dropped_levels(p), qkv_dropout._LEVELS
    if levels in (0, all_levels):
        return x if levels == 0 else x * 0.0
    kept = qkv_dropout._slices(x.shape, x.device) >= qkv_dropout._threshold(p)
    return x * kept.to(x.dtype).mul_(all_levels / (all_levels - levels))


def _slices_by_modulo(shape: torch.Size, device: torch.device | None) -> torch.Tensor:
    """`qkv.model.dropout._slices` drawing from [-2⁶³, 2⁶³ - 1), as it did before: each word
    reduced by a 64-bit modulo and shifted by -2⁶³, i.e. the same words with their top bit
    flipped (other masks, from the same distribution)."""
    count = shape.numel()
    bits = torch.empty((count + 3) // 4, dtype=torch.int64, device=device)
    bits.random_(-(1 << 63), (1 << 63) - 1)
    return bits.view(torch.int16)[:count].view(shape)


def _hashed_off() -> Any:
    """Dropout's words from torch's generator, not hashed in the compiled loop."""
    return _swapped(qkv_dropout, _hashed_applies=_never)


_OFF: dict[str, Callable[[], Any]] = {
    "linear": lambda: _swapped(qkv_linear, applies=_never),
    # every sentence counts as long: the fused kernel
    "attention": lambda: _swapped(qkv_packed_attention, SHORT=-1),
    "optimizer": nullcontext,  # the off way differs in its optimiser alone
    "packed": _packed_off,
    "dropout": lambda: _swapped(qkv_dropout, dropout=_dropout_through_bools),
    "grouped": lambda: _swapped(qkv_grid, MAX_GROUPS=1),
    "draws": lambda: _swapped(qkv_dropout, _slices=_slices_by_modulo),
    "loss": lambda: _swapped(qkv_fused_loss, applies=_never),
    "hashed": _hashed_off,
    "ffn": lambda: _swapped(qkv_fused_ffn, applies=_never),
    "transpose": lambda: _swapped(qkv_linear, transposed=_eager_transpose),
    "wide": lambda: _swapped(qkv_linear, _as_input_grad_weight=torch.Tensor.t),
    "rounding": lambda: _swapped(qkv_linear, STEPS_PER_DOUBLING=8),
    "overwrite": lambda: _swapped(qkv_fused_loss, _in_place_kernel=lambda: None),
    "softmax": lambda: _swapped(qkv_short_softmax, SHORT_ROW=0),
}


def undone(change: str) -> Any:
    """A context in which `change` (a name of `CHANGES`) is undone: its "off" way."""
    return _OFF[change]()


# What both ways do for a change that concerns a path qkv no longer takes by default.
_BOTH: dict[str, Callable[[], Any]] = {
    "dropout": _hashed_off,
    "draws": _hashed_off,
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the comparison; return target tokens per second of each way and the losses."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--change", choices=sorted(CHANGES), required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shape", choices=["base", "tiny"], default="base")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-tokens", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--bucketed", action="store_true", help="qkv's own bucketed batches of the same sentences"
    )
    args = parser.parse_args(argv)
    args.device, args.dtype = "cpu", "fp32"
    torch.set_num_threads(args.threads)
    tune_allocator()
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    systems = {"on": build("qkv", shape), "off": build("qkv", shape)}
    systems["off"].model.load_state_dict(systems["on"].model.state_dict())
    optimizers = {name: system.optimizer(args.lr) for name, system in systems.items()}
    if args.change == "optimizer":
        settings = optimizers["on"].defaults  # the trainer's
        assert settings["fused"]
        same = {key: settings[key] for key in ("lr", "betas", "eps", "weight_decay")}
        optimizers["off"] = torch.optim.AdamW(
            systems["off"].model.parameters(), **same, foreach=True
        )
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    losses: dict[str, float] = {}
    batches = train_batches(args, shape)
    if args.bucketed:
        batches = [
            {"src": b.src, "tgt_in": b.tgt_in, "labels": b.labels}
            for b in bucketed_batches(
                [{k: v.numpy() for k, v in b.items()} for b in batches], args.seed
            )
        ]
    for i, batch in enumerate(batches):
        for name in sorted(systems, reverse=i % 2 == 1):
            system, optimizer = systems[name], optimizers[name]
            system.model.train()
            torch.manual_seed(args.seed + i)  # the same dropout masks for both ways
            with (
                _BOTH.get(args.change, nullcontext)(),
                undone(args.change) if name == "off" else nullcontext(),
            ):
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss = system.loss(batch["src"], batch["tgt_in"], batch["labels"])
                loss.backward()
                optimizer.step()
                seconds[name].append(time.perf_counter() - start)
            losses[name] = float(loss.detach())
    tokens = n_targets(batches[args.warmup :])
    timed = {name: s[args.warmup :] for name, s in seconds.items()}
    rate = {name: tokens / sum(s) for name, s in timed.items()}
    pairs = statistics.median(a / b for a, b in zip(timed["off"], timed["on"], strict=True))
    print(
        f"{CHANGES[args.change]}: on {rate['on']:,.0f} tok/s, off {rate['off']:,.0f} tok/s: "
        f"on / off {rate['on'] / rate['off']:.3f} (median pair {pairs:.3f}); "
        f"last loss {losses['on']:.4f} and {losses['off']:.4f}"
    )
    return {"tokens_per_s": rate, "median_pair_ratio": pairs, "last_loss": losses}


def _eager_transpose(rows: torch.Tensor) -> torch.Tensor:
    return rows.t().contiguous()


def _never(*_: object) -> bool:
    return False


def _exact(count: int) -> int:
    return count


if __name__ == "__main__":
    main()

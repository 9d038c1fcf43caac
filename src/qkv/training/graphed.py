"""Training steps recorded once per batch shape as a CUDA graph, then replayed in one launch.

A step takes inputs padded to a few bucket shapes (`qkv.data.batching.bucket_inputs`), never
waits for the device (the learning rate is a device tensor; AdamW's fused kernel skips a
non-finite step through its `found_inf` flag), and zeroes its gradients in place.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from qkv.fast.graphs import record

Inputs = dict[str, Tensor]
LossFn = Callable[[Inputs], tuple[Tensor, Tensor]]  # -> summed loss, number of targets


class GraphedStep:
    """One optimiser step per call, replayed from the CUDA graph of the inputs' shape.

    `optimizer` must be a fused AdamW, which can skip an update on the device. `graph` (by
    default: on a CUDA device) records graphs; without, the same step runs eagerly, as in the
    CPU tests. Shapes beyond `MAX_GRAPHS` run eagerly."""

    MAX_GRAPHS = 64

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss: LossFn,
        max_norm: float = math.inf,
        autocast_dtype: torch.dtype | None = None,
        graph: bool | None = None,
    ) -> None:
        if not all(group.get("fused") for group in optimizer.param_groups):
            raise ValueError("a graphed step needs an optimiser with a fused kernel")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device
        self.optimizer, self.loss = optimizer, loss
        self.max_norm, self.autocast_dtype = max_norm, autocast_dtype
        self.record = self.device.type == "cuda" if graph is None else graph
        self.graphs: dict[tuple[Any, ...], tuple[torch.cuda.CUDAGraph, Inputs]] = {}
        self.pool: Any = None  # the memory pool the graphs share, from the first one
        # 0-dim outputs, outside the graphs' pool: written by every step, read after it
        self.loss_sum = torch.zeros((), device=self.device)
        self.norm = torch.zeros((), device=self.device)
        self.found_inf = torch.zeros((), device=self.device)  # 1.0: the update is skipped
        self.lr = torch.zeros((), device=self.device)
        self.optimizer.found_inf = self.found_inf  # type: ignore[attr-defined]

    def step(self, inputs: Inputs, lr: float) -> tuple[Tensor, Tensor]:
        """Train on one batch (on the model's device, at a bucket shape) at learning rate
        `lr`; returns the summed loss and the gradient norm before clipping, 0-dim tensors the
        next step overwrites. When either is not finite, the weights are left unchanged."""
        self._set_lr(lr)
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(inputs.items()))
        if key in self.graphs:
            graph, static = self.graphs[key]
            for name, tensor in inputs.items():
                static[name].copy_(tensor)
            graph.replay()
        elif self.record and len(self.graphs) < self.MAX_GRAPHS:
            static = {name: tensor.clone() for name, tensor in inputs.items()}
            # The shape's first step runs eagerly (lazy initialisation, such as the gradients
            # and the optimiser's state, must happen outside a capture); it is a real step.
            graph, _ = record(lambda: self._body(static), self.device, self.pool, warmups=1)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[key] = (graph, static)
        else:
            self._body(inputs)
        return self.loss_sum, self.norm

    def _set_lr(self, lr: float) -> None:
        """A recorded step reads the learning rate from `self.lr`; an eager one from the group."""
        self.lr.fill_(lr)
        for group in self.optimizer.param_groups:
            if self.record:
                group["lr"], group["capturable"] = self.lr, True
            else:
                group["lr"] = lr

    def _body(self, inputs: Inputs) -> None:
        """Forward, backward, clipping and the optimiser step, with no host sync."""
        self.optimizer.zero_grad(set_to_none=False)
        with self._autocast():
            loss_sum, count = self.loss(inputs)
        (loss_sum / count.clamp(min=1)).backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.loss_sum.copy_(loss_sum.detach())
        self.norm.copy_(norm)
        self.found_inf.copy_((~(loss_sum.isfinite() & norm.isfinite())).float())
        self.optimizer.step()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast without its cache of cast weights: a graph must hold no cached casts."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, self.autocast_dtype, cache_enabled=False)

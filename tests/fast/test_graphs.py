"""Recording CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from qkv.fast.graphs import record


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_recorded_graph_replays_on_new_inputs() -> None:
    device = torch.device("cuda")
    x = torch.ones(4, device=device)
    graph, out = record(lambda: x * 2, device)
    x.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.full((4,), 6.0))

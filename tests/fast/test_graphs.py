"""Recording CUDA graphs: on a CPU the helpers just run the work."""

from __future__ import annotations

import pytest
import torch

from qkv.fast.graphs import on_side_stream, record


def test_on_a_cpu_the_side_stream_block_just_runs() -> None:
    ran = []
    with on_side_stream(torch.device("cpu")):
        ran.append(torch.ones(2).sum().item())
    assert ran == [2.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_recorded_graph_replays_on_new_inputs() -> None:
    device = torch.device("cuda")
    x = torch.ones(4, device=device)
    graph, out = record(lambda: x * 2, device)
    x.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.full((4,), 6.0))

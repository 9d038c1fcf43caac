"""A tiny model must learn to copy and to reverse short sequences."""

import pytest
import torch
import torch.nn.functional as F

from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import tiny_config

BOS, EOS = 1, 2


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_tiny_model_learns_the_task(task: str) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=16, d_model=64, d_ff=128, n_heads=4))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
    # Decayed to zero: at a constant rate Adam's loss can spike in the last steps, at a step
    # that depends on float rounding (the CPU's kernels, the number of threads).
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / 300)
    batch, length = 64, 6

    def make_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        src = torch.randint(5, 16, (batch, length))
        out = src if task == "copy" else src.flip(1)
        tgt_in = torch.cat([torch.full((batch, 1), BOS), out], dim=1)
        labels = torch.cat([out, torch.full((batch, 1), EOS)], dim=1)
        return src, tgt_in, labels

    for _ in range(300):
        src, tgt_in, labels = make_batch()
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    src, tgt_in, labels = make_batch()
    with torch.no_grad():
        accuracy = (model(src, tgt_in).argmax(-1) == labels).float().mean().item()
    assert accuracy > 0.97, accuracy

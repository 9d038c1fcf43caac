import pytest
import torch

from qkv.model.classifier import TextClassifier
from tests.model.helpers import random_ids, tiny_config


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_shapes_and_padding_invariance(pooling: str) -> None:
    model = TextClassifier(tiny_config(n_decoder_layers=0, n_classes=3, pooling=pooling)).eval()
    ids = random_ids(2, 6)
    logits = model(ids)
    assert logits.shape == (2, 3)
    padded = torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded), logits, atol=1e-5, rtol=1e-5)
    fast_vs_weights, maps = model.forward_with_maps(padded)
    torch.testing.assert_close(fast_vs_weights, logits, atol=1e-5, rtol=1e-5)
    assert [m.shape for m in maps.encoder_self] == [(2, 4, 10, 10)] * 2


def test_needs_two_classes() -> None:
    with pytest.raises(ValueError, match="n_classes"):
        TextClassifier(tiny_config(n_classes=1))

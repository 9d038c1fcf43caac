import pytest
import torch
import torch.nn.functional as F

from qkv.model.classifier import TextClassifier
from tests.model.helpers import overfit, padded_ids, random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def classifier(**overrides: object) -> TextClassifier:
    return TextClassifier(tiny_config(n_decoder_layers=0, n_classes=3, **overrides))


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_shapes_and_padding_invariance(pooling: str) -> None:
    model = classifier(pooling=pooling).eval()
    ids = random_ids(2, 6)
    logits = model(ids)
    assert logits.shape == (2, 3)
    padded = torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded), logits, atol=1e-5, rtol=1e-5)
    weights_path, maps = model.forward_with_maps(padded)
    torch.testing.assert_close(weights_path, logits, atol=1e-5, rtol=1e-5)
    assert [m.shape for m in maps.encoder_self] == [(2, 4, 10, 10)] * 2
    assert maps.decoder_self == maps.cross == []


def test_mean_pooling_averages_the_real_tokens_only() -> None:
    model = classifier()
    states = torch.randn(2, 4, 32)
    ids = padded_ids([4, 2], 4)
    mask = (ids != 0)[:, None, None, :]
    pooled = model.pool(states, mask)
    torch.testing.assert_close(pooled[0], states[0].mean(0))
    torch.testing.assert_close(pooled[1], states[1, :2].mean(0))
    empty = model.pool(states, torch.zeros_like(mask))  # no real token: zeros, not NaN
    assert torch.equal(empty, torch.zeros(2, 32))
    cls = classifier(pooling="cls")
    torch.testing.assert_close(cls.pool(states, mask), states[:, 0])


def test_head_dropout_only_in_training() -> None:
    model = classifier(head_dropout=0.5)
    ids = random_ids(4, 5)
    model.eval()
    assert torch.equal(model(ids), model(ids))
    model.train()
    assert not torch.equal(model(ids), model(ids))


def test_needs_two_classes() -> None:
    with pytest.raises(ValueError, match="n_classes"):
        TextClassifier(tiny_config(n_classes=1))


def test_bad_token_ids_are_refused() -> None:
    model = classifier()
    with pytest.raises(ValueError, match=r"token ids holds token id 40"):
        model(torch.full((2, 3), 40))
    with pytest.raises(ValueError, match=r"token ids must be \(B, L\) token ids"):
        model.forward_with_maps(random_ids(2, 3)[0])


def test_a_tiny_classifier_fits_a_batch() -> None:
    model = classifier(n_encoder_layers=1, head_dropout=0.0).train()
    ids = padded_ids([6, 3, 5, 2, 6, 4, 1, 5], 6)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(ids), labels)

    first, last = overfit(model.parameters(), loss, steps=60)
    assert last < 0.1 * first, (first, last)
    assert torch.equal(model.eval()(ids).argmax(-1), labels)

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.model.encoder import Encoder
from qkv.model.masks import padding_mask
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import overfit, padded_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def encoder(request: pytest.FixtureRequest) -> Encoder:
    return Seq2SeqTransformer(tiny_config(norm_first=request.param)).encoder.eval()


def test_shapes_maps_and_the_final_norm(encoder: Encoder) -> None:
    ids = padded_ids([6, 4, 1], 6)
    mask = padding_mask(ids, 0)
    memory, maps = encoder(ids, mask)
    assert memory.shape == (3, 6, 32) and maps == []
    eager, maps = encoder(ids, mask, need_weights=True)
    assert [m.shape for m in maps] == [(3, 4, 6, 6)] * 2
    assert all(torch.all(m.masked_select(~mask.expand_as(m)) == 0) for m in maps)
    torch.testing.assert_close(eager, memory, atol=1e-5, rtol=1e-5)  # weights path = fused
    assert isinstance(encoder.final_norm, nn.LayerNorm) == encoder.layers[0].norm_first


def test_padding_does_not_change_real_positions(encoder: Encoder) -> None:
    ids = padded_ids([5, 2], 5)
    longer = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    memory, _ = encoder(ids, padding_mask(ids, 0))
    padded, _ = encoder(longer, padding_mask(longer, 0))
    real = ids != 0
    torch.testing.assert_close(padded[:, :5][real], memory[real], atol=1e-5, rtol=1e-5)
    alone, _ = encoder(ids[1:, :2], padding_mask(ids[1:, :2], 0))  # the short one alone
    torch.testing.assert_close(memory[1, :2], alone[0], atol=1e-5, rtol=1e-5)


def test_refuses_a_float_mask(encoder: Encoder) -> None:
    ids = padded_ids([4, 2], 4)
    with pytest.raises(TypeError, match="mask must be boolean"):
        encoder(ids, padding_mask(ids, 0).float())


def test_a_tiny_encoder_fits_a_batch() -> None:
    encoder = Seq2SeqTransformer(tiny_config(n_encoder_layers=1)).encoder.train()
    ids = padded_ids([6, 3, 5, 1], 6)
    mask, real = padding_mask(ids, 0), ids != 0
    target = torch.randn(4, 6, 32)

    def loss() -> torch.Tensor:
        return F.mse_loss(encoder(ids, mask)[0][real], target[real])

    first, last = overfit(encoder.parameters(), loss, steps=100)
    assert last < 0.1 * first, (first, last)

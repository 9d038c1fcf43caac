"""The packed encoder and decoder compute the reference's numbers at the real positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.fast import packed
from qkv.fast.packed_attention import SHORT
from qkv.fast.packing import Packing
from qkv.model.attention import MultiHeadAttention
from qkv.model.masks import decoder_self_mask, padding_mask
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.fast.helpers import assert_all_close, fast_twin, loss_and_grads
from tests.model.helpers import padded_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request: pytest.FixtureRequest) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(tiny_config(norm_first=request.param)).eval()


def batch(length: int = 7) -> tuple[Tensor, Tensor]:
    """Sources (B, S) and targets (B, T) of mixed lengths: an empty target, 13 target rows (3
    filler rows on a CPU)."""
    src = padded_ids([7, 4, 6, 1], length)
    tgt = padded_ids([3, 6, 0, 4], 6)
    return src, tgt


def test_packed_layers_compute_the_reference_states_at_real_positions(
    model: Seq2SeqTransformer,
) -> None:
    twin = fast_twin(model)
    src, tgt = batch()
    memory, src_mask, _ = model.encode(src)
    packed_memory, packed_mask, _ = twin.encode(src)
    real_src = src != 0
    torch.testing.assert_close(packed_memory[real_src], memory[real_src], atol=1e-5, rtol=1e-5)
    assert packed_memory[~real_src].abs().max() == 0  # packed states are zero at padding
    states = model.decode(tgt, memory, src_mask)
    packed_states = twin.decode(tgt, packed_memory, packed_mask)
    real = tgt != 0
    torch.testing.assert_close(packed_states[real], states[real], atol=1e-5, rtol=1e-5)
    assert packed_states[~real].abs().max() == 0


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_packed_and_reference_give_the_same_loss_and_gradients(
    model: Seq2SeqTransformer, mode: str
) -> None:
    model.train(mode == "train")  # dropout 0
    twin = fast_twin(model)
    src, tgt = batch()
    weights = torch.randn(4, 6, model.config.d_model) * (tgt != 0)[..., None]

    def loss(m: torch.nn.Module) -> Tensor:
        return (m.hidden(src, tgt) * weights).sum()

    assert_all_close(loss_and_grads(twin, loss), loss_and_grads(model, loss))


def test_sentences_longer_than_short_take_the_fused_kernel_with_the_same_numbers() -> None:
    model = Seq2SeqTransformer(tiny_config(max_len=SHORT + 8)).train()
    twin = fast_twin(model)
    src = padded_ids([SHORT + 4, 9], SHORT + 4)
    tgt = padded_ids([5, SHORT + 2], SHORT + 2)
    labels = padded_ids([5, SHORT + 2], SHORT + 2)

    def loss(m: torch.nn.Module) -> Tensor:
        return F.cross_entropy(m(src, tgt).flatten(0, 1), labels.flatten(), ignore_index=0)

    assert_all_close(loss_and_grads(twin, loss), loss_and_grads(model, loss))


def test_float64_takes_the_fused_kernel_with_the_same_numbers() -> None:
    model = Seq2SeqTransformer(tiny_config()).double().train()
    twin = fast_twin(model)
    src, tgt = batch()

    def loss(m: torch.nn.Module) -> Tensor:
        return (m.hidden(src, tgt) * (tgt != 0)[..., None]).square().sum()

    assert_all_close(loss_and_grads(twin, loss), loss_and_grads(model, loss), atol=1e-10)


def test_attention_dropout_draws_the_reference_masks() -> None:
    """With dropout on the attention weights, the packed layers attend on the padded layout,
    with the same draws as the reference's."""
    model = Seq2SeqTransformer(tiny_config(attention_dropout=0.3)).train()
    twin = fast_twin(model)
    src, tgt = batch()
    torch.manual_seed(3)
    expected = model.hidden(src, tgt)
    torch.manual_seed(3)
    got = twin.hidden(src, tgt)
    real = tgt != 0
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_a_source_with_no_real_token_gives_the_reference_numbers(
    model: Seq2SeqTransformer,
) -> None:
    twin = fast_twin(model)
    src, tgt = batch()
    src[1] = 0  # nothing to attend to: cross-attention's context is zero, in both ways
    real = tgt != 0
    got, expected = twin.hidden(src, tgt), model.hidden(src, tgt)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_maps_and_unpacked_runs_take_the_reference_forward(model: Seq2SeqTransformer) -> None:
    src, tgt = batch()
    expected, expected_maps = model.forward_with_maps(src, tgt)
    got, maps = fast_twin(model).forward_with_maps(src, tgt)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)  # padding included
    for name in ("encoder_self", "decoder_self", "cross"):
        for mine, theirs in zip(getattr(maps, name), getattr(expected_maps, name), strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    unpacked = fast_twin(model, packed=False)
    torch.testing.assert_close(unpacked(src, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_packed_masks_are_checked(model: Seq2SeqTransformer) -> None:
    twin = fast_twin(model)
    src, tgt = batch()
    src_mask = padding_mask(src, 0)
    with pytest.raises(TypeError, match="mask must be boolean"):
        twin.encoder(src, src_mask.float())
    memory, _ = twin.encoder(src, src_mask)
    self_mask = decoder_self_mask(tgt, 0)
    for masks in ((self_mask.float(), src_mask), (self_mask, src_mask.float())):
        with pytest.raises(TypeError, match="must be boolean"):
            twin.decoder(tgt, memory, *masks)
    with pytest.raises(ValueError, match="exceeds the model's max_len"):
        twin.encoder(torch.ones(1, 65, dtype=torch.long), torch.ones(1, 1, 1, 65).bool())


@pytest.mark.parametrize("round_rows", [False, True])
def test_attention_on_packed_rows_equals_attention_at_real_positions(round_rows: bool) -> None:
    attn = MultiHeadAttention(32, 4).eval()
    tgt = torch.tensor([[5, 6, 7, 8], [9, 5, 0, 0], [6, 0, 0, 0]])
    src = torch.tensor([[5, 6, 0], [7, 8, 9], [5, 0, 0]])
    x, memory = torch.randn(3, 4, 32), torch.randn(3, 3, 32)
    tgt_rows = Packing.from_mask(tgt != 0, round_rows)
    src_rows = Packing.from_mask(src != 0, round_rows)
    self_mask, cross_mask = decoder_self_mask(tgt, 0), padding_mask(src, 0)
    packed_x = tgt_rows.pack(x)
    real = slice(0, tgt_rows.count)

    expected, _ = attn(x, x, x, self_mask)
    got = packed.attention(attn, packed_x, None, self_mask, tgt_rows)
    torch.testing.assert_close(got[real], expected[tgt != 0], atol=1e-5, rtol=1e-5)

    expected, _ = attn(x, memory, memory, cross_mask)
    got = packed.attention(attn, packed_x, src_rows.pack(memory), cross_mask, tgt_rows, src_rows)
    torch.testing.assert_close(got[real], expected[tgt != 0], atol=1e-5, rtol=1e-5)


def test_layer_functions_equal_the_layers_at_real_positions(model: Seq2SeqTransformer) -> None:
    src, tgt = batch()
    src_mask, self_mask = padding_mask(src, 0), decoder_self_mask(tgt, 0)
    src_rows, tgt_rows = Packing.from_mask(src != 0), Packing.from_mask(tgt != 0)
    real_src, real_tgt = src != 0, tgt != 0
    x = model.encoder.embeddings(src)
    torch.testing.assert_close(packed.embed(model.encoder.embeddings, src, src_rows), x[real_src])
    encoder_layer = model.encoder.layers[0]
    expected, _ = encoder_layer(x, src_mask)
    got = packed.encoder_layer(encoder_layer, src_rows.pack(x), src_mask, src_rows)
    torch.testing.assert_close(got, expected[real_src], atol=1e-5, rtol=1e-5)
    y = model.decoder.embeddings(tgt)
    decoder_layer = model.decoder.layers[0]
    expected, _, _ = decoder_layer(y, expected, self_mask, src_mask)
    got = packed.decoder_layer(
        decoder_layer, tgt_rows.pack(y), got, self_mask, src_mask, tgt_rows, src_rows
    )
    torch.testing.assert_close(got, expected[real_tgt], atol=1e-5, rtol=1e-5)

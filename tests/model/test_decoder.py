import pytest
import torch
import torch.nn.functional as F

from qkv.model.decoder import Decoder
from qkv.model.masks import decoder_self_mask, padding_mask
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import overfit, padded_ids, random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def decoder(request: pytest.FixtureRequest) -> Decoder:
    return Seq2SeqTransformer(tiny_config(norm_first=request.param)).decoder.eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Target ids (B, T), memory (B, S, D), self mask (B, 1, T, T), cross mask (B, 1, 1, S)."""
    tgt, src = padded_ids([5, 3, 1], 5), padded_ids([4, 2, 4], 4)
    return tgt, torch.randn(3, 4, 32), decoder_self_mask(tgt, 0), padding_mask(src, 0)


def test_shapes_and_maps(decoder: Decoder) -> None:
    tgt, memory, self_mask, cross_mask = inputs()
    states, self_maps, cross_maps = decoder(tgt, memory, self_mask, cross_mask)
    assert states.shape == (3, 5, 32) and self_maps == cross_maps == []
    eager, self_maps, cross_maps = decoder(tgt, memory, self_mask, cross_mask, need_weights=True)
    assert [m.shape for m in self_maps] == [(3, 4, 5, 5)] * 2
    assert [m.shape for m in cross_maps] == [(3, 4, 5, 4)] * 2
    for maps, mask in ((self_maps, self_mask), (cross_maps, cross_mask)):
        assert all(torch.all(m.masked_select(~mask.expand_as(m)) == 0) for m in maps)
    torch.testing.assert_close(eager, states, atol=1e-5, rtol=1e-5)  # weights path = fused


def test_future_targets_and_padded_memory_change_nothing(decoder: Decoder) -> None:
    tgt, memory, self_mask, cross_mask = inputs()
    before, _, _ = decoder(tgt, memory, self_mask, cross_mask)
    changed_tgt, changed_memory = tgt.clone(), memory.clone()
    changed_tgt[0, 3:] = torch.tensor([7, 8])
    changed_memory[1, 2:] = torch.randn(2, 32) * 10  # padding of the second source
    after, _, _ = decoder(changed_tgt, changed_memory, decoder_self_mask(tgt, 0), cross_mask)
    torch.testing.assert_close(after[:, :3], before[:, :3], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(after[0, 3:], before[0, 3:])


def test_refuses_float_masks(decoder: Decoder) -> None:
    tgt, memory, self_mask, cross_mask = inputs()
    for masks in ((self_mask.float(), cross_mask), (self_mask, cross_mask.float())):
        with pytest.raises(TypeError, match="must be boolean"):
            decoder(tgt, memory, *masks)


def test_the_cache_holds_each_layers_source_keys_and_values(decoder: Decoder) -> None:
    _, memory, _, cross_mask = inputs()
    cache = decoder.init_cache(memory, cross_mask, max_len=6)
    assert len(cache.self_attn) == len(cache.source) == len(decoder.layers)
    assert cache.length == 0 and cache.rows == 3 and cache.self_attn[0].capacity == 6
    for layer, source in zip(decoder.layers, cache.source, strict=True):
        keys, values = layer.cross_attn.project_kv(memory)
        torch.testing.assert_close(source.keys, keys)
        torch.testing.assert_close(source.values, values)
    states = decoder.step(random_ids(3, 1), cache)
    assert states.shape == (3, 1, 32) and cache.length == 1


@pytest.mark.parametrize("empty_source", [False, True])
def test_cached_steps_equal_the_whole_sequence(decoder: Decoder, empty_source: bool) -> None:
    _, memory, _, cross_mask = inputs()
    if empty_source:  # nothing to attend to: cross-attention's context is zero, both ways
        cross_mask = cross_mask.clone()
        cross_mask[2] = False
    tgt = random_ids(3, 6)
    full, _, _ = decoder(tgt, memory, decoder_self_mask(tgt, 0), cross_mask)
    cache = decoder.init_cache(memory, cross_mask, max_len=6)
    steps = [decoder.step(tgt[:, t : t + 1], cache) for t in range(6)]
    decoded = torch.cat(steps, dim=1)
    assert torch.isfinite(decoded).all()
    torch.testing.assert_close(decoded, full, atol=1e-5, rtol=1e-5)


def test_a_tiny_decoder_fits_a_batch() -> None:
    decoder = Seq2SeqTransformer(tiny_config(n_decoder_layers=1)).decoder.train()
    tgt, memory, self_mask, cross_mask = inputs()
    real = tgt != 0
    target = torch.randn(3, 5, 32)

    def loss() -> torch.Tensor:
        return F.mse_loss(decoder(tgt, memory, self_mask, cross_mask)[0][real], target[real])

    first, last = overfit(decoder.parameters(), loss, steps=100)
    assert last < 0.1 * first, (first, last)

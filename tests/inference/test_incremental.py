"""`ModelDecoder` and the `DecodingWeights` that its batches share."""

from __future__ import annotations

import pytest
import torch

from qkv.data.special import EOS_ID
from qkv.inference.beam import beam_search
from qkv.inference.incremental import DecodingWeights, ModelDecoder
from qkv.inference.search import greedy_search
from qkv.fast.frozen_linear import FrozenLinear
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config


def greedy(model: Seq2SeqTransformer, src: torch.Tensor, weights: DecodingWeights | None) -> list:
    budget = torch.full((src.size(0),), 9, dtype=torch.long)
    decoder = ModelDecoder(model, src, 10, (EOS_ID,), weights)
    return greedy_search(decoder, src.size(0), budget)


def test_batches_sharing_decoding_weights_decode_as_batches_with_their_own() -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
    weights = DecodingWeights(model)
    with torch.inference_mode():
        for seed in (1, 2, 3):
            torch.manual_seed(seed)
            src = random_ids(5, 7, vocab=60)
            assert greedy(model, src, weights) == greedy(model, src, None)
        made = weights.frozen(5)
        assert weights.frozen(64) == made  # the same objects: nothing made again


def test_the_model_with_a_frozen_decoder_encodes_and_caches_as_the_model_does() -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
    src = random_ids(5, 7, vocab=60)
    src[1, 4:] = model.config.pad_id
    with torch.inference_mode():
        decoder = ModelDecoder(model, src, 10)
        memory, src_mask, _ = model.encode(src)
        cache = model.init_cache(memory, src_mask, 10)
    frozen, _ = DecodingWeights(model).frozen(5)
    assert frozen.encoder is model.encoder  # run once per batch: not frozen
    assert isinstance(frozen.decoder.layers[0].cross_attn.in_proj, FrozenLinear)
    assert frozen.decoder.layers[0].ffn.linear1.weight is model.decoder.layers[0].ffn.linear1.weight
    assert isinstance(model.decoder.layers[0].ffn.linear1, torch.nn.Linear)  # left as it was
    assert not isinstance(model.decoder.layers[0].ffn.linear1, FrozenLinear)
    for ours, theirs in zip(
        decoder.cache.cross_keys + decoder.cache.cross_values,
        cache.cross_keys + cache.cross_values,
        strict=True,
    ):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert torch.equal(decoder.cache.src_mask, cache.src_mask)


def test_weights_that_are_inference_tensors_are_made_every_time() -> None:
    with torch.inference_mode():  # no version counters to tell a change
        model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
        weights = DecodingWeights(model)
        src = random_ids(5, 7, vocab=60)
        before = greedy(model, src, weights)
        made = weights.frozen(5)
        model.output.weight.mul_(-3.0)
        assert weights.frozen(5) != made
        assert greedy(model, src, weights) == greedy(model, src, None) != before


@pytest.mark.parametrize("change", ["in place", "encoder in place", "replaced", "loaded"])
def test_decoding_weights_are_made_again_after_the_weights_change(change: str) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
    src = random_ids(5, 7, vocab=60)
    weights = DecodingWeights(model)
    with torch.inference_mode():
        before = greedy(model, src, weights)
    layer = model.decoder.layers[0].ffn.linear1
    with torch.no_grad():
        if change == "in place":
            layer.weight.mul_(-3.0)
            model.output.weight.mul_(-3.0)
        elif change == "encoder in place":
            for encoder_layer in model.encoder.layers:
                encoder_layer.ffn.linear1.weight.mul_(-3.0)
        elif change == "replaced":
            model.output.weight = torch.nn.Parameter(-3.0 * model.output.weight)
        else:
            torch.manual_seed(5)
            model.load_state_dict(Seq2SeqTransformer(tiny_config(vocab_size=60)).state_dict())
    with torch.inference_mode():
        after = greedy(model, src, weights)
        assert after == greedy(model, src, None)
    assert after != before


def test_decoding_weights_of_another_model_are_refused() -> None:
    model, other = (Seq2SeqTransformer(tiny_config()).eval() for _ in range(2))
    with pytest.raises(ValueError, match="another model"):
        ModelDecoder(model, random_ids(2, 3), 4, weights=DecodingWeights(other))


def test_decoding_with_autograd_on_gives_the_tokens_of_inference_mode() -> None:
    """Nothing in a step writes in place into a tensor that autograd tracks."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
    src = random_ids(5, 7, vocab=60)

    def beams() -> list:
        budget = torch.full((src.size(0),), 9, dtype=torch.long)
        found = beam_search(ModelDecoder(model, src, 10, (EOS_ID,)), src.size(0), 3, budget)
        return [[hypothesis.tokens for hypothesis in sentence] for sentence in found]

    with torch.inference_mode():
        expected = greedy(model, src, None), beams()
    assert (greedy(model, src, None), beams()) == expected

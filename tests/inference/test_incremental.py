"""`ModelDecoder` (frozen weights, attention over the cache as two products)
decodes what the reference decoding decodes (`model.decode_step` over `model.init_cache`); the
`DecodingWeights` that its batches share."""

from __future__ import annotations

import copy

import pytest
import torch

from qkv import fast
from qkv.data.special import BOS_ID, EOS_ID, PAD_ID
from qkv.fast.frozen_linear import FrozenLinear
from qkv.fast.screen import int8_matmuls_exact
from qkv.inference.beam import beam_search
from qkv.inference.incremental import DecodingWeights, ModelDecoder
from qkv.inference.search import greedy_search, sample
from qkv.inference.translate import DecodeOptions, translate_hypotheses, translate_ids
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.inference.helpers import ReferenceDecoder, fast_copy, shared_prefixes, tokens_of
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LENGTHS = torch.tensor([5, 12, 3, 20, 7, 8])
"""Budgets of generated tokens, one per source of `src`."""


@pytest.fixture(params=["post-norm", "pre-norm, learned positions", "reference modules"])
def models(request: pytest.FixtureRequest) -> tuple[Seq2SeqTransformer, Seq2SeqTransformer]:
    """The reference model, and the model that `ModelDecoder` decodes with: a copy turned fast
    by `qkv.fast.apply` (as `Translator.load` gives; its decoder frozen), or the same one."""
    torch.manual_seed(0)
    if request.param == "pre-norm, learned positions":
        config = tiny_config(vocab_size=60, max_len=40, norm_first=True, positions="learned")
    else:
        config = tiny_config(vocab_size=60, max_len=40)
    model = Seq2SeqTransformer(config).eval()
    return model, model if request.param == "reference modules" else fast_copy(model)


@pytest.fixture
def src() -> torch.Tensor:
    """Six sources, two of them padded and one all padding."""
    torch.manual_seed(1)
    ids = random_ids(6, 9, vocab=60)
    ids[1, 4:] = PAD_ID
    ids[3, 2:] = PAD_ID
    ids[4] = PAD_ID  # no real token at all
    return ids  # (B, S)


@torch.inference_mode()
def test_steps_compute_the_reference_logits_through_expansion_reorder_and_drops(
    models: tuple[Seq2SeqTransformer, Seq2SeqTransformer], src: torch.Tensor
) -> None:
    """Rows expand into groups of beams, swap, drop out and spread over the sources again;
    the `held` steps of a moved row are not copied, and need not be (the reference copies
    every step)."""
    reference, model = models
    fast = ModelDecoder(model, src, 8)
    expected = ReferenceDecoder(reference, src, 8, use_held=False)
    sources = torch.arange(6)  # (N,) the source of each row
    history = torch.full((6, 1), BOS_ID)  # (N, t) the tokens fed so far
    generator = torch.Generator().manual_seed(2)
    for rows in (
        torch.arange(6).repeat_interleave(2),  # beams of 2: rows in groups of one source
        torch.tensor([1, 0, 2, 2, 5, 4, 6, 6, 9, 8, 11, 10]),  # siblings swap and copy
        torch.tensor([0, 1, 4, 5, 8, 9]),  # sentences 1, 3 and 5 done
        torch.tensor([3, 0, 0, 4, 5, 5]),  # no longer in groups
        torch.tensor([5, 3, 0, 1, 2, 4, 4, 0]),  # more rows than before
        torch.tensor([6]),
    ):
        tokens = history[:, -1]  # (N,)
        torch.testing.assert_close(fast.step(tokens), expected.step(tokens), rtol=1e-4, atol=1e-4)
        held = shared_prefixes(history, sources, rows)  # (N',)
        fast.select(rows, held)
        expected.select(rows)
        sources = sources[rows]
        # Few distinct tokens: siblings often share their first steps.
        new = torch.randint(5, 8, (len(rows), 1), generator=generator)
        history = torch.cat([history[rows], new], dim=1)


@torch.inference_mode()
def test_greedy_search_and_sampling_find_what_the_reference_finds(
    models: tuple[Seq2SeqTransformer, Seq2SeqTransformer], src: torch.Tensor
) -> None:
    reference, model = models
    expected = greedy_search(ReferenceDecoder(reference, src, 21), 6, MAX_LENGTHS)
    assert greedy_search(ModelDecoder(model, src, 21), 6, MAX_LENGTHS) == expected
    assert sum(map(len, expected)) > 0
    drawn = [
        sample(decoder, 6, MAX_LENGTHS, top_k=5, seeds=range(6))
        for decoder in (ModelDecoder(model, src, 21), ReferenceDecoder(reference, src, 21))
    ]
    assert drawn[0] == drawn[1]


@torch.inference_mode()
@pytest.mark.parametrize("beam_size", [2, 5])
def test_beam_search_finds_what_the_reference_finds(
    models: tuple[Seq2SeqTransformer, Seq2SeqTransformer], src: torch.Tensor, beam_size: int
) -> None:
    """Beam search reorders the rows at every step, passing what each place holds already,
    and drops finished sentences."""
    reference, model = models
    found = beam_search(ModelDecoder(model, src, 21), 6, beam_size, MAX_LENGTHS)
    expected = beam_search(
        ReferenceDecoder(reference, src, 21, use_held=False), 6, beam_size, MAX_LENGTHS
    )
    assert tokens_of(found) == tokens_of(expected)
    for hyps, others in zip(found, expected, strict=True):
        assert [h.score for h in hyps] == pytest.approx([h.score for h in others], abs=1e-4)


@torch.inference_mode()
def test_greedy_search_finds_what_the_reference_finds() -> None:
    """A large vocabulary and batch (argmax screened where this CPU allows it), rows that
    finish at many steps."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=1100, max_len=24)).eval()
    src = random_ids(32, 6, vocab=1100)
    src[5, 2:] = PAD_ID
    budgets = torch.randint(0, 16, (32,), generator=torch.Generator().manual_seed(3))
    decoder = ModelDecoder(fast_copy(model), src, 16)
    found = greedy_search(decoder, 32, budgets)
    assert found == greedy_search(ReferenceDecoder(model, src, 16), 32, budgets)


def greedy(model: Seq2SeqTransformer, src: torch.Tensor, weights: DecodingWeights | None) -> list:
    """Nine tokens for each source (EOS is never chosen)."""
    budget = torch.full((src.size(0),), 9, dtype=torch.long)
    decoder = ModelDecoder(model, src, 10, (EOS_ID,), weights)
    return greedy_search(decoder, src.size(0), budget)


def test_batches_sharing_decoding_weights_decode_as_batches_with_their_own() -> None:
    torch.manual_seed(0)
    model = fast_copy(Seq2SeqTransformer(tiny_config(vocab_size=60)).eval())
    weights = DecodingWeights(model)
    with torch.inference_mode():
        for seed in (1, 2, 3):
            torch.manual_seed(seed)
            src = random_ids(5, 7, vocab=60)
            assert greedy(model, src, weights) == greedy(model, src, None)
        made = weights.frozen()
        assert weights.frozen() == made  # the same objects: nothing made again


def test_a_model_turned_back_by_fast_reference_decodes_with_its_own_modules() -> None:
    """`qkv.fast.reference(model)` switches the frozen decoder and the int8 screen off."""
    model = fast_copy(Seq2SeqTransformer(tiny_config(vocab_size=1100)).eval())
    frozen, output = DecodingWeights(model).frozen()
    assert frozen is not model and any(isinstance(m, FrozenLinear) for m in frozen.modules())
    assert output.screens == int8_matmuls_exact()
    fast.reference(model)
    frozen, output = DecodingWeights(model).frozen()
    assert frozen is model and not any(isinstance(m, FrozenLinear) for m in frozen.modules())
    assert output.exact is model.output and not output.screens


@pytest.mark.parametrize("fast_modules", [False, True], ids=["reference", "fast"])
def test_decoding_leaves_the_model_as_it_was(fast_modules: bool) -> None:
    """The frozen weights are the model's own, in a copy of its module tree: the model keeps
    its modules, its parameters and its numbers."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
    model = fast_copy(model) if fast_modules else model
    src = random_ids(5, 7, vocab=60)
    src[1, 3:] = PAD_ID
    tgt = random_ids(5, 4, vocab=60)
    classes = [(name, type(module)) for name, module in model.named_modules()]
    parameters = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    with torch.inference_mode():
        before = model(src, tgt)  # (B, T, V)
        greedy(model, src, None)
        beam_search(ModelDecoder(model, src, 10), 5, 3, torch.full((5,), 9))
        torch.testing.assert_close(model(src, tgt), before, rtol=0, atol=0)
    assert [(name, type(module)) for name, module in model.named_modules()] == classes
    for name, p in model.named_parameters():
        assert p is parameters[name][0] and torch.equal(p, parameters[name][1]), name


@pytest.mark.parametrize("change", ["in place", "encoder in place", "replaced", "loaded"])
def test_a_decoding_call_after_the_weights_change_decodes_with_the_new_weights(
    change: str,
) -> None:
    """Each call makes its own frozen weights, so training further, or loading other weights,
    between two calls changes what the second decodes."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
    sources = random_ids(5, 7, vocab=60).tolist()
    options = DecodeOptions(beam_size=1, max_len_a=0.0, max_len_b=9, workers=1)
    before = translate_ids(model, sources, options, torch.device("cpu"))
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
    after = translate_ids(model, sources, options, torch.device("cpu"))
    assert after != before
    reference = translate_ids(copy.deepcopy(model), sources, options, torch.device("cpu"))
    assert after == reference


def test_decoding_weights_of_another_model_are_refused() -> None:
    model, other = (Seq2SeqTransformer(tiny_config()).eval() for _ in range(2))
    with pytest.raises(ValueError, match="another model"):
        ModelDecoder(model, random_ids(2, 3), 4, weights=DecodingWeights(other))
    sources, options = [[5, 6, 7]], DecodeOptions()
    with pytest.raises(ValueError, match="another model"):
        translate_hypotheses(
            model, sources, options, torch.device("cpu"), weights=DecodingWeights(other)
        )


def test_decoding_with_autograd_on_gives_the_tokens_of_inference_mode() -> None:
    """Nothing in a step writes in place into a tensor that autograd tracks."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=60)).eval()
    src = random_ids(5, 7, vocab=60)

    def beams() -> list:
        budget = torch.full((src.size(0),), 9, dtype=torch.long)
        found = beam_search(ModelDecoder(model, src, 10, (EOS_ID,)), src.size(0), 3, budget)
        return tokens_of(found)

    with torch.inference_mode():
        expected = greedy(model, src, None), beams()
    assert (greedy(model, src, None), beams()) == expected

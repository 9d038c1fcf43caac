"""`qkv.fast.apply` and `qkv.fast.reference`: the same model, the same numbers, faster classes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import qkv.fast
from qkv.fast.dropout import Dropout
from qkv.fast.linear import Linear
from qkv.fast.packed import PackedDecoder, PackedEncoder
from qkv.model.classifier import TextClassifier
from qkv.model.decoder import Decoder
from qkv.model.encoder import Encoder
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.fast.helpers import assert_all_close, fast_twin, loss_and_grads
from tests.model.helpers import padded_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = {
    Encoder: PackedEncoder,
    Decoder: PackedDecoder,
    nn.Linear: Linear,
    nn.Dropout: Dropout,
}


def types(model: nn.Module) -> list[type]:
    return [type(m) for m in model.modules()]


Loss = Callable[[nn.Module], Tensor]


def translation_batch() -> tuple[Tensor, Tensor, Tensor]:
    """Sources, targets and labels (0 = padding, left out of the loss)."""
    src = padded_ids([7, 3, 5], 7)
    tgt = padded_ids([4, 6, 2], 6)
    return src, tgt, padded_ids([4, 6, 2], 6)


def translation_loss() -> Loss:
    """A loss on one batch."""
    src, tgt, labels = translation_batch()

    def loss(model: nn.Module) -> Tensor:
        logits = model(src, tgt).flatten(0, 1)
        return F.cross_entropy(logits, labels.flatten(), ignore_index=0)

    return loss


def classification_loss() -> Loss:
    """A loss on one batch."""
    ids = padded_ids([6, 2, 4, 1], 6)
    return lambda model: F.cross_entropy(model(ids), torch.tensor([0, 1, 2, 1]))


def translator(**overrides: object) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(tiny_config(**overrides))


def classifier(**overrides: object) -> TextClassifier:
    fields: dict[str, object] = dict(n_decoder_layers=0, n_classes=3, head_dropout=0.0)
    return TextClassifier(tiny_config(**{**fields, **overrides}))


@pytest.mark.parametrize("make", [translator, classifier])
def test_apply_swaps_every_reference_class_and_reference_swaps_them_back(
    make: Callable[..., nn.Module],
) -> None:
    model = make(dropout=0.1)
    before = types(model)
    assert qkv.fast.apply(model) is model
    after = types(model)
    assert after == [FAST.get(t, t) for t in before]
    assert not set(after) & set(FAST)  # no reference module left
    assert all(m.packed for m in model.modules() if isinstance(m, PackedEncoder | PackedDecoder))
    assert qkv.fast.reference(model) is model
    assert types(model) == before


@pytest.mark.parametrize("make", [translator, classifier])
def test_apply_keeps_the_parameters_and_the_state_dict(make: Callable[..., nn.Module]) -> None:
    model = make()
    state = model.state_dict()
    parameters = dict(model.named_parameters())
    qkv.fast.apply(model)
    assert dict(model.named_parameters()) == parameters  # the same tensors
    fast_state = model.state_dict()
    assert list(fast_state) == list(state)
    for name, tensor in state.items():
        assert fast_state[name].data_ptr() == tensor.data_ptr(), name  # the same memory
    fresh = make()
    fresh.load_state_dict(fast_state)  # a fast model's checkpoint loads into a reference one


def test_tied_tables_stay_tied() -> None:
    model = qkv.fast.apply(translator())
    table = model.encoder.embeddings.token.table.weight
    assert model.decoder.embeddings.token.table.weight is table
    assert model.output.weight is table


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize(
    ("make", "loss"), [(translator, translation_loss), (classifier, classification_loss)]
)
def test_fast_model_gives_the_reference_loss_and_gradients(
    make: Callable[[], nn.Module], loss: Callable[[], Loss], mode: str, packed: bool
) -> None:
    model = make().train(mode == "train")  # dropout 0
    twin = fast_twin(model, packed=packed)
    on_batch = loss()
    assert_all_close(loss_and_grads(twin, on_batch), loss_and_grads(model, on_batch))


@pytest.mark.parametrize("norm_first", [False, True])
def test_fast_translator_gives_the_reference_outputs(norm_first: bool) -> None:
    model = translator(norm_first=norm_first, dropout=0.2).eval()
    src, tgt, _ = translation_batch()
    expected = model(src, tgt)
    real = tgt != 0
    torch.testing.assert_close(fast_twin(model)(src, tgt)[real], expected[real])
    unpacked = fast_twin(model, packed=False)
    assert not any(m.packed for m in (unpacked.encoder, unpacked.decoder))
    torch.testing.assert_close(unpacked(src, tgt), expected)  # padding included


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_fast_classifier_gives_the_reference_outputs(pooling: str) -> None:
    model = classifier(pooling=pooling, dropout=0.2).eval()
    ids = padded_ids([6, 2, 4, 1], 6)
    expected = model(ids)
    for packed in (True, False):
        torch.testing.assert_close(fast_twin(model, packed=packed)(ids), expected)


def test_fast_translator_decodes_as_the_reference() -> None:
    model = translator().eval()
    twin = fast_twin(model)
    src, tgt, _ = translation_batch()
    outputs = []
    with torch.inference_mode():
        for m in (model, twin):
            memory, src_mask, _ = m.encode(src)
            cache = m.init_cache(memory, src_mask, max_len=6)
            outputs.append(torch.stack([m.decode_step(tgt[:, t], cache) for t in range(6)], 1))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)


def test_apply_again_switches_packing_and_reference_gives_the_reference_numbers() -> None:
    model = translator().eval()
    src, tgt, _ = translation_batch()
    expected = model(src, tgt)
    qkv.fast.apply(model)
    qkv.fast.apply(model, packed=False)  # applied twice: only the flag changes
    assert not model.encoder.packed and not model.decoder.packed
    assert types(model) == types(fast_twin(translator()))
    qkv.fast.reference(model)
    assert torch.equal(model(src, tgt), expected)

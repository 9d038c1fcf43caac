import pytest
import torch
import torch.nn.functional as F

from qkv.fast.packed_attention import _softmax_grad, packed_attention, packed_attention_applies
from qkv.fast.packing import Packing
from qkv.model.masks import decoder_self_mask, padding_mask

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, WIDTH = 4, 32


def reference(
    queries: torch.Tensor,
    keys_values: torch.Tensor | None,
    mask: torch.Tensor,
    rows: Packing,
    memory_rows: Packing,
) -> torch.Tensor:
    """The autograd path: unpack, split the heads, attend (the fused kernel), merge, pack."""

    def heads(x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, HEADS, -1).transpose(1, 2)  # (B, H, L, K)

    if keys_values is None:
        q, k, v = map(heads, rows.unpack(queries).chunk(3, dim=-1))
    else:
        q = heads(rows.unpack(queries))
        k, v = map(heads, memory_rows.unpack(keys_values).chunk(2, dim=-1))
    context = F.scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, K)
    return rows.pack(context.transpose(1, 2).flatten(2))  # (M', D)


def batch_rows(ids: torch.Tensor) -> Packing:
    return Packing.from_mask(ids != 0, round_rows=True)


def check_against_reference(
    queries: torch.Tensor,
    keys_values: torch.Tensor | None,
    mask: torch.Tensor,
    rows: Packing,
    memory_rows: Packing,
) -> None:
    inputs = [x for x in (queries, keys_values) if x is not None]
    for x in inputs:
        x.requires_grad_(True)
    grad = torch.randn(len(rows.index), WIDTH)
    grad[rows.count :] = 0.0  # filler rows never reach a loss

    got = packed_attention(queries, keys_values, mask, rows, memory_rows, HEADS)
    got_grads = torch.autograd.grad(got, inputs, grad)
    expected = reference(queries, keys_values, mask, rows, memory_rows)
    expected_grads = torch.autograd.grad(expected, inputs, grad)

    real = slice(0, rows.count)
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
    assert torch.all(got[rows.count :] == 0)
    packings = [rows, memory_rows][: len(inputs)]
    for packing, mine, theirs in zip(packings, got_grads, expected_grads, strict=True):
        torch.testing.assert_close(mine[: packing.count], theirs[: packing.count])
        assert torch.all(mine[packing.count :] == 0)  # nothing flows into a filler row


def test_self_attention_equals_the_autograd_path_forward_and_backward() -> None:
    tgt = torch.tensor([[5, 6, 7, 8, 9], [9, 5, 0, 0, 0], [6, 7, 8, 0, 0]])
    rows = batch_rows(tgt)
    assert rows.count == 10 and len(rows.index) == 16  # filler rows present
    queries = torch.randn(len(rows.index), 3 * WIDTH)
    check_against_reference(queries, None, decoder_self_mask(tgt, 0), rows, rows)


def test_cross_attention_equals_the_autograd_path_forward_and_backward() -> None:
    tgt = torch.tensor([[5, 6, 7, 8], [9, 5, 0, 0], [6, 0, 0, 0]])
    src = torch.tensor([[5, 6, 0], [7, 8, 9], [5, 0, 0]])
    rows, memory_rows = batch_rows(tgt), batch_rows(src)
    queries = torch.randn(len(rows.index), WIDTH)
    keys_values = torch.randn(len(memory_rows.index), 2 * WIDTH)
    check_against_reference(queries, keys_values, padding_mask(src, 0), rows, memory_rows)


def test_a_source_with_no_tokens_gives_zeros_and_zero_gradients() -> None:
    tgt = torch.tensor([[5, 6, 7], [8, 9, 0]])
    src = torch.tensor([[5, 6, 7], [0, 0, 0]])
    rows, memory_rows = batch_rows(tgt), batch_rows(src)
    queries = torch.randn(len(rows.index), WIDTH)
    keys_values = torch.randn(len(memory_rows.index), 2 * WIDTH)
    check_against_reference(queries, keys_values, padding_mask(src, 0), rows, memory_rows)
    out = packed_attention(queries, keys_values, padding_mask(src, 0), rows, memory_rows, HEADS)
    assert torch.all(out[3:5] == 0)  # the second sentence's two tokens


def test_a_row_masked_whole_gives_zeros_as_the_fused_kernel_does() -> None:
    tgt = torch.tensor([[5, 6, 7], [8, 9, 6]])
    rows = batch_rows(tgt)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[1, 0, 2] = False  # the last query of the second sentence may attend to nothing
    queries = torch.randn(len(rows.index), 3 * WIDTH)
    check_against_reference(queries, None, mask, rows, rows)
    out = packed_attention(queries, None, mask, rows, rows, HEADS)
    assert torch.all(out[5] == 0)


def test_sentences_of_many_lengths_equal_the_autograd_path() -> None:
    torch.manual_seed(0)
    src_lengths, tgt_lengths = [7, 1, 3, 0, 5, 2, 6, 4], [2, 6, 0, 3, 1, 5, 4, 6]
    src = torch.zeros(8, 7, dtype=torch.long)
    tgt = torch.zeros(8, 6, dtype=torch.long)
    for b, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[b, :s], tgt[b, :t] = torch.randint(1, 9, (s,)), torch.randint(1, 9, (t,))
    rows, memory_rows = batch_rows(tgt), batch_rows(src)
    self_queries = torch.randn(len(rows.index), 3 * WIDTH)
    check_against_reference(self_queries, None, decoder_self_mask(tgt, 0), rows, rows)
    queries = torch.randn(len(rows.index), WIDTH)
    keys_values = torch.randn(len(memory_rows.index), 2 * WIDTH)
    check_against_reference(queries, keys_values, padding_mask(src, 0), rows, memory_rows)


@pytest.mark.parametrize(
    ("dtype", "dropout_p", "longest", "applies"),
    [
        (torch.float32, 0.0, 128, True),
        (torch.float32, 0.1, 20, False),  # attention dropout: autograd's path
        (torch.float32, 0.0, 129, False),  # long: the fused kernel
        (torch.float64, 0.0, 20, False),
    ],
)
def test_where_it_applies(
    dtype: torch.dtype, dropout_p: float, longest: int, applies: bool
) -> None:
    assert packed_attention_applies(torch.zeros(2, 3, dtype=dtype), dropout_p, longest) is applies


def test_the_mask_is_made_once_for_the_layers_of_a_batch() -> None:
    tgt = torch.tensor([[5, 6, 7, 8, 9], [9, 5, 0, 0, 0], [6, 7, 8, 0, 0]])
    rows = batch_rows(tgt)
    queries = torch.randn(len(rows.index), 3 * WIDTH)
    mask = decoder_self_mask(tgt, 0)
    first = packed_attention(queries, None, mask, rows, rows, HEADS)
    made = rows.derived  # what the batch computed once
    held = dict(made)
    assert any(key[0] == "_additive_mask" for key in held)
    second = packed_attention(queries, None, mask, rows, rows, HEADS)  # the next layer
    assert made.keys() == held.keys() and all(made[key] is held[key] for key in held)
    assert torch.equal(first, second)
    packed_attention(queries, None, mask.clone(), rows, rows, HEADS)  # another mask
    assert len(made) == len(held) + 1


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_the_softmax_gradient_is_autograds(scale: float) -> None:
    scores = torch.randn(3, 4, 5, requires_grad=True)
    scores.data[0, 1, 2:] = -1e9  # masked keys: weights of exactly zero
    weights = torch.softmax(scores, dim=-1)
    grad = torch.randn(3, 4, 5)
    (expected,) = torch.autograd.grad(weights, scores, grad)
    got = _softmax_grad(grad, weights.detach(), scale)
    torch.testing.assert_close(got, expected * scale, atol=1e-6, rtol=1e-5)

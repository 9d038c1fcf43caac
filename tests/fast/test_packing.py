import torch

from qkv.model.attention import MultiHeadAttention
from qkv.model.masks import decoder_self_mask, padding_mask
from qkv.fast.packing import Packing


def test_pack_then_unpack_keeps_real_tokens_and_zeroes_padding() -> None:
    ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    rows = Packing.from_mask(ids != 0)
    x = torch.randn(2, 3, 4)
    packed = rows.pack(x)
    assert packed.shape == (4, 4)
    torch.testing.assert_close(packed, x[ids != 0])
    assert rows.positions.tolist() == [0, 1, 2, 0]
    back = rows.unpack(packed)
    torch.testing.assert_close(back[ids != 0], x[ids != 0])
    assert torch.all(back[ids == 0] == 0)


def test_packed_attention_equals_padded_attention_on_real_tokens() -> None:
    attn = MultiHeadAttention(32, 4).eval()
    tgt = torch.tensor([[5, 6, 7, 8], [9, 5, 0, 0], [6, 0, 0, 0]])
    src = torch.tensor([[5, 6, 0], [7, 8, 9], [5, 0, 0]])
    x, memory = torch.randn(3, 4, 32), torch.randn(3, 3, 32)
    tgt_rows, src_rows = Packing.from_mask(tgt != 0), Packing.from_mask(src != 0)
    self_mask, cross_mask = decoder_self_mask(tgt, 0), padding_mask(src, 0)
    packed_x = tgt_rows.pack(x)

    expected, _ = attn(x, x, x, self_mask)
    got = attn.forward_packed(packed_x, packed_x, self_mask, tgt_rows, tgt_rows)
    torch.testing.assert_close(got, expected[tgt != 0], atol=1e-5, rtol=1e-5)

    expected, _ = attn(x, memory, memory, cross_mask)
    got = attn.forward_packed(packed_x, src_rows.pack(memory), cross_mask, tgt_rows, src_rows)
    torch.testing.assert_close(got, expected[tgt != 0], atol=1e-5, rtol=1e-5)


def test_rounded_rows_add_filler_rows_that_unpack_leaves_out() -> None:
    ids = torch.tensor([[5, 6, 7, 8], [8, 9, 0, 0], [5, 0, 0, 0]])
    rows = Packing.from_mask(ids != 0, round_rows=True)
    assert rows.count == 7 and len(rows.index) == 8  # rounded up to a multiple of 8
    assert rows.index[7] == rows.index[0]  # a copy of the first real token
    x = torch.randn(3, 4, 2)
    packed = rows.pack(x)  # (8, 2)
    packed[7] = 1e6  # whatever a filler row holds, no real position sees it
    back = rows.unpack(packed)
    torch.testing.assert_close(back[ids != 0], x[ids != 0])
    assert torch.all(back[ids == 0] == 0)

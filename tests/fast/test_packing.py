import torch

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


def test_an_empty_batch_packs_to_no_rows() -> None:
    ids = torch.zeros(2, 3, dtype=torch.long)
    rows = Packing.from_mask(ids != 0, round_rows=True)
    assert rows.count == 0 and len(rows.index) == 0
    packed = rows.pack(torch.randn(2, 3, 4))
    assert packed.shape == (0, 4)
    assert torch.equal(rows.unpack(packed), torch.zeros(2, 3, 4))

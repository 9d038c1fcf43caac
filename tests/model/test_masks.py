import pytest
import torch

from qkv.model.masks import causal_mask, check_mask, decoder_self_mask, padding_mask


def test_padding_mask_shape_and_values() -> None:
    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    mask = padding_mask(ids, pad_id=0)
    assert mask.shape == (2, 1, 1, 3)
    assert mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]


def test_causal_mask_is_lower_triangular() -> None:
    mask = causal_mask(4)
    assert mask.shape == (1, 1, 4, 4)
    assert mask[0, 0].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]


def test_decoder_mask_combines_with_and() -> None:
    ids = torch.tensor([[1, 5, 0]])
    mask = decoder_self_mask(ids, pad_id=0)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, False],
    ]


def test_check_mask_refuses_all_but_boolean_masks() -> None:
    check_mask(None)
    check_mask(causal_mask(3))
    for dtype in (torch.float32, torch.long, torch.uint8):
        with pytest.raises(TypeError, match=r"self_mask must be boolean \(True = may attend\)"):
            check_mask(causal_mask(3).to(dtype), "self_mask")

import math

import pytest
import torch

from qkv.model.embedding import TokenEmbedding, check_ids, make_embeddings, sinusoid_table


def test_sinusoids_match_the_paper() -> None:
    d_model = 8
    table = sinusoid_table(50, d_model)
    for pos in (0, 1, 17, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_token_embedding_is_scaled_by_sqrt_d_model() -> None:
    embedding = TokenEmbedding(10, 16, pad_id=0)
    ids = torch.tensor([[3, 4]])
    torch.testing.assert_close(embedding(ids), embedding.table.weight[ids] * 4.0)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_a_position_held_in_a_tensor_embeds_like_an_offset(positions: str) -> None:
    embeddings = make_embeddings(30, 16, 0, 0.0, 20, positions)
    ids = torch.tensor([[3], [7]])  # (B, 1)
    for offset in (0, 5, 19):
        torch.testing.assert_close(
            embeddings.at(ids, torch.tensor([offset])), embeddings(ids, offset=offset)
        )


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (torch.tensor([5, 6, 7]), r"must be \(B, L\) token ids, got shape \(3,\)"),
        (torch.ones(1, 2, 3, dtype=torch.long), r"got shape \(1, 2, 3\)"),
        (torch.tensor([[5.0, 6.0]]), r"must hold int64 \(or int32\) token ids, got torch.float32"),
        (torch.tensor([[5, 6]], dtype=torch.uint8), "got torch.uint8"),
        (torch.tensor([[5, 40]]), r"token id 40, outside the vocabulary \[0, 40\)"),
        (torch.tensor([[-1, 5]]), r"token id -1, outside the vocabulary"),
    ],
)
def test_token_ids_are_checked(ids: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_ids(ids, 40, "source ids")
    check_ids(torch.tensor([[0, 39]]), 40, "source ids")
    check_ids(torch.tensor([[0, 39]], dtype=torch.int32), 40, "source ids")
    check_ids(torch.zeros(0, 0, dtype=torch.long), 40, "source ids")


def test_token_ids_must_be_a_tensor() -> None:
    with pytest.raises(TypeError, match="source ids must be a torch tensor of token ids, got list"):
        check_ids([[5, 6]], 40, "source ids")  # type: ignore[arg-type]

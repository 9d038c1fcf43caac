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
def test_an_offset_embeds_the_positions_from_there(positions: str) -> None:
    embeddings = make_embeddings(30, 16, 0, 0.0, 20, positions)
    ids = torch.randint(1, 30, (2, 20))
    whole = embeddings(ids)  # (B, 20, D)
    for offset, length in ((0, 1), (5, 3), (19, 1)):
        part = embeddings(ids[:, offset : offset + length], offset=offset)
        torch.testing.assert_close(part, whole[:, offset : offset + length])


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_positions_beyond_max_len_are_refused(positions: str) -> None:
    embeddings = make_embeddings(30, 16, 0, 0.0, 20, positions)
    with pytest.raises(ValueError, match=r"sequence of 21 positions exceeds the model's max_len"):
        embeddings(torch.ones(1, 21, dtype=torch.long))
    with pytest.raises(ValueError, match=r"sequence of 21 positions exceeds"):
        embeddings(torch.ones(1, 2, dtype=torch.long), offset=19)
    table = embeddings.positions  # used alone, as the walk-through does
    assert table(2, offset=18).shape == (2, 16)
    for length, offset, first, last in ((2, 19, 19, 20), (1, 20, 20, 20), (1, -1, -1, -1)):
        with pytest.raises(
            ValueError, match=f"positions {first} to {last} are outside the table of 20 positions"
        ):
            table(length, offset)


def test_embeddings_are_token_plus_position_then_dropout() -> None:
    embeddings = make_embeddings(30, 16, 0, 0.5, 20, "sinusoidal")
    ids = torch.tensor([[3, 4, 0]])
    expected = embeddings.token(ids) + sinusoid_table(20, 16)[:3]
    torch.testing.assert_close(embeddings.eval()(ids), expected)
    dropped = embeddings.train()(ids)
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], expected[kept] * 2.0)  # 1 / (1 - p)
    assert not kept.all()


def test_a_shared_token_table_is_used_as_given() -> None:
    token = TokenEmbedding(30, 16, pad_id=0)
    embeddings = make_embeddings(30, 16, 0, 0.0, 20, "learned", token)
    assert embeddings.token is token
    assert embeddings.positions.table.weight.shape == (20, 16)


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

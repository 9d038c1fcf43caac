import pytest
import torch
import torch.nn.functional as F

from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

BOS, EOS = 1, 2


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request: pytest.FixtureRequest) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(tiny_config(norm_first=request.param)).eval()


def test_shapes(model: Seq2SeqTransformer) -> None:
    src, tgt = random_ids(3, 7), random_ids(3, 5)
    assert model(src, tgt).shape == (3, 5, 40)
    logits, maps = model.forward_with_maps(src, tgt)
    assert logits.shape == (3, 5, 40)
    assert [m.shape for m in maps.encoder_self] == [(3, 4, 7, 7)] * 2
    assert [m.shape for m in maps.decoder_self] == [(3, 4, 5, 5)] * 2
    assert [m.shape for m in maps.cross] == [(3, 4, 5, 7)] * 2
    torch.testing.assert_close(logits, model(src, tgt), atol=1e-5, rtol=1e-5)


def test_joint_vocabulary_ties_all_three_tables() -> None:
    model = Seq2SeqTransformer(tiny_config())
    src_table = model.encoder.embeddings.token.table.weight
    assert model.decoder.embeddings.token.table.weight is src_table
    assert model.output.weight is src_table
    separate = Seq2SeqTransformer(tiny_config(tgt_vocab_size=30))
    assert separate.output.weight.shape == (30, 32)
    assert separate.output.weight is not separate.encoder.embeddings.token.table.weight


def test_padding_does_not_change_real_positions(model: Seq2SeqTransformer) -> None:
    src, tgt = random_ids(2, 6), random_ids(2, 4)
    padded_src = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    padded_tgt = torch.cat([tgt, torch.zeros(2, 2, dtype=torch.long)], dim=1)
    expected = model(src, tgt)
    torch.testing.assert_close(model(padded_src, padded_tgt)[:, :4], expected, atol=1e-5, rtol=1e-5)


def test_mixed_lengths_in_a_batch_equal_each_sentence_alone(model: Seq2SeqTransformer) -> None:
    short_src, long_src = random_ids(1, 3), random_ids(1, 6)
    tgt = random_ids(2, 4)
    src = torch.zeros(2, 6, dtype=torch.long)
    src[0, :3], src[1] = short_src[0], long_src[0]
    batch = model(src, tgt)
    torch.testing.assert_close(batch[0], model(short_src, tgt[:1])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(batch[1], model(long_src, tgt[1:])[0], atol=1e-5, rtol=1e-5)


def test_future_target_tokens_do_not_leak(model: Seq2SeqTransformer) -> None:
    src, tgt = random_ids(2, 6), random_ids(2, 5)
    changed = tgt.clone()
    changed[:, 3] = (changed[:, 3] + 1 - 5) % 35 + 5
    before, after = model(src, tgt), model(src, changed)
    torch.testing.assert_close(before[:, :3], after[:, :3])
    assert not torch.allclose(before[:, 3:], after[:, 3:])


def test_all_padding_source_is_finite(model: Seq2SeqTransformer) -> None:
    src = torch.zeros(2, 4, dtype=torch.long)
    src[0, :2] = 7
    assert torch.isfinite(model(src, random_ids(2, 3))).all()


@pytest.mark.parametrize("rows", [3, 70])
def test_cached_decoding_equals_full_forward(model: Seq2SeqTransformer, rows: int) -> None:
    src = random_ids(rows, 6)
    src[1, 4:] = 0
    tgt = random_ids(rows, 7)
    full = model(src, tgt)  # (B, T, V)
    with torch.inference_mode():
        memory, src_mask, _ = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=7)
        steps = [model.decode_step(tgt[:, t], cache) for t in range(7)]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_cached_decoding_of_an_all_padding_source_equals_full_forward(
    model: Seq2SeqTransformer,
) -> None:
    src, tgt = random_ids(2, 4), random_ids(2, 3)
    src[1] = 0  # nothing to attend to: cross-attention's context is zero, in both ways
    memory, src_mask, _ = model.encode(src)
    cache = model.init_cache(memory, src_mask, max_len=3)
    steps = [model.decode_step(tgt[:, t], cache) for t in range(3)]
    decoded = torch.stack(steps, dim=1)  # (B, T, V)
    assert torch.isfinite(decoded).all()
    torch.testing.assert_close(decoded, model(src, tgt), atol=1e-5, rtol=1e-5)


def test_cache_select_reorders_rows(model: Seq2SeqTransformer) -> None:
    src, tgt = random_ids(3, 5), random_ids(3, 4)
    memory, src_mask, _ = model.encode(src)
    cache = model.init_cache(memory, src_mask, max_len=4)
    for t in range(2):
        model.decode_step(tgt[:, t], cache)
    order = torch.tensor([2, 0, 0])
    cache.select(order)
    steps = [model.decode_step(tgt[order, t], cache) for t in range(2, 4)]
    full = model(src[order], tgt[order])
    torch.testing.assert_close(torch.stack(steps, dim=1), full[:, 2:], atol=1e-5, rtol=1e-5)


def test_eval_mode_is_deterministic() -> None:
    model = Seq2SeqTransformer(tiny_config(dropout=0.3)).eval()
    src, tgt = random_ids(2, 5), random_ids(2, 4)
    assert torch.equal(model(src, tgt), model(src, tgt))


def test_gradients_reach_every_trainable_parameter(model: Seq2SeqTransformer) -> None:
    model.train()
    logits = model(random_ids(2, 5), random_ids(2, 4))
    logits.logsumexp(-1).sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    sinusoids = model.encoder.embeddings.positions.table
    assert not sinusoids.requires_grad and "table" not in dict(model.named_parameters())
    assert "encoder.embeddings.positions.table" not in model.state_dict()


def test_learned_positions_are_trained() -> None:
    model = Seq2SeqTransformer(tiny_config(positions="learned"))
    model(random_ids(2, 5), random_ids(2, 4)).sum().backward()
    grad = model.encoder.embeddings.positions.table.weight.grad
    assert grad is not None and grad[:5].abs().sum() > 0


def test_inputs_that_do_not_pair_up_are_refused(model: Seq2SeqTransformer) -> None:
    src, tgt = random_ids(2, 5), random_ids(1, 4)
    with pytest.raises(ValueError, match="2 source rows but 1 target rows"):
        model(src, tgt)
    with pytest.raises(ValueError, match="2 source rows but 1 target rows"):
        model.forward_with_maps(src, tgt)
    with pytest.raises(ValueError, match=r"target ids holds token id 40"):
        model(src, torch.full((2, 3), 40))
    with pytest.raises(ValueError, match=r"source ids must be \(B, L\) token ids"):
        model(src[0], tgt)
    memory, src_mask, _ = model.encode(src)
    with pytest.raises(ValueError, match=r"memory must be \(B, S, D\), got shape \(5, 32\)"):
        model.decode(tgt[:, :1], memory[0], src_mask)


def test_decode_step_checks_its_tokens(model: Seq2SeqTransformer) -> None:
    memory, src_mask, _ = model.encode(random_ids(2, 5))
    cache = model.init_cache(memory, src_mask, 4)
    shape = r"tokens must be a tensor of shape \(2,\), the newest token of each row"
    for wrong, message in (
        (torch.ones(2, 1, dtype=torch.long), shape + r".*got \(2, 1\)"),  # (N, 1), as forward
        (torch.ones(3, dtype=torch.long), shape + r".*got \(3,\)"),
        ([1, 1], shape + ".*got list"),
        (torch.tensor([40, 1]), r"tokens holds token id 40, outside the vocabulary"),
        (torch.ones(2), r"tokens must hold int64"),
    ):
        with pytest.raises(ValueError, match=message):
            model.decode_step(wrong, cache)  # type: ignore[arg-type]
    assert cache.length == 0  # nothing was appended
    assert model.decode_step(torch.ones(2, dtype=torch.long), cache).shape == (2, 40)


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_tiny_model_learns_the_task(task: str) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(vocab_size=16, d_model=64, d_ff=128, n_heads=4))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
    # Decayed to zero: at a constant rate Adam's loss can spike in the last steps, at a step
    # that depends on float rounding (the CPU's kernels, the number of threads).
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / 300)
    batch, length = 64, 6

    def make_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        src = torch.randint(5, 16, (batch, length))
        out = src if task == "copy" else src.flip(1)
        tgt_in = torch.cat([torch.full((batch, 1), BOS), out], dim=1)
        labels = torch.cat([out, torch.full((batch, 1), EOS)], dim=1)
        return src, tgt_in, labels

    for _ in range(300):
        src, tgt_in, labels = make_batch()
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    src, tgt_in, labels = make_batch()
    with torch.no_grad():
        accuracy = (model(src, tgt_in).argmax(-1) == labels).float().mean().item()
    assert accuracy > 0.97, accuracy

import pytest
import torch
from torch import Tensor

from qkv.model.kv_cache import KVCache, changed_steps
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_select_copies_the_filled_steps_into_reordered_rows() -> None:
    cache = KVCache(rows=3, n_heads=2, head_dim=4, max_len=5)
    k, v = torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 4)
    cache.append(k, v)
    order = torch.tensor([2, 2, 0, 1])  # more rows than before, then fewer
    cache.select(order)
    keys, values = cache.append(torch.zeros(4, 2, 1, 4), torch.zeros(4, 2, 1, 4))
    torch.testing.assert_close(keys[:, :, :2], k[order])
    torch.testing.assert_close(values[:, :, :2], v[order])
    cache.select(torch.tensor([3, 0]))
    torch.testing.assert_close(cache.keys[:, :, :2], k[order][[3, 0]])


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "under autograd"])
def test_beams_share_cross_attention_entries_and_decode_like_the_full_forward(grad: bool) -> None:
    model = Seq2SeqTransformer(tiny_config()).eval().requires_grad_(grad)
    src = random_ids(3, 6)
    src[1, 4:] = 0
    memory, src_mask, _ = model.encode(src)
    cache = model.init_cache(memory, src_mask, max_len=6)
    sources = torch.arange(3)  # the source of each decoder row
    history = torch.full((3, 1), 1)  # tokens fed so far, BOS first

    def step_and_check() -> None:
        nonlocal history
        logits = model.decode_step(history[:, -1], cache)  # (N, V)
        full = model(src[sources], history)[:, -1]  # (N, V)
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
        history = torch.cat([history, random_ids(len(history), 1)], dim=1)

    def select(rows: list[int]) -> None:
        nonlocal sources, history
        index = torch.tensor(rows)
        cache.select(index, shared_prefixes(index))
        sources, history = sources[index], history[index]

    def shared_prefixes(index: Tensor) -> Tensor:
        """How many tokens fed (BOS first) place i shares with old row index[i]: its `held`."""
        fed = history[:, :-1]  # the newest token is not fed yet
        held = []
        for place, row in enumerate(index.tolist()):
            same = place < len(fed) and bool(sources[place] == sources[row])
            agree = (fed[place] == fed[row]).long().cumprod(0).sum() if same else 0
            held.append(int(agree))
        return torch.tensor(held)

    with torch.set_grad_enabled(grad):
        step_and_check()
        select([0, 0, 1, 1, 2, 2])  # beam expansion: 3 groups of 2 rows
        assert cache.group_size == 2 and cache.source[0].keys.size(0) == 3
        step_and_check()
        entries = cache.source[0].keys
        kept = entries.clone()
        select([1, 0, 3, 3, 4, 5])  # beams reordered within their sentences
        assert cache.source[0].keys.data_ptr() == entries.data_ptr()  # nothing gathered
        assert torch.equal(cache.source[0].keys, kept)
        step_and_check()
        select([0, 1, 4, 5])  # sentence 1 finished: sentence 2 moves into its entry
        assert cache.group_size == 2 and cache.source[0].keys.size(0) == 2
        if not grad:  # moved in place; under autograd, gathered into new tensors
            assert cache.source[0].keys.data_ptr() == entries.data_ptr()
        assert cache.source[0].keys.requires_grad == grad
        step_and_check()
        select([3, 0, 0])  # rows in no equal groups: one entry per row
        assert cache.group_size == 1 and cache.source[0].keys.size(0) == 3
        step_and_check()


def test_select_writes_in_place_and_keeps_rows_that_stay() -> None:
    cache = KVCache(rows=4, n_heads=2, head_dim=3, max_len=6)
    k, v = torch.randn(4, 2, 3, 3), torch.randn(4, 2, 3, 3)
    cache.append(k, v)
    buffer = cache.keys.data_ptr()
    for order in ([0, 0, 2, 1], [3, 1], [1, 0, 1]):  # reorder, drop rows, grow back to 3
        index = torch.tensor(order)
        k, v = k[index], v[index]
        cache.select(index)
        torch.testing.assert_close(cache.keys[:, :, :3], k)
        torch.testing.assert_close(cache.values[:, :, :3], v)
        assert cache.keys.data_ptr() == buffer  # no new memory while rows <= 4
    cache.select(torch.tensor([0, 1, 2, 2, 1]))  # more rows than ever: new buffers
    assert cache.keys.shape[0] == 5 and cache.keys.data_ptr() != buffer


def test_rows_keep_their_steps_and_take_new_ones_as_they_shrink_and_grow() -> None:
    cache = KVCache(rows=3, n_heads=2, head_dim=4, max_len=5)
    keys, values = [torch.randn(3, 2, 1, 4)], [torch.randn(3, 2, 1, 4)]  # step by step
    cache.append(keys[0], values[0])
    for order in ([2, 0], [0, 0, 1, 1], [3, 1, 2]):  # fewer rows, more than ever, fewer
        index = torch.tensor(order)
        cache.select(index)
        keys, values = [k[index] for k in keys], [v[index] for v in values]
        keys.append(torch.randn(len(order), 2, 1, 4))
        values.append(torch.randn(len(order), 2, 1, 4))
        got_keys, got_values = cache.append(keys[-1], values[-1])
        assert got_keys.shape == (len(order), 2, len(keys), 4)
        torch.testing.assert_close(got_keys, torch.cat(keys, dim=2))
        torch.testing.assert_close(got_values, torch.cat(values, dim=2))
    assert cache.length == 4


def test_a_full_cache_refuses_more_steps() -> None:
    cache = KVCache(rows=2, n_heads=1, head_dim=4, max_len=3)
    cache.append(torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4))
    with pytest.raises(RuntimeError, match=r"KV cache full: 2 \+ 2 > 3 steps"):
        cache.append(torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4))
    assert cache.length == 2


def test_select_copies_only_the_steps_a_place_does_not_hold_already() -> None:
    cache = KVCache(rows=5, n_heads=2, head_dim=3, max_len=6)
    k, v = torch.randn(5, 2, 4, 3), torch.randn(5, 2, 4, 3)
    cache.append(k, v)
    rows = torch.tensor([0, 0, 1, 2, 1])  # places 1, 2, 3, 4 take other rows
    held = torch.tensor([4, 2, 0, 4, 1])  # place 3 already holds all 4 steps of row 2
    cache.select(rows, changed_steps(rows, held, length=4, rows_held=5))
    moves = [(1, 0, 2), (2, 1, 0), (4, 1, 1)]  # (place, row, first step copied)
    for old, new in ((k, cache.keys), (v, cache.values)):
        expected = old.clone()
        for place, row, start in moves:
            expected[place, :, start:] = old[row, :, start:]  # the held steps left as they were
        torch.testing.assert_close(new[:, :, :4], expected)


def test_changed_steps_lists_each_moved_row_from_its_held_step() -> None:
    rows, held = torch.tensor([1, 1, 0, 0]), torch.tensor([0, 3, 2, 3])
    steps = changed_steps(rows, held, length=3, rows_held=6)
    # place 0 from step 0; place 1 stays; place 2 from step 2; place 3 holds all 3 steps
    moves = [(0, 1, t) for t in range(3)] + [(2, 0, 2)]  # (place, row, step)
    assert steps.to.tolist() == [t * 6 + p for p, _, t in moves]
    assert steps.source.tolist() == [t * 6 + r for _, r, t in moves]


def test_the_source_mask_moves_with_the_rows() -> None:
    model = Seq2SeqTransformer(tiny_config()).eval()
    src = random_ids(3, 5)
    src[0, 3:], src[2, 1:] = 0, 0
    memory, src_mask, _ = model.encode(src)
    cache = model.init_cache(memory, src_mask, max_len=4)
    assert (cache.rows, cache.length, cache.group_size) == (3, 0, 1)
    assert len(cache.self_attn) == len(cache.source) == model.config.n_decoder_layers
    cache.select(torch.tensor([2, 2, 0, 0]))  # gathered: 2 groups of 2
    assert (cache.rows, cache.group_size) == (4, 2)
    assert torch.equal(cache.src_mask, src_mask[[2, 0]])
    cache.select(torch.tensor([2, 3]))  # sentence 2 finished: sentence 0 moves in place
    assert (cache.rows, cache.group_size) == (2, 2)
    assert torch.equal(cache.src_mask, src_mask[[0]])
    k, v = model.decoder.layers[0].cross_attn.project_kv(memory[[0]])
    torch.testing.assert_close(cache.source[0].keys, k)
    torch.testing.assert_close(cache.source[0].values, v)

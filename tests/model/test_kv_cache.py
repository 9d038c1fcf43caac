import pytest
import torch
from torch import Tensor

from qkv.model.kv_cache import KVCache, changed_steps
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import random_ids, tiny_config


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
        assert cache.group_size == 2 and cache.cross_keys[0].size(0) == 3
        step_and_check()
        entries = cache.cross_keys[0]
        select([1, 0, 3, 3, 4, 5])  # beams reordered within their sentences
        assert cache.cross_keys[0] is entries  # nothing gathered
        step_and_check()
        select([0, 1, 4, 5])  # sentence 1 finished: sentence 2 moves into its entry
        assert cache.group_size == 2 and cache.cross_keys[0].size(0) == 2
        if not grad:  # moved in place; under autograd, gathered into new tensors
            assert cache.cross_keys[0].data_ptr() == entries.data_ptr()
        assert cache.cross_keys[0].requires_grad == grad
        step_and_check()
        select([3, 0, 0])  # rows in no equal groups: one entry per row
        assert cache.group_size == 1 and cache.cross_keys[0].size(0) == 3
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


def test_rows_are_step_major_and_stay_so_when_they_grow() -> None:
    cache = KVCache(rows=3, n_heads=2, head_dim=4, max_len=5)
    k = torch.randn(3, 2, 1, 4)
    keys, _ = cache.append(k, torch.randn(3, 2, 1, 4))
    # A step's keys for all rows are one block; N and H merge without a copy.
    assert cache.keys.stride() == (8, 4, 24, 1)  # (N, H, T, K) over (T, N, H, K)
    assert keys.reshape(6, 1, 4).data_ptr() == keys.data_ptr()
    cache.select(torch.tensor([2, 0]))  # fewer rows: moved in place
    assert cache.keys.shape == (2, 2, 5, 4) and cache.keys.stride() == (8, 4, 24, 1)
    cache.select(torch.tensor([0, 0, 1, 1]))  # more rows than ever (beams): new buffers
    assert cache.keys.shape == (4, 2, 5, 4) and cache.keys.stride() == (8, 4, 32, 1)
    torch.testing.assert_close(cache.keys[:, :, :1], k[[2, 2, 0, 0]])


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


def test_the_source_bias_is_the_source_mask_and_moves_with_it() -> None:
    model = Seq2SeqTransformer(tiny_config()).eval()
    src = random_ids(3, 5)
    src[0, 3:], src[2, 1:] = 0, 0
    memory, src_mask, _ = model.encode(src)
    cache = model.init_cache(memory, src_mask, max_len=4)
    heads = model.config.n_heads

    def bias_of(mask: Tensor) -> Tensor:  # (G, 1, 1, S) -> (G * H, 1, S)
        expanded = mask.expand(-1, heads, -1, -1).flatten(0, 1)
        return torch.zeros(expanded.shape).masked_fill_(~expanded, float("-inf"))

    assert not cache.empty_sources
    assert torch.equal(cache.source_bias, bias_of(src_mask))
    cache.select(torch.tensor([2, 2, 0, 0]))  # gathered: 2 groups of 2
    assert torch.equal(cache.source_bias, bias_of(src_mask[[2, 0]]))
    cache.select(torch.tensor([2, 3]))  # sentence 2 finished: sentence 0 moves in place
    assert torch.equal(cache.source_bias, bias_of(src_mask[[0]]))

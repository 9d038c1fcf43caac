import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.model.kv_cache import KVCache, SourceKV
from qkv.model.layers import DecoderLayer, EncoderLayer, FeedForward
from qkv.model.masks import causal_mask, decoder_self_mask, padding_mask
from tests.model.helpers import overfit, padded_ids

pytestmark = pytest.mark.usefixtures("one_thread")

D, H, FF = 16, 2, 32

# Our names -> torch.nn.Transformer{Encoder,Decoder}Layer's, by prefix.
_TORCH_NAMES = {
    "self_attn.in_proj.weight": "self_attn.in_proj_weight",
    "self_attn.in_proj.bias": "self_attn.in_proj_bias",
    "cross_attn.in_proj.weight": "multihead_attn.in_proj_weight",
    "cross_attn.in_proj.bias": "multihead_attn.in_proj_bias",
    "cross_attn.out_proj": "multihead_attn.out_proj",
    "ffn.linear1": "linear1",
    "ffn.linear2": "linear2",
    "self_attn_norm": "norm1",
}


def torch_name(layer: nn.Module, name: str) -> str:
    """The name torch's layer gives our layer's parameter `name`."""
    names = dict(_TORCH_NAMES)
    if isinstance(layer, DecoderLayer):
        names.update(cross_attn_norm="norm2", ffn_norm="norm3")
    else:
        names.update(ffn_norm="norm2")
    prefix = next((p for p in names if name.startswith(p)), "")
    return names[prefix] + name[len(prefix) :] if prefix else name


def torch_state(layer: nn.Module) -> dict[str, Tensor]:
    """Our layer's state dict under torch's names."""
    return {torch_name(layer, name): t for name, t in layer.state_dict().items()}


def batch() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Targets x (B, T, D) and memory (B, S, D) with their padded ids (B, T), (B, S)."""
    tgt, src = padded_ids([5, 3, 1], 5), padded_ids([4, 4, 2], 4)
    return torch.randn(3, 5, D), torch.randn(3, 4, D), tgt, src


def test_feed_forward_is_two_linear_layers_around_the_activation() -> None:
    x = torch.randn(2, 3, D)
    for activation, function in (("relu", F.relu), ("gelu", F.gelu)):
        ffn = FeedForward(D, FF, 0.5, activation).eval()
        expected = ffn.linear2(function(ffn.linear1(x)))
        torch.testing.assert_close(ffn(x), expected)
        assert ffn(x).shape == (2, 3, D)
    hidden = ffn.linear1(x)
    ffn.train()
    torch.manual_seed(1)
    dropped = ffn(x)
    torch.manual_seed(1)
    torch.testing.assert_close(dropped, ffn.linear2(F.dropout(F.gelu(hidden), 0.5)))


def test_an_unknown_activation_is_refused() -> None:
    for activation in ("GELU", "tanh"):
        with pytest.raises(
            ValueError, match=f"activation must be 'relu' or 'gelu', got '{activation}'"
        ):
            FeedForward(D, FF, 0.0, activation)
        with pytest.raises(ValueError, match="activation must be"):
            EncoderLayer(D, 2, FF, 0.0, activation=activation)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_equals_torch_transformer_encoder_layer(
    norm_first: bool, activation: str
) -> None:
    ours = EncoderLayer(D, H, FF, 0.0, activation=activation, norm_first=norm_first)
    reference = nn.TransformerEncoderLayer(
        D, H, FF, 0.0, activation, batch_first=True, norm_first=norm_first
    )
    reference.load_state_dict(torch_state(ours))
    x, _, ids, _ = batch()
    x.requires_grad_(True)
    real = (ids != 0)[..., None]
    grad = torch.randn(3, 5, D) * real  # the padding positions reach no loss

    def run(layer: nn.Module, out: Tensor) -> dict[str, Tensor]:
        """The output and every gradient, under torch's names."""
        out.backward(grad)
        rename = (lambda n: torch_name(ours, n)) if layer is ours else (lambda n: n)
        grads = {rename(n): p.grad for n, p in layer.named_parameters()}
        assert x.grad is not None
        grads.update(output=out * real, x=x.grad.clone())
        x.grad = None
        return grads

    mine = run(ours, ours(x, padding_mask(ids, 0))[0])
    theirs = run(reference, reference(x, src_key_padding_mask=ids == 0))
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        torch.testing.assert_close(value, theirs[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_layer_equals_torch_transformer_decoder_layer(norm_first: bool) -> None:
    ours = DecoderLayer(D, H, FF, 0.0, norm_first=norm_first).eval()
    reference = nn.TransformerDecoderLayer(
        D, H, FF, 0.0, batch_first=True, norm_first=norm_first
    ).eval()
    reference.load_state_dict(torch_state(ours))
    x, memory, tgt, src = batch()
    expected = reference(
        x,
        memory,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(5) != 0,
        tgt_key_padding_mask=tgt == 0,
        memory_key_padding_mask=src == 0,
    )
    for need_weights in (False, True):
        out, self_weights, cross_weights = ours(
            x, memory, decoder_self_mask(tgt, 0), padding_mask(src, 0), need_weights
        )
        real = tgt != 0
        torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)
        if need_weights:
            assert self_weights is not None and self_weights.shape == (3, H, 5, 5)
            assert cross_weights is not None and cross_weights.shape == (3, H, 5, 4)
        else:
            assert self_weights is None and cross_weights is None


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_layer_weights_path_equals_fused_path_and_ignores_padding(
    norm_first: bool,
) -> None:
    layer = EncoderLayer(D, H, FF, 0.0, norm_first=norm_first).eval()
    x, _, ids, _ = batch()
    mask = padding_mask(ids, 0)
    fused, no_weights = layer(x, mask)
    eager, weights = layer(x, mask, need_weights=True)
    assert no_weights is None and weights is not None and weights.shape == (3, H, 5, 5)
    torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)
    changed = x.clone()
    changed[ids == 0] = torch.randn(int((ids == 0).sum()), D) * 10
    real = ids != 0
    torch.testing.assert_close(layer(changed, mask)[0][real], fused[real])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_layer_future_targets_and_padded_memory_change_nothing(norm_first: bool) -> None:
    layer = DecoderLayer(D, H, FF, 0.0, norm_first=norm_first).eval()
    x, memory, tgt, src = batch()
    self_mask, cross_mask = decoder_self_mask(tgt, 0), padding_mask(src, 0)
    before, _, _ = layer(x, memory, self_mask, cross_mask)
    changed_x, changed_memory = x.clone(), memory.clone()
    changed_x[:, 3:] = torch.randn(3, 2, D)  # the last two target positions
    changed_memory[src == 0] = torch.randn(int((src == 0).sum()), D) * 10
    after, _, _ = layer(changed_x, changed_memory, self_mask, cross_mask)
    real = tgt[:, :3] != 0
    torch.testing.assert_close(after[:, :3][real], before[:, :3][real])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_layer_with_a_cache_equals_the_whole_sequence(norm_first: bool) -> None:
    layer = DecoderLayer(D, H, FF, 0.0, norm_first=norm_first).eval()
    x, memory, _, src = batch()
    cross_mask = padding_mask(src, 0)
    full, _, _ = layer(x, memory, causal_mask(5), cross_mask)
    cache = KVCache(rows=3, n_heads=H, head_dim=D // H, max_len=5)
    source = SourceKV(*layer.cross_attn.project_kv(memory))
    steps = [
        layer(x[:, t : t + 1], x[:, t : t + 1], None, cross_mask, cache=(cache, source))[0]
        for t in range(5)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_a_tiny_layer_fits_a_batch(kind: str) -> None:
    x, memory, tgt, src = batch()
    target = torch.randn(3, 5, D)
    layer: nn.Module
    if kind == "encoder":
        layer = EncoderLayer(D, H, FF, 0.0)

        def loss() -> Tensor:
            return F.mse_loss(layer(x, padding_mask(tgt, 0))[0], target)

    else:
        layer = DecoderLayer(D, H, FF, 0.0)
        masks = decoder_self_mask(tgt, 0), padding_mask(src, 0)

        def loss() -> Tensor:
            return F.mse_loss(layer(x, memory, *masks)[0], target)

    first, last = overfit(layer.parameters(), loss, steps=100)
    assert last < 0.1 * first, (first, last)

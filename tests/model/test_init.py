import math

import torch

from qkv.model.init import xavier_init
from qkv.model.seq2seq import Seq2SeqTransformer
from tests.model.helpers import tiny_config


def test_xavier_matrices_zero_biases_and_a_zero_padding_vector() -> None:
    model = Seq2SeqTransformer(tiny_config(tgt_vocab_size=30, pad_id=3))
    for name, param in model.named_parameters():
        if param.dim() > 1:
            fan_out, fan_in = param.shape[:2]
            bound = math.sqrt(6 / (fan_in + fan_out))
            assert param.abs().max() <= bound, name
            assert param.std() > bound / 4, name  # spread over the range, not near zero
        elif name.endswith("bias"):
            assert torch.all(param == 0), name
        else:  # layer norm weights keep their ones
            assert torch.all(param == 1), name
    for table in (model.encoder.embeddings.token.table, model.decoder.embeddings.token.table):
        assert torch.all(table.weight[3] == 0) and table.weight[4].abs().sum() > 0


def test_xavier_init_of_any_module() -> None:
    layer = torch.nn.Sequential(torch.nn.Embedding(5, 4, padding_idx=0), torch.nn.Linear(4, 4))
    xavier_init(layer, pad_id=0)
    assert torch.all(layer[0].weight[0] == 0) and torch.all(layer[1].bias == 0)

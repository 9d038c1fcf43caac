"""Decoding loads no compiler (torch.compile's machinery, once imported, holds some 120 MB),
with the reference model or with the model turned fast, as `Translator.load` gives it."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys, torch
from qkv import fast
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.model.config import ModelConfig
from qkv.model.seq2seq import Seq2SeqTransformer

torch.manual_seed(0)
config = ModelConfig(
    vocab_size=50, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1
)
model = Seq2SeqTransformer(config)
sources = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
for decoded in (model, fast.apply(model)):
    for beam in (1, 3):
        options = DecodeOptions(beam_size=beam, max_len_b=5)
        translate_ids(decoded, sources, options, torch.device("cpu"))
print(sorted(name for name in ("torch._dynamo", "torch._inductor") if name in sys.modules))
"""


def test_greedy_and_beam_decoding_import_no_compiler() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"

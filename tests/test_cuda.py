"""The CUDA paths: the same model gives the same results on the GPU as on the CPU, and a bf16
training run on the GPU learns. Skipped where torch sees no CUDA device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qkv.cli import main
from qkv.data.tokenizer import Tokenizer
from qkv.inference.classifier import Classifier
from qkv.inference.graphed import StaticDecoder
from qkv.inference.incremental import ModelDecoder
from qkv.inference.precision import decoding_model
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.inference.translator import Translator
from qkv.model.classifier import TextClassifier
from qkv.model.seq2seq import Seq2SeqTransformer
from qkv.tasks.classification import ClassificationData
from qkv.tasks.dates import generate_date_pairs
from qkv.training.graphed import GraphedStep
from qkv.training.optimizer import adamw
from tests.inference.helpers import ReferenceDecoder
from tests.model.helpers import random_ids, tiny_config
from tests.tasks.helpers import write_dates
from tests.training.test_graphed import BATCHES, _task

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")


def random_sources(seed: int, count: int) -> list[list[int]]:
    """`count` source sentences of 1 to 11 token ids in [5, 60)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(5, 60, (int(n),), generator=generator).tolist()
        for n in torch.randint(1, 12, (count,), generator=generator)
    ]


@pytest.fixture
def model() -> Seq2SeqTransformer:
    return Seq2SeqTransformer(tiny_config(vocab_size=60, max_len=40)).eval()


def test_forward_on_cuda_equals_cpu(model: Seq2SeqTransformer) -> None:
    src, tgt = random_ids(5, 9, vocab=60), random_ids(5, 7, vocab=60)
    src[1, 5:] = 0
    on_cpu = model(src, tgt)  # (B, T, V)
    on_gpu = model.to(CUDA)(src.to(CUDA), tgt.to(CUDA)).cpu()
    torch.testing.assert_close(on_gpu, on_cpu, atol=1e-4, rtol=1e-4)


def test_cached_decoding_on_cuda_equals_full_forward(model: Seq2SeqTransformer) -> None:
    model.to(CUDA)
    src, tgt = random_ids(4, 6, vocab=60).to(CUDA), random_ids(4, 7, vocab=60).to(CUDA)
    src[2, 3:] = 0
    full = model(src, tgt)  # (B, T, V)
    with torch.inference_mode():
        memory, src_mask, _ = model.encode(src)
        cache = model.init_cache(memory, src_mask, max_len=7)
        steps = [model.decode_step(tgt[:, t], cache) for t in range(7)]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_search_on_cuda_finds_what_it_finds_on_cpu(
    model: Seq2SeqTransformer, beam_size: int
) -> None:
    sources = random_sources(seed=3, count=24)
    options = DecodeOptions(beam_size=beam_size, max_tokens=200)
    on_cpu = translate_ids(model, sources, options, torch.device("cpu"))
    on_gpu = translate_ids(model.to(CUDA), sources, options, CUDA)
    assert on_gpu == on_cpu


def test_sampling_on_cuda_draws_what_it_draws_on_cpu(model: Seq2SeqTransformer) -> None:
    sources = random_sources(seed=4, count=24)
    options = DecodeOptions(sampling=True, seed=7, max_tokens=200)
    on_cpu = translate_ids(model, sources, options, torch.device("cpu"))
    on_gpu = translate_ids(model.to(CUDA), sources, options, CUDA)
    assert on_gpu == on_cpu


def test_out_of_range_ids_are_refused_before_they_reach_the_gpu(
    model: Seq2SeqTransformer,
) -> None:
    with pytest.raises(ValueError, match=r"sources\[0\] holds token id 60"):
        translate_ids(model.to(CUDA), [[5, 60]], DecodeOptions(), CUDA)
    assert translate_ids(model, [[5, 6]], DecodeOptions(max_len_b=3), CUDA)  # still usable


def test_a_classifier_on_cuda_gives_the_cpus_probabilities() -> None:
    texts = ["a warm and funny film", "dull, slow and far too long", "I loved it", "the worst"]
    tokenizer = Tokenizer.train(texts * 5, vocab_size=60, min_frequency=1)
    config = tiny_config(vocab_size=tokenizer.vocab_size, n_decoder_layers=0, n_classes=2)
    data = ClassificationData(labels=["neg", "pos"], max_len=16)
    model = TextClassifier(config)
    on_cpu = Classifier(model, tokenizer, data, torch.device("cpu")).probabilities(texts)
    on_gpu = Classifier(model, tokenizer, data, CUDA).probabilities(texts)
    torch.testing.assert_close(on_gpu, on_cpu, atol=1e-5, rtol=1e-4)


def test_bf16_training_run_on_cuda_learns_and_translates(tmp_path: Path) -> None:
    data = write_dates(tmp_path / "data", train=400, val=30)
    run = tmp_path / "run"
    argv = ["train", "translation", "--data", str(data), "--src", "src", "--tgt", "tgt"]
    argv += ["--out", str(run), "--preset", "tiny", "vocab_size=120", "max_steps=60"]
    assert main([*argv, "eval_every=30", "device=cuda", "bf16=true"]) == 0
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    translator = Translator.load(run, device="cuda")
    assert translator.device.type == "cuda"
    found = translator.translate([s for s, _ in generate_date_pairs(4, seed=3)], beam_size=3)
    assert len(found) == 4 and all(isinstance(x, str) for x in found)


@pytest.mark.parametrize("bf16", [False, True])
def test_graph_replays_compute_the_eager_steps(model: Seq2SeqTransformer, bf16: bool) -> None:
    model.to(CUDA)
    src, tgt = random_ids(4, 6, vocab=60).to(CUDA), random_ids(8, 7, vocab=60).to(CUDA)
    src[2, 3:] = 0
    expand = torch.arange(4, device=CUDA).repeat_interleave(2)  # (8,) two rows per source
    reorder = torch.tensor([1, 0, 2, 2, 5, 4, 7, 6], device=CUDA)
    tolerance = 3e-2 if bf16 else 1e-4
    with torch.inference_mode(), torch.autocast("cuda", torch.bfloat16, enabled=bf16):
        eager, graphed = ModelDecoder(model, src, 7), StaticDecoder(model, src, 7, rows=8)
        reference = ReferenceDecoder(model, src, 7)
        for t in range(7):
            rows = 4 if t == 0 else 8
            expected, found = eager.step(tgt[:rows, t]), graphed.step(tgt[:rows, t])  # (N, V)
            torch.testing.assert_close(found, expected, atol=tolerance, rtol=tolerance)
            torch.testing.assert_close(
                reference.step(tgt[:rows, t]), expected, atol=tolerance, rtol=tolerance
            )
            for decoder in (eager, graphed, reference):
                decoder.select(expand if t == 0 else reorder)
        assert graphed.graph is not None


@pytest.mark.parametrize("beam_size", [1, 4])
def test_search_with_cuda_graphs_finds_what_eager_finds(
    model: Seq2SeqTransformer, beam_size: int
) -> None:
    sources = random_sources(seed=5, count=30)
    eager = DecodeOptions(beam_size=beam_size, max_tokens=200, cuda_graphs=False)
    graphed = DecodeOptions(beam_size=beam_size, max_tokens=200)
    model.to(CUDA)
    assert translate_ids(model, sources, graphed, CUDA) == translate_ids(
        model, sources, eager, CUDA
    )


WORKSPACES_SCRIPT = """
import gc
import torch
from qkv.inference.translate import DecodeOptions, translate_ids
from qkv.model.config import ModelConfig
from qkv.model.seq2seq import Seq2SeqTransformer

def workspaces_mb():
    # what clearing cuBLAS's workspaces (kept per stream, in torch's allocator) gives back
    gc.collect()
    before = torch.cuda.memory_allocated()
    torch._C._cuda_clearCublasWorkspaces()
    return (before - torch.cuda.memory_allocated()) / 2**20

config = ModelConfig(vocab_size=60, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
                     n_decoder_layers=2, dropout=0.0, max_len=40)
model = Seq2SeqTransformer(config).eval().cuda()
sources = [[5 + i % 50 for i in range(n)] for n in range(1, 20)]
found = {}
for graphs in (True, False):
    for beam_size in (1, 4):
        options = DecodeOptions(beam_size=beam_size, cuda_graphs=graphs)
        translate_ids(model, sources, options, torch.device("cuda"))
    found[graphs] = workspaces_mb()
print(found[True], found[False])
"""


def test_graphed_decoding_keeps_one_cublas_workspace() -> None:
    """Encoding, recording and replaying all run on one stream: graphed decoding leaves as much
    memory in cuBLAS workspaces as eager decoding on the default stream does."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", WORKSPACES_SCRIPT],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    graphed, eager = map(float, done.stdout.split())
    assert eager > 0  # workspaces are in torch's allocator, so the comparison means something
    assert graphed == pytest.approx(eager)


def test_bf16_weights_replay_the_eager_bf16_steps(model: Seq2SeqTransformer) -> None:
    """`--bf16` on a GPU: a bf16 copy of the model, its steps recorded as a graph."""
    copy = decoding_model(model.to(CUDA), True, CUDA)
    src, tgt = random_ids(4, 6, vocab=60).to(CUDA), random_ids(4, 5, vocab=60).to(CUDA)
    with torch.inference_mode():
        eager, graphed = ModelDecoder(copy, src, 5), StaticDecoder(copy, src, 5, rows=4)
        for t in range(5):
            expected, found = eager.step(tgt[:, t]), graphed.step(tgt[:, t])  # (B, V) float32
            torch.testing.assert_close(found, expected, atol=3e-2, rtol=3e-2)
        assert graphed.graph is not None and graphed.cache.cross_keys[0].dtype == torch.bfloat16
    sources = random_sources(seed=6, count=20)
    options = DecodeOptions(beam_size=3, max_tokens=200, bf16=True)
    assert len(translate_ids(model, sources, options, CUDA)) == 20
    assert next(model.parameters()).dtype == torch.float32


def test_graphed_training_steps_replay_the_eager_steps() -> None:
    """Each bucket shape recorded at its first batch and replayed after, shapes in mixed order:
    the same losses, norms and weights as the same step run eagerly on the GPU."""
    recorded, eager = _task(), _task()
    steps = []
    for task, graph in ((recorded, True), (eager, False)):
        task.model.to(CUDA)
        optimizer = adamw(task.model.parameters(), CUDA, lr=1e-3, betas=(0.9, 0.98))
        steps.append(GraphedStep(task.model, optimizer, task.padded_loss, 1.0, graph=graph))
    order = [0, 1, 0, 2, 1, 3, 0, 3]
    for index, batch in enumerate(order):
        lr = 1e-3 * (1 + index % 3)
        found = steps[0].step(recorded.padded_inputs(BATCHES[batch], CUDA), lr)
        expected = steps[1].step(eager.padded_inputs(BATCHES[batch], CUDA), lr)
        for a, b in zip(found, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert len(steps[0].graphs) >= 2 and not steps[1].graphs
    inputs = recorded.padded_inputs(BATCHES[1], CUDA)
    with torch.no_grad():
        torch.testing.assert_close(
            recorded.model(inputs["src"], inputs["tgt_in"]),
            eager.model(inputs["src"], inputs["tgt_in"]),
            atol=1e-4,
            rtol=1e-4,
        )

"""The demo: learn to rewrite human-written dates as ISO dates in about a minute on a CPU.

The data is generated, so nothing is downloaded. The demo writes

    OUT/data/          train, val and test pairs as {split}.src / {split}.tgt text files
    OUT/run/           the trained run, usable with every command that takes a RUN
    OUT/attention.png  the attention maps of one held-out example
    OUT/curves.png     the training and validation curves
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qkv.errors import ConfigError, QkvError
from qkv.fits import fits
from qkv.model.config import ModelConfig
from qkv.tasks.dates import generate_date_pairs
from qkv.tasks.translation import TranslationData
from qkv.training.config import TrainConfig

DATA_DIR, RUN_DIR = "data", "run"
ATTENTION_FILE, CURVES_FILE = "attention.png", "curves.png"
DEMO_VOCAB = 400  # joint BPE: whole month and weekday names, numbers in pieces


@dataclass
class DemoExample:
    """One held-out date, its ISO form and what the model wrote."""

    source: str  # e.g. "Wed 3 Mar 2021"
    reference: str  # e.g. "2021-03-03"
    output: str  # the model's greedy translation

    @property
    def correct(self) -> bool:
        return self.output == self.reference


@dataclass
class DemoResult:
    """What `run_demo` scored and wrote."""

    accuracy: float  # exact-match accuracy of greedy translations of the held-out pairs
    examples: list[DemoExample]  # the first held-out pairs, with the model's output
    paths: dict[str, Path]  # "data", "run", "attention", "curves"


def demo_model() -> ModelConfig:
    """A small encoder-decoder, sized for a minute of CPU time."""
    return ModelConfig(
        vocab_size=DEMO_VOCAB,
        d_model=64,
        n_heads=4,
        d_ff=128,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,  # a minute is too short to memorise 20,000 pairs; dropout would only slow it
        max_len=64,
    )


def demo_training(minutes: float, seed: int, eval_every: int = 100) -> TrainConfig:
    """A high peak learning rate after a short warm-up, to learn much in few steps."""
    return TrainConfig(
        lr=5e-3,
        warmup=100,
        label_smoothing=0.0,
        max_tokens=2048,
        max_epochs=1000,
        max_minutes=minutes,
        eval_every=eval_every,
        keep_checkpoints=1,
        seed=seed,
        threads=1,  # steps this small gain nothing from more threads, and lose on a busy machine
        log_every=10,
    )


def write_pairs(directory: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    """Writes `{split}.src` and `{split}.tgt`, one sentence per line."""
    for side, suffix in ((0, "src"), (1, "tgt")):
        text = "".join(pair[side] + "\n" for pair in pairs)
        (directory / f"{split}.{suffix}").write_text(text, encoding="utf-8")


def make_demo_data(
    directory: Path, seed: int, n_train: int, n_valid: int, n_test: int
) -> list[tuple[str, str]]:
    """Generates train, val and test date pairs into `directory`; returns the test pairs.
    Validation and test sources that occur in the training set are dropped, so that the test
    accuracy is on unseen inputs."""
    directory.mkdir(parents=True, exist_ok=True)
    train = generate_date_pairs(n_train, seed=3 * seed)
    seen = {source for source, _ in train}
    valid = _unseen(generate_date_pairs(2 * n_valid, seed=3 * seed + 1), seen)[:n_valid]
    test = _unseen(generate_date_pairs(2 * n_test, seed=3 * seed + 2), seen)[:n_test]
    write_pairs(directory, "train", train)
    write_pairs(directory, "val", valid)
    write_pairs(directory, "test", test)
    return test


def _unseen(pairs: list[tuple[str, str]], seen: set[str]) -> list[tuple[str, str]]:
    return [pair for pair in pairs if pair[0] not in seen]


def run_demo(
    out_dir: str | Path,
    minutes: float = 1.0,
    seed: int = 1,
    n_train: int = 20_000,
    n_valid: int = 200,
    n_test: int = 200,
    n_examples: int = 8,
    eval_every: int = 100,
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Generates date data into `out_dir` (see the module docstring), trains a small model on
    it for `minutes`, scores it on the `n_test` held-out pairs and draws pictures; returns the
    accuracy, the first `n_examples` held-out pairs and the paths written. A run an earlier
    demo left in `out_dir` is replaced."""
    from qkv.tasks.translation import train_translation
    from qkv.viz.curves import plot_curves

    if not fits(minutes, float) or not 0 < minutes < math.inf:  # NaN fails too
        raise ConfigError(f"the demo needs a positive, finite time budget, got {minutes!r} minutes")
    if min(n_train, n_valid, n_test) < 1:
        raise ConfigError("the demo needs at least one train, valid and test pair")
    training = demo_training(minutes, seed, eval_every)  # checks the seed before any work
    if not str(out_dir).strip():  # not the current directory
        raise ConfigError("--out is empty; name the directory to write the demo into")
    out_dir = Path(out_dir)
    check_out(out_dir)
    data_dir, run_dir = out_dir / DATA_DIR, out_dir / RUN_DIR
    if run_dir.exists():  # an earlier demo's: no stale cache or log may be reused
        shutil.rmtree(run_dir)

    echo(f"generating {n_train} training dates into {data_dir}")
    test = make_demo_data(data_dir, seed, n_train, n_valid, n_test)
    data = TranslationData(
        data_dir=str(data_dir), src="src", tgt="tgt", vocab_size=DEMO_VOCAB, max_len=64
    )
    echo(f"training a small Transformer for {minutes:g} min into {run_dir}")
    try:
        train_translation(data, demo_model(), training, run_dir)
    except BaseException:  # Ctrl-C, say: a run not yet saved would stand in the next demo's way
        if not (run_dir / "config.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise

    scored = translate_held_out(run_dir, test)
    accuracy = sum(example.correct for example in scored) / len(scored)
    attention = draw_demo_attention(run_dir, scored[0].source, out_dir / ATTENTION_FILE)
    curves = plot_curves(run_dir / "metrics.jsonl", out_dir / CURVES_FILE)
    paths = {"data": data_dir, "run": run_dir, "attention": attention, "curves": curves}
    return DemoResult(accuracy, scored[:n_examples], paths)


def check_out(out_dir: Path) -> None:
    """Refuses an `--out` that holds anything but what an earlier demo wrote there (which a
    demo replaces), so that no other run or file is lost."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} is a file; the demo writes into a directory")
    if not out_dir.is_dir():
        return
    ours = {DATA_DIR, RUN_DIR, ATTENTION_FILE, CURVES_FILE}
    foreign = sorted(path.name for path in out_dir.iterdir() if path.name not in ours)
    data_dir, run_dir = out_dir / DATA_DIR, out_dir / RUN_DIR
    if data_dir.exists():
        files = [f"{split}.{side}" for split in ("train", "val", "test") for side in ("src", "tgt")]
        names = [path.name for path in data_dir.iterdir()] if data_dir.is_dir() else ["."]
        foreign += sorted(f"{DATA_DIR}/{name}" for name in names if name not in files)
    if run_dir.exists() and not _a_demo_run(run_dir):
        foreign.append(f"{RUN_DIR}/, not a demo's run")
    if foreign:
        more = ", ..." if len(foreign) > 3 else ""
        raise ConfigError(
            f"{out_dir} holds what an earlier demo did not write ({', '.join(foreign[:3])}"
            f"{more}); give a new or empty directory, or an earlier demo's"
        )


UNSAVED = {"tokenizer.json", "cache", ".lock"}
"""What a run killed before it saved its settings leaves."""


def _a_demo_run(run_dir: Path) -> bool:
    """Whether `run_dir` is empty (or holds what a killed run left, `UNSAVED`), or is a run the
    demo trained (wherever it has moved since): the demo's model on its `src`/`tgt` files."""
    from qkv.run import RunConfig

    if run_dir.is_dir() and {path.name for path in run_dir.iterdir()} <= UNSAVED:
        return True
    try:
        run = RunConfig.load(run_dir)
    except QkvError:
        return False
    sides = (run.data.get("src"), run.data.get("tgt"))
    return run.task == "translation" and run.model == demo_model() and sides == ("src", "tgt")


def translate_held_out(run_dir: Path, pairs: list[tuple[str, str]]) -> list[DemoExample]:
    """Greedy translations of the held-out sources, beside their references."""
    from qkv.inference.translator import Translator

    outputs = Translator.load(run_dir).translate([source for source, _ in pairs], beam_size=1)
    return [
        DemoExample(source, reference, output.strip())
        for (source, reference), output in zip(pairs, outputs, strict=True)
    ]


def draw_demo_attention(run_dir: Path, source: str, out: Path) -> Path:
    """Cross-attention of every layer, then decoder and encoder self-attention of the last."""
    from qkv.commands.attention import CROSS, DECODER_SELF, ENCODER_SELF, sentence_attention
    from qkv.viz.attention import plot_attention, select_panels

    attention = sentence_attention(run_dir, source)
    tokens = (attention.query_tokens, attention.key_tokens)
    panels = select_panels({CROSS: attention.maps[CROSS]}, *tokens)
    for kind in (DECODER_SELF, ENCODER_SELF):
        per_layer = attention.maps[kind]
        panels += select_panels({kind: per_layer}, *tokens, layers=[len(per_layer) - 1])
    return plot_attention(panels, out, title=attention.title)

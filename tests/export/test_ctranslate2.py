"""CTranslate2 export: the exported model decodes as qkv's PyTorch engine does, token for token."""

from __future__ import annotations

import copy
import json
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv.cli import main
from qkv.data.special import BOS_ID, EOS_ID, PAD_ID
from qkv.errors import CheckpointError, ConfigError
from qkv.inference.translate import DecodeOptions, translate_hypotheses, translate_ids
from qkv.inference.translator import Translator
from qkv.model import ModelConfig, Seq2SeqTransformer
from qkv.training.checkpoint import UMASK
from tests.tasks.helpers import write_dates

pytest.importorskip("ctranslate2", reason="the deploy extra (ctranslate2) is not installed")

from qkv.export.ctranslate2 import NOTE_FILE, export_run, transformer_spec
from qkv.export.engine import CTranslate2Engine, cached_export

pytestmark = pytest.mark.usefixtures("one_thread")

OPTIONS = [
    DecodeOptions(beam_size=1),
    DecodeOptions(beam_size=5, alpha=0.0),
    DecodeOptions(beam_size=4, alpha=0.0, max_len_a=0.3, max_len_b=2),  # budgets reached
    DecodeOptions(beam_size=1, max_len_a=0.0, max_len_b=3),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    data = write_dates(root / "data", train=400, val=40)
    out = root / "run"
    settings = ["--preset", "tiny", "vocab_size=120", "max_steps=60", "eval_every=60"]
    args = ["train", "translation", "--data", str(data), "--src", "src", "--tgt", "tgt"]
    assert main([*args, "--out", str(out), *settings, "threads=1"]) == 0
    return out


def sources(translator: Translator, run: Path) -> list[list[int]]:
    lines = (run.parent / "data" / "val.src").read_text().splitlines()
    return translator.encode(lines)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"beam{o.beam_size}-a{o.alpha}")
def test_exported_run_decodes_as_the_torch_engine(run: Path, options: DecodeOptions) -> None:
    translator = Translator.load(run)
    ids = sources(translator, run)
    engine = CTranslate2Engine(cached_export(run, None), vocabulary(translator), cpu())
    expected = translate_ids(translator.model, ids, options, cpu())
    assert engine.translate_ids(ids, options) == expected


@pytest.mark.parametrize(
    "shape",
    [
        {"norm_first": True, "positions": "learned", "activation": "gelu"},
        {"norm_first": False, "positions": "sinusoidal", "tie_embeddings": False},
    ],
    ids=["prenorm-learned-gelu", "postnorm-untied"],
)
def test_every_supported_shape_converts_exactly(tmp_path: Path, shape: dict[str, object]) -> None:
    """Random weights (whose outputs run to their budgets) in each architecture option."""
    model = random_model(**shape)
    engine = exported(model, tmp_path)
    ids = random_sources()
    for options in OPTIONS[:3]:
        assert engine.translate_ids(ids, options) == translate_ids(model, ids, options, cpu())


def test_an_empty_translation_is_found_as_the_torch_engine_finds_it(tmp_path: Path) -> None:
    """EOS as the first token (CTranslate2 bans it there unless told otherwise)."""
    model = random_model(tie_embeddings=False)
    ids = random_sources()
    with torch.no_grad():  # the EOS row along the first step's states: EOS comes first
        memory, src_mask, _ = model.encode(torch.tensor([ids[0]]))
        first = model.decode(torch.tensor([[BOS_ID]]), memory, src_mask)[0, 0]  # (D,)
        model.output.weight[EOS_ID] = 5 * first
    engine = exported(model, tmp_path)
    for options in OPTIONS[:2]:
        expected = translate_hypotheses(model, ids, options, cpu(), n_best=1)
        assert expected[0][0][0] == []  # the empty translation
        found = engine.translate_hypotheses(ids, options, n_best=1)
        assert [h[0][0] for h in found] == [h[0][0] for h in expected]
        assert [h[0][1] for h in found] == pytest.approx([h[0][1] for h in expected], rel=2e-4)


def random_model(**shape: object) -> Seq2SeqTransformer:
    config = ModelConfig(
        vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
        n_decoder_layers=2, max_len=64, **shape,  # type: ignore[arg-type]
    )  # fmt: skip
    return Seq2SeqTransformer(config).eval()


def exported(model: Seq2SeqTransformer, directory: Path) -> CTranslate2Engine:
    vocab = ["<pad>", "<s>", "</s>", "<unk>", "<cls>"] + [f"t{i}" for i in range(45)]
    spec = transformer_spec(model, vocab)
    spec.validate()
    spec.optimize()
    spec.save(str(directory))
    (directory / NOTE_FILE).write_text(json.dumps({"max_len": model.config.max_len}))
    return CTranslate2Engine(directory, vocab, cpu())


def random_sources() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(5, 50, (n,), generator=generator).tolist() for n in (3, 9, 17, 30)]


@pytest.mark.parametrize("beam", [1, 4])
def test_scores_and_n_best_lists_agree(run: Path, beam: int) -> None:
    translator = Translator.load(run)
    ids = sources(translator, run)
    engine = CTranslate2Engine(cached_export(run, None), vocabulary(translator), cpu())
    options = DecodeOptions(beam_size=beam, alpha=0.0)
    expected = translate_hypotheses(translator.model, ids, options, cpu(), n_best=beam)
    found = engine.translate_hypotheses(ids, options, n_best=beam)
    for theirs, ours in zip(found, expected, strict=True):
        assert [h[0] for h in theirs] == [h[0] for h in ours]
        assert [h[1] for h in theirs] == pytest.approx([h[1] for h in ours], rel=2e-4)


def test_beam_search_with_a_length_penalty_agrees(run: Path) -> None:
    """CTranslate2 returns the W best finished hypotheses by its own length normalisation,
    which qkv ranks again by the GNMT penalty; the GNMT-best can rarely be one it dropped
    (seen only on barely trained models)."""
    translator = Translator.load(run)
    ids = sources(translator, run)
    engine = CTranslate2Engine(cached_export(run, None), vocabulary(translator), cpu())
    options = DecodeOptions(beam_size=5, alpha=0.6)
    expected = translate_ids(translator.model, ids, options, cpu())
    found = engine.translate_ids(ids, options)
    assert sum(a == b for a, b in zip(found, expected, strict=True)) >= 0.9 * len(ids)


def test_sampling_draws_from_the_filtered_distribution(run: Path) -> None:
    """Sampling runs under qkv's options; keeping the top token alone (top-k 1, or a tiny
    top-p) is greedy search. CTranslate2 draws from one random stream that its threads share,
    so a seed does not repeat its samples as it does the PyTorch engine's."""
    translator = Translator.load(run)
    ids = sources(translator, run)
    engine = CTranslate2Engine(cached_export(run, None), vocabulary(translator), cpu())
    greedy = translate_ids(translator.model, ids, DecodeOptions(), cpu())
    for narrow in (
        DecodeOptions(sampling=True, top_k=1),
        DecodeOptions(sampling=True, top_p=1e-46),
    ):
        assert engine.translate_ids(ids, narrow) == greedy  # 1e-46: 0 in float32
    wide = DecodeOptions(sampling=True, top_k=10**6, temperature=1e-4)  # every token, near greedy
    assert engine.translate_ids(ids, wide) == greedy
    sampled = engine.translate_ids(ids, DecodeOptions(sampling=True, temperature=1.5, seed=3))
    assert len(sampled) == len(ids) and sampled != greedy
    tokens = {token for row in sampled for token in row}
    assert tokens <= set(range(len(vocabulary(translator)))) - {PAD_ID, BOS_ID, EOS_ID}


def test_int8_export_is_close(run: Path) -> None:
    translator = Translator.load(run)
    ids = sources(translator, run)
    engine = CTranslate2Engine(cached_export(run, "int8"), vocabulary(translator), cpu())
    expected = translate_ids(translator.model, ids, DecodeOptions(), cpu())
    found = engine.translate_ids(ids, DecodeOptions())
    assert sum(a == b for a, b in zip(found, expected, strict=True)) >= 0.8 * len(ids)


def test_the_cached_export_is_reused_until_the_weights_change(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    for item in run.iterdir():
        if item.is_file():
            (copy / item.name).write_bytes(item.read_bytes())
    first = cached_export(copy, None)
    made = (first / "model.bin").stat().st_mtime_ns
    assert cached_export(copy, None) == first
    assert (first / "model.bin").stat().st_mtime_ns == made
    weights = load_file(copy / "model.safetensors")
    weights["decoder.layers.0.ffn.linear2.bias"] += 0.5
    save_file(weights, copy / "model.safetensors")
    again = cached_export(copy, None)
    note = json.loads((again / NOTE_FILE).read_text())
    assert note["run"] == str(copy.resolve())
    assert (again / "model.bin").stat().st_mtime_ns != made
    assert [p.name for p in (copy / "ctranslate2").iterdir()] == ["float32"]  # no temp dirs


def test_a_damaged_cached_export_is_made_again_or_named(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("ctranslate2", "checkpoints"))
    first = cached_export(copy, None)
    (first / NOTE_FILE).unlink()  # qkv's own directory: converted again
    assert (cached_export(copy, None) / NOTE_FILE).is_file()
    with open(first / "model.bin", "r+b") as model:
        model.truncate(1000)
    with pytest.raises(CheckpointError, match=r"CTranslate2 cannot load it .*; delete it to"):
        CTranslate2Engine(cached_export(copy, None), [], cpu())


def test_an_export_is_replaced_whole_through_links_and_readable_by_all(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    out = export_run(run, tmp_path / "empty")
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~UMASK
    (tmp_path / "link").symlink_to(out)
    export_run(run, tmp_path / "link", "int8")
    assert json.loads((out / NOTE_FILE).read_text())["quantize"] == "int8"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "link"]  # no temp dirs
    monkeypatch.chdir(out)
    with pytest.raises(ConfigError, match="is the current directory; name it from its parent"):
        export_run(run, Path("."))
    assert (out / "model.bin").is_file()


def test_refusals_are_one_line(run: Path, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a qkv export"):
        export_run(run, taken)
    assert (taken / "mine.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match="--quantize must be one of"):
        export_run(run, tmp_path / "out", "int4")
    export = export_run(run, tmp_path / "export")
    (export / "notes.txt").write_text("keep me")  # a file of the user's in an export
    with pytest.raises(ConfigError, match=r"holds files an export does not write \(notes.txt\)"):
        export_run(run, export, "int8")
    assert (export / "notes.txt").read_text() == "keep me"
    assert json.loads((export / NOTE_FILE).read_text())["quantize"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "taken"]  # no temp dirs


def test_an_export_deploys_with_ctranslate2_and_tokenizers_alone(run: Path, tmp_path: Path) -> None:
    """The export holds the tokenizer: docs/deploy.md's snippet needs nothing of qkv's."""
    import ctranslate2
    import tokenizers

    export = export_run(run, tmp_path / "export")
    tokenizer = tokenizers.Tokenizer.from_file(str(export / "tokenizer.json"))
    lines = (run.parent / "data" / "val.src").read_text().splitlines()[:8]
    tokens = [tokenizer.encode(line).tokens for line in lines]
    found = ctranslate2.Translator(str(export)).translate_batch(
        tokens, beam_size=1, min_decoding_length=0
    )
    ids = [[tokenizer.token_to_id(t) for t in result.hypotheses[0]] for result in found]
    expected = Translator.load(run).translate(lines, beam_size=1, max_len_a=0.0, max_len_b=256)
    assert [tokenizer.decode(row) for row in ids] == expected


def test_the_torch_engines_options_are_refused(run: Path) -> None:
    """CTranslate2's threads are set when it loads: `workers` would do nothing."""
    translator = Translator.load(run, "cpu", engine="ctranslate2")
    for option, match in (("workers", "workers is a torch-engine option"), ("bf16", "bf16 is")):
        with pytest.raises(ConfigError, match=match):
            translator.translate(["1 2 3"], **{option: 2 if option == "workers" else True})
    with pytest.raises(TypeError, match="load one in each process"):
        copy.deepcopy(translator)  # nor pickled: CTranslate2's translator cannot be
    with pytest.raises(ConfigError, match=r"start must be an int between 0 and 2\*\*63 - 1"):
        translator.translate(["1 2 3"], start=-1)
    told: list[int] = []
    translator.translate(["1 2 3", "4 5"], progress=told.append)
    assert told == [2]


def vocabulary(translator: Translator) -> list[str]:
    tokenizer = translator.tokenizer
    return [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]


def cpu() -> torch.device:
    return torch.device("cpu")

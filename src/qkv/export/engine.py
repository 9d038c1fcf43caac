"""Decoding with an exported CTranslate2 model, under qkv's decoding options.

The rules are qkv's: a sentence's budget of generated tokens is `translate.budgets`, and
hypotheses rank by the GNMT length penalty ((5 + length) / 6) ** alpha (CTranslate2 divides by
length ** alpha; the scores are turned back into log-probabilities and ranked again).
CTranslate2 takes one budget a call, so each batch decodes to its longest budget, and a
sentence whose search reached its own shorter budget is decoded again alone under it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from qkv.data.batching import token_budget_batches
from qkv.data.special import BOS, EOS, PAD
from qkv.errors import CheckpointError, ConfigError
from qkv.export.ctranslate2 import NOTE_FILE, export_run, import_ctranslate2, weights_digest
from qkv.inference.beam import length_penalty
from qkv.inference.translate import DecodeOptions, Found, check_n_best
from qkv.inference.translate import budgets as output_budgets
from qkv.inference.workers import auto_workers


def cached_export(run_dir: Path, quantize: str | None) -> Path:
    """The run's CTranslate2 export (`RUN/ctranslate2/<quantization>`), made on first use and
    again whenever the run's weights have changed since."""
    out = run_dir / "ctranslate2" / (quantize or "float32")
    note = out / NOTE_FILE
    if note.is_file():
        try:
            if json.loads(note.read_text())["weights_sha256"] == weights_digest(run_dir):
                return out
        except (ValueError, KeyError, TypeError):
            pass  # a damaged note: export again
    elif out.is_dir() and not out.is_symlink():  # qkv's own, its note lost: made again
        shutil.rmtree(out)
    elif out.exists() or out.is_symlink():
        out.unlink()
    return export_run(run_dir, out, quantize)


class CTranslate2Engine:
    """A `ctranslate2.Translator` on an exported model, fed qkv token ids. On a CPU it holds
    one replica a worker thread (as qkv's own workers), each on its share of the threads, and
    every call's sentences are shared out among the replicas."""

    def __init__(self, model_dir: Path, vocabulary: list[str], device: torch.device) -> None:
        ct2 = import_ctranslate2()
        self.vocabulary = vocabulary
        self.index = {token: i for i, token in enumerate(vocabulary)}
        self.max_len = int(json.loads((model_dir / NOTE_FILE).read_text())["max_len"])
        replicas = auto_workers(0, device)
        self.replicas = replicas
        try:
            self.translator = ct2.Translator(
                str(model_dir),
                device=device.type,
                inter_threads=replicas,
                intra_threads=max(1, torch.get_num_threads() // replicas),
            )
        except (RuntimeError, ValueError) as error:  # a damaged model.bin, say
            raise CheckpointError(
                f"{model_dir}: CTranslate2 cannot load it ({error}); delete it to convert the "
                "run again"
            ) from None

    def translate_ids(self, sources: list[list[int]], options: DecodeOptions) -> list[list[int]]:
        """The best translation of each source; see `translate_hypotheses`."""
        return [found[0][0] for found in self.translate_hypotheses(sources, options, 1)]

    def translate_hypotheses(
        self, sources: list[list[int]], options: DecodeOptions, n_best: int
    ) -> list[list[Found]]:
        """Token-id sources (no BOS/EOS) -> the `n_best` best target-id sequences (no BOS/EOS)
        with qkv's scores, in input order."""
        if options.bf16:
            raise ConfigError("bf16 is a torch-engine option; export with --quantize bfloat16")
        if options.workers:
            raise ConfigError(
                f"workers is a torch-engine option; CTranslate2 decodes on its {self.replicas} "
                "replica(s), set when it loads"
            )
        check_n_best(n_best, options)
        lengths = torch.tensor([len(s) for s in sources], dtype=torch.long)
        budgets = output_budgets(lengths, options, self.max_len).tolist()
        todo = [i for i, s in enumerate(sources) if s and budgets[i] > 0]
        per_batch = max(options.max_tokens // options.beam_size, 1)
        if options.sampling:  # one random stream for the process, in 32 bits
            import_ctranslate2().set_random_seed(options.seed % 2**32)
        pending = []
        todo_lengths = [len(sources[i]) for i in todo]
        for batch in token_budget_batches(todo_lengths, per_batch, shuffle=False, seed=0, epoch=0):
            rows = [todo[i] for i in batch]
            longest = max(budgets[r] for r in rows)
            submitted = self._submit([sources[r] for r in rows], longest, options)
            pending.append((rows, longest, submitted))
        out: list[list[Found]] = [[([], 0.0)] for _ in sources]
        for rows, longest, results in pending:
            for r, submitted in zip(rows, results, strict=True):
                result = submitted.result()
                if budgets[r] < longest and _reached(result, budgets[r]):
                    (alone,) = self._submit([sources[r]], budgets[r], options)  # its own budget
                    result = alone.result()
                out[r] = self._ranked(result, options)[:n_best]
        return out

    def _submit(self, sources: list[list[int]], budget: int, options: DecodeOptions) -> Any:
        tokens = [[self.vocabulary[i] for i in s] for s in sources]
        common: dict[str, Any] = {
            "max_batch_size": -(-len(sources) // self.replicas),  # a share for every replica
            "max_decoding_length": budget,
            "asynchronous": True,
            "return_scores": True,
            "return_end_token": True,
            "max_input_length": 0,  # sources are cut to the model's positions already
            "min_decoding_length": 0,  # EOS may come first (an empty translation), as in qkv
        }
        if options.sampling:
            return self.translator.translate_batch(
                tokens,
                beam_size=1,
                sampling_topk=min(options.top_k, len(self.vocabulary)),  # more: every token
                sampling_topp=max(options.top_p, 1e-30),  # float32's 0 is refused; keeps one
                sampling_temperature=options.temperature,
                suppress_sequences=[[PAD], [BOS]],  # as the PyTorch engine: words and EOS only
                length_penalty=0.0,
                **common,
            )
        return self.translator.translate_batch(
            tokens,
            beam_size=options.beam_size,
            length_penalty=_ct2_penalty(options.alpha) if options.beam_size > 1 else 0.0,
            num_hypotheses=options.beam_size,
            **common,
        )

    def _ranked(self, result: Any, options: DecodeOptions) -> list[Found]:
        """Hypotheses best first by qkv's score. CTranslate2's beam search finishes the same
        hypotheses (it searches by raw log-probability and stops at W finished, as qkv does)
        but divides their scores by length ** alpha: the log-probability is recovered and
        divided by the GNMT penalty instead."""
        if options.beam_size == 1 or options.sampling:
            return [(self._ids(result.hypotheses[0]), float(result.scores[0]))]
        ranked = []
        for tokens, score in zip(result.hypotheses, result.scores, strict=True):
            log_prob = score * len(tokens) ** _ct2_penalty(options.alpha)
            ranked.append(
                (self._ids(tokens), log_prob / length_penalty(len(tokens), options.alpha))
            )
        return sorted(ranked, key=lambda found: -found[1])

    def _ids(self, tokens: list[str]) -> list[int]:
        return [self.index[t] for t in tokens if t != EOS]


def _reached(result: Any, budget: int) -> bool:
    """Whether a search ran to `budget` steps (its hypotheses count EOS)."""
    return max(len(tokens) for tokens in result.hypotheses) >= budget


def _ct2_penalty(alpha: float) -> float:
    """CTranslate2 ends a beam search with no length penalty at its first finished best beam;
    a negligible penalty keeps qkv's rule of W finished hypotheses (the ranking is redone)."""
    return alpha if alpha > 0 else 1e-6

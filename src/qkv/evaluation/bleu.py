"""Translation metrics with sacreBLEU, on detokenized, cased text."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF


@dataclass
class TranslationScores:
    """Corpus scores of a system output against one reference per sentence."""

    bleu: float  # sacreBLEU, cased, 13a tokenisation: the standard score
    bleu_signature: str
    chrf: float
    chrf_signature: str
    bleu_lowercase: float  # secondary: lowercased, as tutorials often report
    sentences: int


def score_translations(hypotheses: list[str], references: list[str]) -> TranslationScores:
    """Scores `hypotheses` against `references`, equal-length lists of detokenized text."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be lists of sentences, not one string")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no sentences to score")
    bleu, chrf, lower = BLEU(), CHRF(), BLEU(lowercase=True)
    refs = [references]
    return TranslationScores(
        bleu=bleu.corpus_score(hypotheses, refs).score,
        bleu_signature=str(bleu.get_signature()),
        chrf=chrf.corpus_score(hypotheses, refs).score,
        chrf_signature=str(chrf.get_signature()),
        bleu_lowercase=lower.corpus_score(hypotheses, refs).score,
        sentences=len(hypotheses),
    )

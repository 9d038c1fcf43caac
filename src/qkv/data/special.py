"""Special tokens, defined in one place. Their ids are fixed: every tokenizer puts them first."""

from __future__ import annotations

PAD, BOS, EOS, UNK, CLS = "<pad>", "<s>", "</s>", "<unk>", "<cls>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, CLS)
PAD_ID, BOS_ID, EOS_ID, UNK_ID, CLS_ID = range(len(SPECIAL_TOKENS))

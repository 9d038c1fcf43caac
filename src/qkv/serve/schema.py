"""What the server accepts and answers: request bodies, their limits, and errors naming fields."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from qkv.data.readers import is_blank, lone_surrogate


@dataclass(frozen=True)
class Limits:
    """Enforced on every request; `qkv serve --help` lists the flags that set them."""

    max_texts: int = 64  # texts a request
    max_chars: int = 2000  # characters a text
    max_body: int = 1 << 20  # bytes a request body
    max_attention_texts: int = 8  # texts a request that asks for attention weights


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, the `field` at fault and why."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


class TextsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    texts: list[str] = Field(description="the texts, one a sentence or document")
    model: str | None = Field(None, description="a name from GET /models; default: the first")
    attention: bool = Field(False, description="return attention weights (the torch weights)")


class TranslateRequest(TextsRequest):
    beam: int = Field(5, ge=1, le=64, description="beam width; 1 decodes greedily")
    alpha: float = Field(0.6, ge=0.0, le=10.0, description="GNMT length penalty exponent")
    n_best: int = Field(1, ge=1, le=64, description="hypotheses a text, at most `beam`")
    max_len_a: float = Field(1.5, ge=0.0, le=100.0)
    max_len_b: int = Field(10, ge=0, le=1000)
    sampling: bool = Field(False, description="sample instead of searching")
    temperature: float = Field(1.0, gt=0.0, le=100.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = Field(0, ge=0, lt=2**63)


class ClassifyRequest(TextsRequest):
    pass


def check_texts(request: TextsRequest, limits: Limits) -> None:
    """Raise RequestError (422, or 413 for too many) for texts the models cannot take."""
    if not request.texts:
        raise RequestError(422, "texts", "texts is empty: send at least one text")
    if len(request.texts) > limits.max_texts:
        raise RequestError(
            413, "texts", f"{len(request.texts)} texts; at most {limits.max_texts} a request"
        )
    for i, text in enumerate(request.texts):
        where = f"texts[{i}]"
        if is_blank(text):
            raise RequestError(422, where, f"{where} is empty")
        if len(text) > limits.max_chars:
            raise RequestError(
                413, where, f"{where} has {len(text)} characters; at most {limits.max_chars}"
            )
        if lone_surrogate(text) is not None or "\x00" in text:
            raise RequestError(422, where, f"{where} is not valid text")
    if request.attention and len(request.texts) > limits.max_attention_texts:
        raise RequestError(
            413,
            "attention",
            f"attention weights for at most {limits.max_attention_texts} texts a request",
        )

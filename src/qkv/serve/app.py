"""The HTTP server of `qkv serve`: JSON endpoints, OpenAPI docs at /docs, and the web page at /.

Every refusal is a JSON body {"error": why, "field": where} with a 4xx status; the server keeps
serving. Concurrent requests to one model decode together (`batcher.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qkv import __version__
from qkv.errors import QkvError
from qkv.serve.models import Served, ServedClassifier, ServedTranslator
from qkv.serve.schema import ClassifyRequest, Limits, RequestError, TranslateRequest, check_texts

STATIC = resources.files("qkv.serve") / "static"


def create_app(served: dict[str, Served], limits: Limits | None = None) -> FastAPI:
    """The app over already loaded models; their batchers stop when the app shuts down,
    after finishing every request in flight."""
    limits = limits or Limits()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for model in served.values():
            model.batcher.close()

    app = FastAPI(title="qkv", version=__version__, lifespan=lifespan)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.add_middleware(BodyLimit, max_body=limits.max_body)

    @app.exception_handler(RequestError)
    async def refused(request: Request, error: RequestError) -> JSONResponse:
        return _error(error.status, error.field, error.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        where = [part for part in first.get("loc", ()) if part != "body"]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where)[1:] or "body"
        if first.get("type") == "json_invalid":
            return _error(422, "body", "the body is not valid JSON")
        if field == "body" and "json" not in request.headers.get("content-type", ""):
            return _error(422, "body", "send a JSON object, with Content-Type: application/json")
        return _error(422, field, f"{field}: {first.get('msg', 'invalid')}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        where, message = {
            400: ("body", "the body is not JSON in UTF-8"),  # what FastAPI could not read
            404: ("path", f"no endpoint {request.url.path}; see /docs"),
            405: ("method", f"{request.url.path} does not take {request.method}"),
        }.get(error.status_code, ("body", str(error.detail)))
        return _error(error.status_code, where, message)

    @app.exception_handler(QkvError)
    async def failed(request: Request, error: QkvError) -> JSONResponse:
        return _error(422, "texts", str(error))

    def pick(name: str | None, kind: type) -> Any:
        if name is None:
            for model in served.values():
                if isinstance(model, kind):
                    return model
            task = "translation" if kind is ServedTranslator else "classification"
            raise RequestError(404, "model", f"no {task} model is served")
        if name not in served:
            known = ", ".join(served)
            raise RequestError(404, "model", f"unknown model {name!r}; served: {known}")
        if not isinstance(served[name], kind):
            raise RequestError(422, "model", f"{name} is a {served[name].task} model")
        return served[name]

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/models")
    async def models() -> dict[str, Any]:
        return {"models": [model.info() for model in served.values()], "limits": vars(limits)}

    @app.post("/translate")
    async def translate(request: TranslateRequest) -> dict[str, Any]:
        """Translations with their scores and n-best lists (and attention weights if asked)."""
        check_texts(request, limits)
        model: ServedTranslator = pick(request.model, ServedTranslator)
        return {"model": model.name, "results": await model.answer(request)}

    @app.post("/classify")
    async def classify(request: ClassifyRequest) -> dict[str, Any]:
        """Labels with their probabilities (and attention weights if asked)."""
        check_texts(request, limits)
        model: ServedClassifier = pick(request.model, ServedClassifier)
        return {"model": model.name, "results": await model.answer(request)}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"))

    return app


def _error(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status)


class BodyLimit:
    """Refuses (413) a request body over `max_body` bytes as it arrives: a declared length at
    once, a streamed (chunked) body as soon as its bytes pass the limit, never held whole."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = f"request body over {self.max_body} bytes"
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            await _error(413, "body", too_big)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body:
                raise HTTPException(413, too_big)  # answered by the app's handler
            return message

        await self.app(scope, counted, send)

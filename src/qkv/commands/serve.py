"""`qkv serve`: runs behind HTTP, with the web page at /."""

from __future__ import annotations

import argparse
from pathlib import Path

from qkv.errors import ConfigError, QkvError


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from qkv.serve.app import create_app
    except ImportError:
        raise QkvError("qkv serve needs the serve extra: pip install 'qkv[serve]'") from None
    import torch

    from qkv.serve.models import Batching, load_served
    from qkv.serve.schema import Limits

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be between 1 and 65535, got {args.port}")
    if args.threads:
        torch.set_num_threads(args.threads)
    batching = Batching(window=args.window_ms / 1000, max_tokens=args.batch_tokens)
    runs = [Path(run) for run in args.runs]
    served = load_served(runs, args.engine, args.quantize, batching)
    limits = Limits(max_texts=args.max_texts, max_chars=args.max_chars, max_body=args.max_body)
    app = create_app(served, limits)
    url = f"http://{args.host}:{args.port}"
    print(f"serving {', '.join(served)} at {url} (the page at /, API docs at /docs)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0

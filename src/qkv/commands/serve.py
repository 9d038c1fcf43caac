"""`qkv serve`: runs behind HTTP, with the web page at /."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from qkv.errors import ConfigError, QkvError
from qkv.training.signals import sigterm_as_ctrl_c


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
    if args.threads < 0:
        raise ConfigError(f"--threads must be 0 (torch's default) or more, got {args.threads}")
    if not 0 <= args.window_ms <= MAX_WINDOW_MS:  # NaN fails too
        raise ConfigError(
            f"--window-ms must be between 0 and {MAX_WINDOW_MS:g}, got {args.window_ms}"
        )
    for flag in ("--batch-tokens", "--max-texts", "--max-chars", "--max-body"):
        if (value := getattr(args, flag[2:].replace("-", "_"))) < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    check_address(args.host, args.port)  # before the runs load, and before "serving ..."
    if args.threads:
        torch.set_num_threads(args.threads)
    batching = Batching(window=args.window_ms / 1000, max_tokens=args.batch_tokens)
    runs = [Path(run) for run in args.runs]
    with sigterm_as_ctrl_c():  # until uvicorn takes the signals: a conversion cleans up
        served = load_served(runs, args.engine, args.quantize, batching)
    limits = Limits(max_texts=args.max_texts, max_chars=args.max_chars, max_body=args.max_body)
    app = create_app(served, limits)
    host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
    url = f"http://{host}:{args.port}"
    print(f"serving {', '.join(served)} at {url} (the page at /, API docs at /docs)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


MAX_WINDOW_MS = 1000.0
"""The longest gathering window: every request waits for it."""


def check_address(host: str, port: int) -> None:
    """Raise ConfigError unless the server can listen on `host`:`port` (a name that does not
    resolve, an address of another machine, a port in use)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(f"cannot listen on {host}:{port} ({reason})") from None

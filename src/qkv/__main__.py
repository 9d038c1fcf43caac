"""`python -m qkv` (and `torchrun -m qkv`): the `qkv` command line."""

import contextlib
import os
import sys

from qkv.cli import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # `distributed.launched()`, not importing torch
    # One of torchrun's processes, its process group destroyed: end without the interpreter's
    # teardown, in which torch 2.15's gloo threads could abort it after its message was given.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or its reader gone
            if stream is not None:
                stream.flush()
    os._exit(code)
sys.exit(code)

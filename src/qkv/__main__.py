"""`python -m qkv` (and `torchrun -m qkv`): the `qkv` command line."""

import sys

from qkv.cli import main

sys.exit(main())

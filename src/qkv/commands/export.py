"""`qkv export`: a translation run as a CTranslate2 model directory."""

from __future__ import annotations

import argparse
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from qkv.export.ctranslate2 import export_run

    out = export_run(Path(args.run_dir), Path(args.out), args.quantize)
    kind = args.quantize or "float32"
    print(f"wrote {out} (CTranslate2, {kind}); use it with ctranslate2.Translator({str(out)!r})")
    return 0

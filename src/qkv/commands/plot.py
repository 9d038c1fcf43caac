"""`qkv plot`: draw a run's training and validation curves from its metrics log."""

from __future__ import annotations

import argparse
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    path = draw_curves(args.run_dir, args.out)
    print(f"wrote {path}")
    return 0


def draw_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Plots `run_dir/metrics.jsonl` to `out` (default `run_dir/curves.png`); returns the path."""
    from qkv.viz.curves import plot_curves

    run_dir = Path(run_dir)
    return plot_curves(run_dir / "metrics.jsonl", Path(out) if out else run_dir / "curves.png")

"""The run's metrics: one JSON record a line in RUN/metrics.jsonl, and TensorBoard if installed."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from qkv.training.checkpoint import atomic_write_text
from qkv.training.distributed import is_main


class MetricsLog:
    """Append-only JSONL metrics in the run directory (main process only), mirrored to
    TensorBoard under RUN/tensorboard when the `tensorboard` package is installed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        if not is_main():
            return
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if board := self.board:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    board.add_scalar(
                        f"{record.get('split', 'train')}/{key}", value, record.get("step", 0)
                    )
            board.flush()

    @functools.cached_property
    def board(self) -> Any:
        """A TensorBoard writer, made at the first record; None without the package."""
        try:
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(str(self.path.parent / "tensorboard"))
        except ImportError:
            return None

    def truncate_after(self, step: int) -> None:
        """Drop records newer than `step` (written after the checkpoint we resume from), and
        the warnings of a finished run, which its end writes again."""
        if not is_main() or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("split") == "warnings":
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(x + "\n" for x in kept))

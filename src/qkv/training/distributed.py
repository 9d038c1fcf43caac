"""Data-parallel training under torchrun: the process group, what the ranks agree on, and each
rank's share of a step's batches.

torchrun starts one process a rank with WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in its environment; `joined` sees them and joins the group (gloo on CPUs, NCCL for
CUDA tensors). Without them (or with one process) every function here is a no-op that answers
for a single process, so the trainer has one code path.

Every rank builds the same global list of batches (same seed, same epoch); a step takes the
next `accumulate x world` of them and rank r trains on every world-th one from r (`shard`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from qkv.errors import ConfigError, QkvError
from qkv.training.task import TrainingTask

TIMEOUT_ENV = "QKV_DIST_TIMEOUT"
"""Seconds a rank waits for the others in one collective before giving up on them."""
DEFAULT_TIMEOUT = 1800.0
STOPS = ("SIGINT received", "SIGTERM received", "stdout closed")
"""The reasons to stop that the trainer's `stop_signals` records."""
T = TypeVar("T")


class RankLost(QkvError):
    """Another rank of the run died or stopped answering."""


class MainFailed(QkvError):
    """Rank 0 failed in work that the other ranks were waiting for."""


def launched() -> bool:
    """Whether torchrun (or a launcher like it) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def world_size() -> int:
    """Processes in the run (1 when not distributed)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the run (0 when not distributed)."""
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    """Whether this process is the one that logs, evaluates and writes the run (rank 0)."""
    return rank() == 0


def timeout() -> datetime.timedelta:
    """How long a collective waits: QKV_DIST_TIMEOUT seconds (default 30 minutes)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 10**7:
        raise ConfigError(f"{TIMEOUT_ENV}={text!r}: give a number of seconds above 0")
    return datetime.timedelta(seconds=seconds)


@contextlib.contextmanager
def joined() -> Iterator[None]:
    """This process in the run's process group for the block, when torchrun started several
    (else nothing); a failed collective (a peer gone, or a timeout) leaves it as `RankLost`."""
    if not launched():
        yield
        return
    local_rank = dist.get_node_local_rank(fallback_rank=0)  # the GPU of this process
    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    if cuda and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    try:
        dist.init_process_group(backend, timeout=timeout())
    except ValueError as error:  # MASTER_ADDR or another of torchrun's variables missing
        raise ConfigError(
            f"WORLD_SIZE is {os.environ['WORLD_SIZE']}, but {str(error).splitlines()[0]}: "
            "start the processes with torchrun"
        ) from None
    except RuntimeError as error:
        raise RankLost(f"cannot join the run's processes: {str(error).splitlines()[0]}") from None
    try:
        yield
    except RuntimeError as error:
        if not isinstance(error, dist.DistError) and "gloo" not in str(error):
            raise
        first = (str(error).strip().splitlines() or [""])[0]
        reason = first.split("] ", 1)[-1].split(". ")[0][:200]  # gloo starts with its source file
        raise RankLost(
            f"rank {rank()}: another process of the run died or stopped answering "
            f"({reason or type(error).__name__})"
        ) from None
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (tokenizer training, the token cache, the run's lock)
    while the others wait; then they run it, unless it failed on rank 0 (`MainFailed`)."""
    if world_size() == 1:
        yield
        return
    if is_main():
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # a rank that stopped too (Ctrl-C reaches all)
                from_main(False)  # cannot hear it: the error raised stays this one
            raise
        from_main(True)
        return
    if not from_main(False):
        raise MainFailed("rank 0 stopped (its message says why); this rank stops too")
    yield


OWN_SETTINGS = frozenset({"threads", "data_dir", "train_file", "valid_file"})
"""What each process may set its own way: its threads, and where its machine keeps the data."""


def check_same_settings(*configs: Any) -> None:
    """Raise ConfigError, the same on every rank, unless every rank was given the same
    settings (dataclasses), `OWN_SETTINGS` aside: apart, the ranks would fail in pieces, wait
    for each other past the end of the shorter run, or each train at its own rate."""
    if world_size() == 1:
        return
    mine = {
        (type(c).__name__, key): value
        for c in configs
        for key, value in dataclasses.asdict(c).items()
        if key not in OWN_SETTINGS
    }
    everyone: list[Any] = [None] * world_size()
    dist.all_gather_object(everyone, mine)
    first = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        if differ := [key for key in first if theirs.get(key) != first[key]]:
            name = differ[0][1]
            raise ConfigError(
                f"rank {rank} was given {name}={theirs.get(differ[0])!r}, rank 0 "
                f"{name}={first[differ[0]]!r}: give every process the same settings"
            )


def from_main(value: T) -> T:
    """Rank 0's `value` (anything picklable), on every rank."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, device=torch.device("cpu"))
    return box[0]


def agree_stop(received: list[str], elapsed: float) -> tuple[str | None, float]:
    """Why to stop, the same on every rank: the first signal a rank received (`STOPS`), or
    None; and the slowest rank's training time `elapsed`."""
    if world_size() == 1:
        return (received[0] if received else None), elapsed
    code = (STOPS.index(received[0]) + 1 if received[0] in STOPS else 1) if received else 0
    row = torch.tensor([code, elapsed], dtype=torch.float64)
    rows = [torch.empty_like(row) for _ in range(world_size())]
    dist.all_gather(rows, row)  # a tensor, not an object: one collective a step, not two
    codes, times = torch.stack(rows).T.tolist()  # (W,) each
    stopping = [r for r, stop in enumerate(codes) if stop > 0]
    if not stopping:
        return None, max(times)
    if received:
        return received[0], max(times)
    signal = STOPS[int(codes[stopping[0]]) - 1].removesuffix(" received")
    return f"{signal} received by rank {stopping[0]}", max(times)


def summed(loss_sum: float, stats: dict[str, float]) -> tuple[float, dict[str, float]]:
    """A step's summed loss and statistics over every rank."""
    keys = sorted(stats)
    totals = torch.tensor([loss_sum, *(stats[k] for k in keys)], dtype=torch.float64)
    if world_size() > 1:
        dist.all_reduce(totals)
    return float(totals[0]), {k: float(v) for k, v in zip(keys, totals[1:], strict=True)}


def rng_states() -> dict[str, Tensor]:
    """The random generators' states for a checkpoint: "torch" and "cuda" of rank 0, then
    "torch.rank1", "cuda.rank1", ... of the other ranks."""
    mine = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        mine["cuda"] = torch.cuda.get_rng_state()
    every = [mine] * world_size()
    if world_size() > 1:
        dist.all_gather_object(every, mine)
    return {
        name if r == 0 else f"{name}.rank{r}": states[name]
        for name in mine
        for r, states in enumerate(every)
    }


def restore_rng(rng: dict[str, Tensor], seed: int) -> None:
    """This rank's generators as `rng_states` saved them; a rank that the saved run did not
    have seeds its own from `seed`."""
    suffix = f".rank{rank()}" if rank() else ""
    if f"torch{suffix}" not in rng:
        torch.manual_seed(seed + rank())
        return
    torch.set_rng_state(rng[f"torch{suffix}"])
    if f"cuda{suffix}" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng[f"cuda{suffix}"])


def barrier() -> None:
    """Wait until every rank is here (on the CPU, gloo's, as the other collectives here)."""
    if world_size() > 1:
        dist.barrier()


def padded(group: Sequence[T], world: int) -> list[T]:
    """A step's batches repeated from its start up to a multiple of `world`, so that every
    rank gets as many (only an epoch's last step can be short)."""
    count = -(-len(group) // world) * world
    return [group[i % len(group)] for i in range(count)]


def shard(group: Sequence[T], rank: int, world: int) -> list[T]:
    """Rank `rank`'s batches of the step `group` (already `padded`)."""
    return list(group[rank::world])


class _TaskLoss(nn.Module):
    """A task's loss as a module, so that DistributedDataParallel's forward runs it (its
    gradient hooks only work for a forward that goes through it)."""

    def __init__(self, task: TrainingTask, device: torch.device) -> None:
        super().__init__()
        self.model = task.model  # registers the parameters that DDP synchronises
        self.task, self.device = task, device

    def forward(self, batch: Any) -> tuple[Tensor, dict[str, float]]:
        return self.task.loss(batch, self.device)


def data_parallel(task: TrainingTask, device: torch.device) -> DistributedDataParallel:
    """The task's loss wrapped for data-parallel training; rank 0's weights go to all ranks."""
    ids = [device] if device.type == "cuda" else None
    # The buffers (position tables) are the same on every rank: synchronised at the start only.
    return DistributedDataParallel(
        _TaskLoss(task, device), device_ids=ids, forward_sync_buffers=False
    )

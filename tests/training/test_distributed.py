"""Data-parallel training under torchrun, on the CPU with gloo on 127.0.0.1.

The multi-process tests start real `python -m qkv train` processes on a generated corpus:
either as torchrun starts them (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set by
the test) or with torchrun itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

import qkv
from qkv.errors import ConfigError
from qkv.training import checkpoint as ckpt
from qkv.training import distributed
from tests.tasks.test_classification_e2e import make_rows, write_jsonl
from tests.training.test_resume import TINY_RUN, last_step, write_corpus

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with gloo is not available in this torch build",
)
SRC = Path(qkv.__file__).resolve().parents[1]
TIMEOUT = 300.0  # waiting for a whole process: generous, the machine may be busy
COLLECTIVE_TIMEOUT = 20  # QKV_DIST_TIMEOUT of the runs: a rank waits no longer for another
SETTINGS = [*TINY_RUN, "compile=false"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        distributed.TIMEOUT_ENV: str(COLLECTIVE_TIMEOUT),
        **extra,
    }


def start(command: list[str], log: Path, **extra: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.PIPE, env=environment(**extra)
        )


def start_ranks(args: list[str], logs: Path, world: int = 2) -> list[subprocess.Popen[bytes]]:
    """`python -m qkv ARGS` as `world` ranks, with the environment torchrun would give them."""
    port = str(free_port())
    return [
        start(
            [sys.executable, "-m", "qkv", *args],
            logs / f"rank{rank}.log",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            WORLD_SIZE=str(world),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
        )
        for rank in range(world)
    ]


def finish(proc: subprocess.Popen[bytes]) -> str:
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err.decode()
    return err.decode()


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def progress(checkpoint: Path) -> dict[str, Any]:
    state = json.loads((checkpoint / ckpt.STATE_FILE).read_text(encoding="utf-8"))
    return dict(state["progress"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("distributed") / "data")


def test_padded_shards_give_every_rank_as_many_batches() -> None:
    group = ["a", "b", "c"]
    padded = distributed.padded(group, 2)
    assert padded == ["a", "b", "c", "a"]
    assert [distributed.shard(padded, r, 2) for r in range(2)] == [["a", "c"], ["b", "a"]]
    assert distributed.padded(group, 1) == group
    assert distributed.padded(["a"], 4) == ["a"] * 4


def test_one_process_agrees_with_itself() -> None:
    assert distributed.world_size() == 1 and distributed.is_main()
    assert distributed.agree_stop([], 3.0) == (None, 3.0)
    assert distributed.agree_stop(["SIGTERM received"], 3.0) == ("SIGTERM received", 3.0)
    assert distributed.summed(2.0, {"accuracy": 1.0}) == (2.0, {"accuracy": 1.0})
    with distributed.main_first():
        pass
    with distributed.joined():  # no WORLD_SIZE: nothing to join
        assert not dist.is_initialized()


def test_rank_0_stopped_in_its_block_keeps_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C reaches every rank: when rank 0 stops in the block that goes first, the others
    may be gone already, and telling them fails; the interrupt is what rank 0 reports."""

    def gone(value: object) -> object:
        raise RuntimeError("[gloo] Connection closed by peer")

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "from_main", gone)
    with pytest.raises(KeyboardInterrupt), distributed.main_first():
        raise KeyboardInterrupt


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_timeout_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(distributed.TIMEOUT_ENV, value)
    with pytest.raises(ConfigError, match=distributed.TIMEOUT_ENV):
        distributed.timeout()


def test_two_ranks_match_one_process_accumulating_two_batches(corpus: Path, tmp_path: Path) -> None:
    """Rank r trains on batches r, r + 2, ...; one process sums the same two batches a step.
    The 3rd step (an epoch's last batch, repeated on both ranks) and the 4th (the next epoch)
    are included. No dropout: each rank has a generator of its own."""
    common = ["--data", str(corpus), *SETTINGS, "dropout=0", "max_steps=4", "eval_every=4"]
    one = tmp_path / "one"
    qkv_train = [sys.executable, "-m", "qkv", "train", "translation"]
    single = start([*qkv_train, "--out", str(one), *common, "accumulate=2"], tmp_path / "one.log")
    two = tmp_path / "two"
    ranks = start_ranks(["train", "translation", "--out", str(two), *common], tmp_path)
    for proc in [single, *ranks]:
        finish(proc)

    name = "checkpoints/step-0000004/model.safetensors"
    expected, found = load_file(one / name), load_file(two / name)
    assert found.keys() == expected.keys()
    for key, tensor in expected.items():
        torch.testing.assert_close(found[key], tensor, msg=key)
    losses = [
        [r["loss"] for r in records(run) if r["split"] in ("train", "valid")] for run in (one, two)
    ]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert progress(two / "checkpoints" / "step-0000004")["world_size"] == 2


def test_ranks_given_other_settings_stop_at_once_in_one_line(corpus: Path, tmp_path: Path) -> None:
    """Apart, they would wait for each other past the end of the shorter run."""
    run = tmp_path / "run"
    port = str(free_port())
    command = [sys.executable, "-m", "qkv", "train", "translation", "--data", str(corpus)]
    ranks = [
        start(
            [*command, "--out", str(run), *SETTINGS, f"max_steps={steps}", f"threads={rank + 1}"],
            tmp_path / f"rank{rank}.log",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            WORLD_SIZE="2",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
        )
        for rank, steps in enumerate((20, 30))
    ]
    said = "qkv: rank 1 was given max_steps=30, rank 0 max_steps=20: give every process the same"
    for proc in ranks:
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 2 and err.decode().startswith(said), err.decode()
        assert err.decode().count("\n") == 1, err.decode()
    assert not run.exists()  # nothing was written: the same command again starts the run


def test_a_killed_rank_stops_the_others_and_the_run_resumes(corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", "translation", "--data", str(corpus), "--out", str(run), *SETTINGS]
    ranks = start_ranks([*args, "max_steps=40", "eval_every=2"], tmp_path)
    deadline = time.monotonic() + TIMEOUT
    while last_step(run) < 3 and ranks[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ranks[0].poll() is None, ranks[0].communicate()[1].decode()
    ranks[1].kill()
    killed = time.monotonic()
    _, err = ranks[0].communicate(timeout=TIMEOUT)
    ranks[1].communicate()
    assert time.monotonic() - killed < COLLECTIVE_TIMEOUT + 10
    message = err.decode()
    assert ranks[0].returncode == 2, f"rank 0 exited {ranks[0].returncode}; stderr: {message!r}"
    assert "Traceback" not in message
    assert message.startswith("qkv: rank 0: another process of the run died or stopped answering")
    assert f"-m qkv train --resume {run}\n" in message

    newest, problems = ckpt.latest_good_checkpoint(run / "checkpoints")
    assert newest is not None and not problems
    assert not list((run / "checkpoints").glob("*.tmp"))
    step = int(progress(newest)["step"])
    resumed = start(
        [sys.executable, "-m", "qkv", "train", "--resume", str(run), f"max_steps={step + 2}"],
        tmp_path / "resumed.log",
    )
    finish(resumed)
    out = (tmp_path / "resumed.log").read_text(encoding="utf-8")
    assert "note: the checkpoint was trained by 2 process(es), this run has 1" in out
    assert progress(run / "checkpoints" / f"step-{step + 2:07d}")["world_size"] == 1


def test_two_nodes_meet_through_a_rendezvous_and_train_one_run(tmp_path: Path) -> None:
    """Two torchrun launchers, one process each, as two machines would run them."""
    train = write_jsonl(tmp_path / "train.jsonl", make_rows(200, ["pos", "neg"], seed=1))
    run = tmp_path / "run"
    endpoint = f"127.0.0.1:{free_port()}"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
    torchrun += ["--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    torchrun += ["--rdzv-endpoint", endpoint, "--rdzv-id", "qkv"]
    train_args = ["train", "classification", "--train", str(train), "--out", str(run)]
    train_args += [*SETTINGS, "max_steps=4", "eval_every=2"]
    launchers = [
        start(
            [*torchrun, "--node-rank", str(node), "-m", "qkv", *train_args],
            tmp_path / f"node{node}.log",
        )
        for node in range(2)
    ]
    for launcher in launchers:
        finish(launcher)
    assert (run / "model.safetensors").is_file()
    assert progress(run / "checkpoints" / "step-0000004")["world_size"] == 2
    train_steps = [r["step"] for r in records(run) if r["split"] == "train"]
    assert train_steps == [1, 2, 3, 4]  # rank 0's records alone

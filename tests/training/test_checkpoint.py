"""Checkpoints: atomic writes, checksums, clear errors for torn or foreign files, fuzzed loading."""

from __future__ import annotations

import errno
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from qkv.errors import CheckpointError, os_problem
from qkv.model.config import ModelConfig
from qkv.run import TASKS, RunConfig
from qkv.training import checkpoint as ckpt
from qkv.training.config import TrainConfig

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Linear(5, 2))


def trained(net: nn.Module) -> torch.optim.Optimizer:
    """An AdamW optimiser with state after two steps on `net`."""
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, foreach=True)
    for _ in range(2):
        net(torch.randn(4, 3)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def save(directory: Path, net: nn.Module | None = None, step: int = 7) -> Path:
    net = net or model()
    optimizer = trained(net)
    rng = {"torch": torch.get_rng_state()}
    return ckpt.save_checkpoint(directory, net, optimizer, {"progress": {"step": step}}, rng)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save(tmp_path / "checkpoints" / "step-0000007")


def test_round_trip_restores_model_optimizer_and_rng(tmp_path: Path) -> None:
    net = model()
    optimizer = trained(net)
    rng = torch.get_rng_state()
    directory = tmp_path / "step-0000002"
    ckpt.save_checkpoint(directory, net, optimizer, {"progress": {"step": 2}}, {"torch": rng})

    fresh = model()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1.0, foreach=True)
    record, restored_rng = ckpt.load_checkpoint(directory, fresh, fresh_optimizer)
    assert record["progress"] == {"step": 2}
    assert torch.equal(restored_rng["torch"], rng)
    for name, tensor in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    expected, found = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert found["param_groups"][0]["lr"] == expected["param_groups"][0]["lr"]
    for param_id, values in expected["state"].items():
        for key, value in values.items():
            assert torch.equal(found["state"][param_id][key], value), (param_id, key)


def test_layout_and_checksums(saved: Path) -> None:
    assert sorted(p.name for p in saved.iterdir()) == [
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
    ]
    record = json.loads((saved / "state.json").read_text())
    assert record["format_version"] == ckpt.FORMAT_VERSION
    for name, digest in record["files"].items():
        assert hashlib.sha256((saved / name).read_bytes()).hexdigest() == digest
    assert not list(saved.parent.glob("*.tmp"))


def test_crash_while_saving_keeps_the_previous_checkpoint(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def save_then_die(tensors: dict[str, torch.Tensor], path: str, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 2:  # the optimizer file: the model file is already on disk
            raise KeyboardInterrupt
        save_file(tensors, path, **kwargs)

    monkeypatch.setattr(ckpt, "save_file", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        save(saved.parent / "step-0000009", step=9)
    monkeypatch.undo()

    assert not (saved.parent / "step-0000009.tmp").exists()  # an interrupted save cleans up
    assert ckpt.list_checkpoints(saved.parent) == [saved]
    assert ckpt.latest_good_checkpoint(saved.parent) == (saved, [])
    leftover = saved.parent / "step-0000009.tmp"  # what a process killed mid-save leaves
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"torn")
    assert ckpt.latest_good_checkpoint(saved.parent) == (saved, [])
    save(saved.parent / "step-0000009", step=9)  # the next save clears the leftover
    assert sorted(p.name for p in saved.parent.iterdir()) == ["step-0000007", "step-0000009"]


def test_files_reach_the_disk_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    fsync_file, fsync_dir, replace = ckpt.fsync_file, ckpt.fsync_dir, ckpt.os.replace

    def record_file(path: Path) -> None:
        events.append(f"fsync {path.parent.name}/{path.name}")
        fsync_file(path)

    def record_dir(path: Path) -> None:
        events.append(f"fsync {path.name}/")
        fsync_dir(path)

    def record_replace(source: Any, target: Any) -> None:
        events.append(f"rename {Path(source).name} -> {Path(target).name}")
        replace(source, target)

    monkeypatch.setattr(ckpt, "fsync_file", record_file)
    monkeypatch.setattr(ckpt, "fsync_dir", record_dir)
    monkeypatch.setattr(ckpt.os, "replace", record_replace)
    save(tmp_path / "checkpoints" / "step-0000003")
    assert events == [
        "fsync step-0000003.tmp/model.safetensors",
        "fsync step-0000003.tmp/optimizer.safetensors",
        "fsync step-0000003.tmp/state.json",
        "fsync step-0000003.tmp/",
        "rename step-0000003.tmp -> step-0000003",
        "fsync checkpoints/",
    ]


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def edit_state(change: Any) -> Any:
    def apply(path: Path) -> None:
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    return apply


DAMAGE = {
    "model truncated": ("model.safetensors", truncate, "model.safetensors: checksum mismatch"),
    "model bit flip": ("model.safetensors", flip_last_byte, "model.safetensors: checksum mismatch"),
    "optimizer empty": (
        "optimizer.safetensors",
        lambda p: p.write_bytes(b""),
        "optimizer.safetensors: checksum mismatch",
    ),
    "optimizer missing": (
        "optimizer.safetensors",
        Path.unlink,
        "optimizer.safetensors: missing from the checkpoint",
    ),
    "state missing": ("state.json", Path.unlink, "incomplete checkpoint (no state.json)"),
    "state truncated": ("state.json", truncate, "state.json: corrupt"),
    "state binary": ("state.json", lambda p: p.write_bytes(b"\xff\x00\x81"), "state.json: corrupt"),
    "state not an object": ("state.json", lambda p: p.write_text("[1, 2]"), "checkpoint format"),
    "newer format": (
        "state.json",
        edit_state(lambda r: r.update(format_version=2)),
        "checkpoint format 2, this qkv reads 1",
    ),
    "no checksums": ("state.json", edit_state(lambda r: r.pop("files")), "no checksums"),
    "checksums not a map": (
        "state.json",
        edit_state(lambda r: r.update(files=["model.safetensors"])),
        "no checksums",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_damaged_checkpoint_is_reported_and_skipped(
    tmp_path: Path, damage: tuple[str, Any, str]
) -> None:
    name, apply, message = damage
    root = tmp_path / "checkpoints"
    good = save(root / "step-0000005", step=5)
    bad = save(root / "step-0000010", step=10)
    apply(bad / name)

    with pytest.raises(CheckpointError, match="^" + str(bad)) as error:
        ckpt.verify_checkpoint(bad)
    assert message in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(CheckpointError):
        net = model()
        ckpt.load_checkpoint(bad, net, torch.optim.AdamW(net.parameters()))

    found, problems = ckpt.latest_good_checkpoint(root)
    assert found == good
    assert problems == [str(error.value)]


def test_weights_that_do_not_fit_the_model(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    ckpt.save_weights(model(), path)
    wider = nn.Sequential(nn.Linear(3, 6), nn.LayerNorm(6), nn.Linear(6, 2))
    with pytest.raises(CheckpointError, match=r"has shape \(5,\), the config expects \(6,\)"):
        ckpt.load_weights(wider, path)
    with pytest.raises(CheckpointError, match="weights do not match the model config"):
        ckpt.load_weights(nn.Sequential(nn.Linear(3, 5)), path)


def test_a_changed_byte_in_the_weights_is_found(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    ckpt.save_weights(model(), path, {"note": "kept"})
    assert ckpt.read_safetensors(path)[1]["note"] == "kept"
    loaded = model()
    nn.init.zeros_(loaded[0].weight)
    ckpt.load_weights(loaded, path)
    assert torch.equal(loaded[0].weight, model()[0].weight)
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little")
    data[8 + header] ^= 1  # the lowest bit of the first number: finite, and the right shape
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model.safetensors: checksum mismatch \(the file"):
        ckpt.load_weights(model(), path)


def test_weights_without_a_digest_load_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(ckpt.model_tensors(model()), str(path))  # another writer: no qkv digest
    assert ckpt.DIGEST_KEY not in ckpt.read_safetensors(path)[1]
    ckpt.load_weights(model(), path)


def test_the_digest_does_not_depend_on_the_order_of_the_tensors() -> None:
    tensors = ckpt.model_tensors(model())
    reversed_order = dict(reversed(list(tensors.items())))
    assert ckpt.tensors_digest(reversed_order) == ckpt.tensors_digest(tensors)
    tensors["0.bias"] = tensors["0.bias"].to(torch.bfloat16)
    assert ckpt.tensors_digest(tensors) != ckpt.tensors_digest(reversed_order)


def test_optimizer_state_of_other_parameters_is_rejected(saved: Path) -> None:
    net = model()
    optimizer = torch.optim.AdamW(list(net.parameters())[:2])
    with pytest.raises(CheckpointError, match="step-0000007: optimizer state does not fit"):
        ckpt.load_checkpoint(saved, net, optimizer)


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (5, 10, 15, 20):
        save(root / f"step-{step:07d}", step=step)
    (root / "step-0000025.tmp").mkdir()
    (root / "step-0000999").mkdir()  # incomplete: not counted, not removed
    ckpt.prune_checkpoints(root, 2)
    assert sorted(p.name for p in root.iterdir()) == [
        "step-0000015",
        "step-0000020",
        "step-0000025.tmp",
        "step-0000999",
    ]


# --------------------------------------------------------------------------- fuzzing


def reseal(directory: Path) -> None:
    """Rewrite state.json's checksums to match the files as they are now."""
    record = json.loads((directory / "state.json").read_text())
    record["files"] = {n: ckpt.sha256(directory / n) for n in ckpt.CHECKED_FILES}
    (directory / "state.json").write_text(json.dumps(record))


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_state_file_raises_only_checkpoint_error(saved: Path, data: bytes) -> None:
    (saved / "state.json").write_bytes(data)
    try:
        ckpt.verify_checkpoint(saved)
    except CheckpointError as error:
        assert str(saved) in str(error)


@FUZZ
@given(value=JSON, key=st.sampled_from(["format_version", "files", "optimizer", "progress"]))
def test_random_state_values_raise_only_checkpoint_error(
    saved: Path, value: object, key: str
) -> None:
    state = saved / "state.json"
    original = state.read_text()
    record = json.loads(original)
    record[key] = value
    state.write_text(json.dumps(record))
    net = model()
    try:
        ckpt.load_checkpoint(saved, net, torch.optim.AdamW(net.parameters()))
    except CheckpointError:
        pass
    finally:
        state.write_text(original)


@FUZZ
@given(
    name=st.sampled_from(ckpt.CHECKED_FILES),
    data=st.binary(max_size=200) | st.integers(min_value=0, max_value=2000),
)
def test_random_tensor_files_with_valid_checksums_raise_only_checkpoint_error(
    tmp_path: Path, name: str, data: bytes | int
) -> None:
    """A file whose checksum matches (written so) but that is garbage, or cut at some byte."""
    directory = tmp_path / "step-0000001"
    if not directory.exists():
        save(directory)
    path = directory / name
    original = path.read_bytes()
    path.write_bytes(data if isinstance(data, bytes) else original[:data])
    reseal(directory)
    net = model()
    try:
        ckpt.load_checkpoint(directory, net, torch.optim.AdamW(net.parameters()))
    except CheckpointError as error:
        assert str(directory) in str(error)
    finally:
        path.write_bytes(original)
        reseal(directory)


def valid_run_config() -> dict[str, Any]:
    config = RunConfig("translation", ModelConfig(d_model=64, n_heads=4), TrainConfig(), {"a": 1})
    return config.to_dict()


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_config_bytes_raise_only_checkpoint_error(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "config.json").write_bytes(data)
    try:
        RunConfig.load(tmp_path)
    except CheckpointError as error:
        assert "config.json" in str(error)


@FUZZ
@given(draw=st.data(), value=JSON)
def test_random_config_values_raise_only_checkpoint_error(
    tmp_path: Path, draw: st.DataObject, value: object
) -> None:
    raw = valid_run_config()
    section = draw.draw(st.sampled_from([None, "model", "train", "data"]), label="section")
    target = raw if section is None else raw[section]
    keys = sorted({*target, "data"} if section is None else target)
    key = draw.draw(st.sampled_from(keys) | st.text(max_size=6), label="key")
    target[key] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    try:
        loaded = RunConfig.load(tmp_path)
    except CheckpointError as error:
        assert str(tmp_path / "config.json") in str(error)
        return
    # What loads has the declared types, so building the model cannot fail on a type.
    assert loaded.task in TASKS
    for name in ("vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
        value = getattr(loaded.model, name)
        assert isinstance(value, int) and not isinstance(value, bool)
    assert isinstance(loaded.train.lr, (int, float)) and not math.isnan(loaded.train.lr)
    assert isinstance(loaded.data, dict)


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    raw = valid_run_config()
    raw["model"]["d_model"] = 64.0
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config.json: invalid config \(model.d_model is"):
        RunConfig.load(tmp_path)


def test_a_model_field_missing_from_config_is_named_not_left_to_a_default(
    tmp_path: Path,
) -> None:
    raw = valid_run_config()
    del raw["model"]["d_ff"], raw["model"]["positions"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(
        CheckpointError,
        match=r"config.json: invalid config \(the model section has no d_ff, positions\)$",
    ):
        RunConfig.load(tmp_path)


def test_atomic_write_text_removes_its_temporary_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a directory: the final rename fails after the temporary file is written
    with pytest.raises(OSError):
        ckpt.atomic_write_text(target, "text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"] and target.is_dir()


def test_atomic_write_text_names_the_file_a_full_disk_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: Path, text: str, encoding: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as error:
        ckpt.atomic_write_text(tmp_path / "config.json", "{}")
    assert os_problem(error.value) == f"{tmp_path / 'config.json'}: no space left on device"
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_text_writes_through_links_and_keeps_permissions(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    ckpt.atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o640


def test_a_full_disk_is_one_error_and_leaves_no_temporary_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    older = save(tmp_path / "step-0000003", step=3)

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(CheckpointError, match=r"cannot write \(I/O error: No space left"):
        save(tmp_path / "step-0000007")
    with pytest.raises(CheckpointError, match="No space left"):
        ckpt.save_weights(model(), tmp_path / "model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000003"]
    assert ckpt.verify_checkpoint(older)["progress"] == {"step": 3}


def test_a_graphed_optimizer_is_saved_as_an_ordinary_one() -> None:
    """A recorded step keeps lr in a device tensor and sets `capturable`: the JSON holds a
    number and `capturable` False, so the state loads anywhere."""
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, fused=True)
    net(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    optimizer.param_groups[0]["lr"] = torch.tensor(2e-3)
    optimizer.param_groups[0]["capturable"] = True
    tensors, plain = ckpt.optimizer_tensors(optimizer)
    group = json.loads(json.dumps(plain))["param_groups"][0]
    assert group["lr"] == pytest.approx(2e-3) and group["capturable"] is False
    restored = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=1.0, fused=True)
    ckpt.restore_optimizer(restored, tensors, plain)
    assert restored.param_groups[0]["lr"] == pytest.approx(2e-3)

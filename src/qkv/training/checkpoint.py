"""Checkpoints that are never half-written and never unpickled.

A checkpoint `checkpoints/step-0000500/` holds `model.safetensors`, `optimizer.safetensors`
(with the RNG states) and `state.json` (progress, optimiser settings, the files' SHA-256). It
is written as `step-0000500.tmp/`, fsync'ed, then renamed; loading re-checks every checksum.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from qkv.errors import CheckpointError

FORMAT_VERSION = 1
STATE_FILE = "state.json"
CHECKED_FILES = ("model.safetensors", "optimizer.safetensors")  # with their SHA-256 in it
DIGEST_KEY = "qkv_sha256"  # metadata key of the weights' `tensors_digest` (`save_weights`)
UMASK = os.umask(0o022)  # read once, so that files are created as `open` would create them
os.umask(UMASK)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path for the new `path` (a file, or a directory the block makes), renamed
    onto it when the block ends (then the parent directory is fsync'ed); if the block fails,
    it is removed and `path` left untouched."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a directory left by a killed process
    try:
        yield tmp
        if tmp.is_dir() and path.is_dir():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:  # a full disk, say: the space goes back, older files stay
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


DESCRIPTOR = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|\d+)/fd/\d+")
"""Names of a process's open files, which the shell may have opened on a regular file."""


def in_place(path: Path) -> bool:
    """Whether `path` is written where it is rather than replaced: a device or pipe, or a
    name of an open file (/dev/stdout, /dev/fd/3: on a file, as the shell opened it)."""
    named = DESCRIPTOR.fullmatch(os.path.abspath(path)) is not None
    return path.exists() and (named or not path.is_file())


def save_tensors(
    tensors: dict[str, Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.torch.save_file`, fsync'ed, with the permissions `open` gives (it makes
    the file readable by its owner only), so that a run can be shared like any other file."""
    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as error:  # a full disk, say
        reason = str(error).removeprefix("Error while serializing: ")
        raise CheckpointError(f"{path}: cannot write ({reason})") from None
    os.chmod(path, 0o666 & ~UMASK)
    fsync_file(path)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (see `replacing`), fsync'ed. A symbolic link is
    written through, and a replaced file keeps its permissions."""
    if path.is_symlink():
        path = path.resolve()
    try:
        with replacing(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
            fsync_file(tmp)
            if path.is_file():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from None  # a full disk: where


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The model's state, with tied tables stored once (safetensors refuses shared memory)."""
    seen: set[int] = set()
    out: dict[str, Tensor] = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen or tensor.numel() == 0:
            seen.add(tensor.data_ptr())
            out[name] = tensor.detach().contiguous().cpu()
    return out


def tensors_digest(tensors: dict[str, Tensor]) -> str:
    """SHA-256 of the tensors' names, dtypes, shapes and bytes, in the order of their names:
    the same for the same weights however a file lays them out."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def save_weights(model: nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Atomically write the model's weights as safetensors, their digest in its metadata
    (`load_weights` checks it)."""
    tensors = model_tensors(model)
    with replacing(path) as tmp:
        save_tensors(tensors, tmp, {**(metadata or {}), DIGEST_KEY: tensors_digest(tensors)})


def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a weights file that `save_weights` wrote, once they match its digest."""
    tensors, metadata = read_safetensors(path)
    digest = metadata.get(DIGEST_KEY)
    if digest is not None and digest != tensors_digest(tensors):
        raise CheckpointError(f"{path}: checksum mismatch (the file is torn or corrupt)")
    return tensors


def load_weights(model: nn.Module, path: Path) -> None:
    """Load safetensors weights into `model`, with a clear error when they do not fit, are
    not finite, or do not match the digest that `save_weights` wrote."""
    tensors = read_weights(path)
    expected = model_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(tensor.shape)}, the config expects "
                f"{tuple(expected[name].shape)}"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"{path}: {name} holds values that are not finite (inf or NaN): the file is "
                "damaged, or was saved from a run that diverged"
            )
    model.load_state_dict(tensors, strict=False)


def read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors and the metadata of a safetensors file."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        with safe_open(str(path), "pt") as handle:
            names, metadata = handle.keys(), handle.metadata() or {}
            return {name: handle.get_tensor(name) for name in names}, metadata
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """An optimizer's state as tensors (for safetensors) and plain values (for JSON)."""
    state = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    plain: dict[str, Any] = {"param_groups": [], "state": {}}
    for group in state["param_groups"]:
        # As an ordinary optimiser's: a CUDA-graph step holds the learning rate in a device
        # tensor and sets `capturable`; a run resumed anywhere starts uncaptured.
        group = {k: v.item() if isinstance(v, Tensor) else v for k, v in group.items()}
        if "capturable" in group:
            group["capturable"] = False
        plain["param_groups"].append(group)
    for param_id, values in state["state"].items():
        plain["state"][str(param_id)] = {}
        for key, value in values.items():
            if isinstance(value, Tensor):
                tensors[f"{param_id}.{key}"] = value.detach().contiguous().cpu()
            else:
                plain["state"][str(param_id)][key] = value
    return tensors, plain


def restore_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], plain: dict[str, Any]
) -> None:
    state = {int(param_id): dict(values) for param_id, values in plain["state"].items()}
    for name, tensor in tensors.items():
        param_id, key = name.split(".", 1)
        state.setdefault(int(param_id), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


def save_checkpoint(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    rng: dict[str, Tensor],
) -> Path:
    """Write one checkpoint atomically into `directory` (its final name)."""
    opt_tensors, opt_plain = optimizer_tensors(optimizer)
    rng_tensors = {f"rng.{k}": v for k, v in rng.items()}
    with replacing(directory) as tmp:
        tmp.mkdir(parents=True)
        save_tensors(model_tensors(model), tmp / "model.safetensors")
        save_tensors({**opt_tensors, **rng_tensors}, tmp / "optimizer.safetensors")
        files = {name: sha256(tmp / name) for name in CHECKED_FILES}
        record = {"format_version": FORMAT_VERSION, "files": files, "optimizer": opt_plain}
        (tmp / STATE_FILE).write_text(json.dumps(record | state), encoding="utf-8")
        fsync_file(tmp / STATE_FILE)
        fsync_dir(tmp)
    return directory


def verify_checkpoint(directory: Path) -> dict[str, Any]:
    """A checkpoint's state.json, once it and the checksums it records check out."""
    state_path = directory / STATE_FILE
    if not state_path.is_file():
        raise CheckpointError(f"{directory}: incomplete checkpoint (no {STATE_FILE})")
    try:
        record = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise CheckpointError(f"{state_path}: corrupt ({error})") from None
    found = record.get("format_version") if isinstance(record, dict) else None
    if found != FORMAT_VERSION:
        raise CheckpointError(
            f"{state_path}: checkpoint format {found!r}, this qkv reads {FORMAT_VERSION}"
        )
    files = record.get("files")
    if not isinstance(files, dict) or set(files) != set(CHECKED_FILES):
        raise CheckpointError(f"{state_path}: corrupt (no checksums of {', '.join(CHECKED_FILES)})")
    for name, digest in files.items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing from the checkpoint")
        try:
            actual = sha256(path)
        except OSError as error:
            raise CheckpointError(f"{path}: unreadable ({error.strerror})") from None
        if actual != digest:
            raise CheckpointError(f"{path}: checksum mismatch (the file is torn or corrupt)")
    return record


def update_progress(directory: Path, progress: dict[str, Any]) -> None:
    """Rewrite, atomically, the progress a checkpoint records."""
    record = verify_checkpoint(directory)
    record["progress"] = progress
    atomic_write_text(directory / STATE_FILE, json.dumps(record))


def load_checkpoint(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Restore model and optimizer from a verified checkpoint; return its state and RNG."""
    record = verify_checkpoint(directory)
    load_weights(model, directory / "model.safetensors")
    extra, _ = read_safetensors(directory / "optimizer.safetensors")
    rng = {k.removeprefix("rng."): v for k, v in extra.items() if k.startswith("rng.")}
    opt = {k: v for k, v in extra.items() if not k.startswith("rng.")}
    try:
        restore_optimizer(optimizer, opt, record["optimizer"])
    except (KeyError, ValueError, TypeError, AttributeError, RuntimeError) as error:
        raise CheckpointError(f"{directory}: optimizer state does not fit ({error})") from None
    return record, rng


def list_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints under `root`, oldest first (temporary ones are ignored)."""
    return sorted(p for p in root.glob("step-*") if p.is_dir() and p.suffix != ".tmp")


def latest_good_checkpoint(
    root: Path, check: Callable[[Path, dict[str, Any]], None] | None = None
) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies, and a message for each newer one that does not."""
    problems: list[str] = []
    for directory in reversed(list_checkpoints(root)):
        if (problem := checkpoint_problem(directory, check)) is None:
            return directory, problems
        problems.append(problem)
    return None, problems


def checkpoint_problem(
    directory: Path, check: Callable[[Path, dict[str, Any]], None] | None = None
) -> str | None:
    """Why `directory` is not a good checkpoint (None if it is): it does not verify, or
    `check(directory, state)` refuses its state by raising CheckpointError."""
    try:
        record = verify_checkpoint(directory)
        if check is not None:
            check(directory, record)
    except CheckpointError as error:
        return str(error)
    return None


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (with a state.json: the others,
    which a resume reports, are left for their owner to look at)."""
    complete = [d for d in list_checkpoints(root) if (d / STATE_FILE).is_file()]
    for directory in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(directory, ignore_errors=True)


def average_weights(directories: list[Path]) -> dict[str, Tensor]:
    """The element-wise mean of the model weights of several verified checkpoints."""
    total: dict[str, Tensor] = {}
    for directory in directories:
        for name, tensor in read_safetensors(directory / "model.safetensors")[0].items():
            if tensor.is_floating_point():
                tensor = total.get(name, 0) + tensor.double()
            total[name] = tensor
    return {
        name: (t / len(directories)).float() if t.dtype == torch.float64 else t
        for name, t in total.items()
    }

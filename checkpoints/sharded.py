"""Sharded checkpoints: what a run of several processes writes, with `torch.distributed.checkpoint` (DCP).

Every rank writes its own part of the weights and of the optimizer state into the checkpoint's `shards/`
folder, in parallel (`__R_N.distcp`, R its rank); under FSDP2 each rank holds a shard of every tensor and
writes that, under DDP the replicated tensors are spread over the ranks (DCP's planner writes each once).
Nothing is gathered on one rank. Rank 0 writes `shards/.metadata` once every rank's files are on disk, and
tfkit writes config.json after it (`training.save_sharded`), so a folder holding both is complete.
Loading reshards to the processes at hand: DCP reads, for each tensor a process holds, the pieces of it the
checkpoint's files hold, whatever number of processes wrote them.

A sharded folder is read wherever a checkpoint is (`weights.load_model`, `load_classifier`, `init_from`):
in one process the model is built with its parameters on the meta device, each parameter then allocated
once at its saved shape and filled in place by DCP, one stored piece at a time (`load_weights`), never two
copies of the model. `tfkit consolidate` writes the single-file form (`consolidate.py`).

Only tensors go into the shards: DCP stores any other value as a pickle it loads with
`torch.load(weights_only=False)`, which could run code; the optimizer's hyperparameters and the counters
stay in trainer_state.pt, read as plain data. The `.metadata` file is itself a pickle: it is read here with
an unpickler that admits only DCP's own record classes, torch sizes and dtypes (`SafeReader`).
"""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError
from ..layout import SHARDS, SHARDS_METADATA, WEIGHTS
from .folders import is_sharded
from .meta import assign_weights

MODEL, OPTIMIZER = "model", "optimizer"  # the two top-level keys of a training checkpoint's shards
RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp")


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as DCP saves and loads it: each rank's shards under FSDP2, whole tensors else."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model)


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, list[dict]]:
    """(the optimizer's tensors by parameter name, its parameter groups): the first goes into the shards,
    the second (numbers and names only) into trainer_state.pt. Initialises an optimizer that has not stepped
    yet (a resume fills it; `get_optimizer_state_dict` steps it once with zero gradients and lr 0)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer)
    return full["state"], full["param_groups"]


def save(folder: Path, state: dict, async_group=None):
    """Every rank: its part of `state` (tensors only) into `folder/shards`; returns when this rank's files and,
    on rank 0, the metadata of every rank's are on disk (flushed). With `async_group` (a process group of
    its own, so its collectives never cross the training's) the state is staged in memory and written by a
    thread: the future DCP returns is done when that holds."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    writer = FileSystemWriter(str(folder / SHARDS), sync_files=True)
    if async_group is not None:
        return dcp.async_save(state, storage_writer=writer, process_group=async_group)
    with warnings.catch_warnings():  # one process (tests, tools): "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable")
        dcp.save(state, storage_writer=writer)
    return None


def local_finite(model: nn.Module) -> bool:
    """Whether this rank's part of every floating-point parameter and buffer is finite (every rank's, all-reduced
    by the caller, says whether the checkpoint may be written)."""
    tensors = [getattr(t, "_local_tensor", t) for t in (*model.parameters(), *model.buffers())]
    flags = [torch.isfinite(t).all() for t in tensors if t.is_floating_point() and t.numel()]
    return bool(torch.stack(flags).all()) if flags else True


# --- reading ------------------------------------------------------------------------------------------------

ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                              "_MEM_FORMAT_ENCODING", "ChunkStorageMetadata", "MetadataIndex",
                                              "StorageMeta", "BytesStorageMetadata"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's records and nothing else: a `.metadata` naming any other global would run code on load."""

    def find_class(self, module: str, name: str):
        if name in ALLOWED.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name, None),
                                                                                   torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not part of a checkpoint's metadata")


def _reader_class():
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        """DCP's file reader, with the metadata read by `_MetadataUnpickler`."""

        def read_metadata(self, *args, **kwargs):
            return read_metadata(Path(self.path).parent)

    return SafeReader


def read_metadata(folder: Path):
    """The `shards/.metadata` of checkpoint `folder` (DCP's `Metadata`), or one CheckpointError line."""
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    path = folder / SHARDS / SHARDS_METADATA
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; the sharded checkpoint is incomplete (a save was interrupted)") \
            from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, IndexError) as err:
        raise CheckpointError(f"{path}: damaged, not the metadata torch.distributed.checkpoint writes "
                              f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise CheckpointError(f"{path}: damaged, not the metadata torch.distributed.checkpoint writes")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


def check_shards(folder: Path) -> None:
    """Every file the metadata names is there and holds the bytes it should: a missing or truncated rank file
    is one CheckpointError naming it and the rank that wrote it."""
    metadata = read_metadata(folder)
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        path = folder / SHARDS / name
        found = RANK_FILE.fullmatch(name)
        rank = f" (written by rank {found.group(1)})" if found else ""
        if not path.is_file():
            raise CheckpointError(f"{path}: missing{rank}; the sharded checkpoint {folder} is incomplete, use "
                                  "another checkpoint of the run")
        if path.stat().st_size < size:
            raise CheckpointError(f"{path}: truncated{rank}, {path.stat().st_size:,} of {size:,} bytes; the sharded "
                                  f"checkpoint {folder} is damaged, use another checkpoint of the run")


def tensor_shapes(folder: Path, prefix: str = MODEL) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """{name: (shape, dtype)} of the tensors under `prefix` in the shards (`model`: the weights), from the metadata."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    start = prefix + "."
    return {key[len(start):]: (meta.size, meta.properties.dtype)
            for key, meta in read_metadata(folder).state_dict_metadata.items()
            if key.startswith(start) and isinstance(meta, TensorStorageMetadata)}


def load(folder: Path, state: dict, *, no_dist: bool = False) -> None:
    """Fill `state`'s tensors in place from the shards (each rank its part, resharded to this process count);
    the checkpoint's files are checked first (`check_shards`). A tensor of another shape, or one the
    checkpoint lacks, is one CheckpointError line."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    check_shards(folder)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable")
            dcp.load(state, storage_reader=_reader_class()(str(folder / SHARDS)), no_dist=no_dist)
    except (CheckpointException, RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"{folder / SHARDS}: does not fit {describe_keys(state)} ({_first_line(err)})") \
            from None


def load_weights(model: nn.Module, folder: Path, device: str | torch.device = "cpu",
                 what: str = "this model") -> None:
    """Fill `model` from the shards, in this one process (no process group needed), with one copy of the
    weights: a model built with its parameters on the meta device gets each tensor allocated once at its
    saved shape (in the default dtype) and filled in place; a built model (a run's, before it is wrapped)
    is filled in place. A mismatch is one CheckpointError line naming the first differing tensor."""
    saved = tensor_shapes(folder)
    if not saved:
        raise CheckpointError(f"{folder / SHARDS}: holds no weights (no '{MODEL}.' tensors)")
    if not any(p.is_meta for p in model.parameters()):
        state = model.state_dict()
        missing, unexpected = sorted(set(state) - set(saved)), sorted(set(saved) - set(state))
        if missing or unexpected:
            first = f"missing key {missing[0]}" if missing else f"unexpected key {unexpected[0]}"
            raise CheckpointError(f"{folder / SHARDS}: does not hold the weights of {what} ({first} and "
                                  f"{len(missing) + len(unexpected) - 1} more)")
        load(folder, {MODEL: state}, no_dist=True)
        return
    dtype = torch.get_default_dtype()
    state = {name: torch.empty(shape, dtype=dtype if dtype_.is_floating_point else dtype_, device=device)
             for name, (shape, dtype_) in saved.items()}
    load(folder, {MODEL: state}, no_dist=True)
    assign_weights(model, state, folder / SHARDS, what)


def describe_keys(state: dict) -> str:
    return " and ".join(f"this run's {key}" for key in state) or "this run"


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if "size" in line.lower() or "missing" in line.lower() or "shape" in line]
    return (useful or lines or [type(err).__name__])[0][:300]


def weights_file(folder: Path) -> Path:
    """What a message names as the weights of `folder`: its shards or model.safetensors."""
    return folder / SHARDS if is_sharded(folder) else folder / WEIGHTS


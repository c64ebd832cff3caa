"""What a run records about itself: commit, device, versions, peak FLOP/s for MFU."""
from __future__ import annotations

import importlib.metadata

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

import torch

from utils.errors import UserError, write_error

# Dense bf16 tensor-core peaks (datasheet), for the MFU estimate. Unknown devices report no MFU.
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


def peak_flops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda" or precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def git_commit() -> dict:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if head.returncode != 0:  # not a checkout, or no commits (e.g. a copied working tree)
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def environment(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "device": str(device)}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    info["fla"] = fla_version()
    return {**info, **git_commit()}


def fla_version() -> str | None:
    """The installed flash-linear-attention's version, or None; read from its package metadata, since importing
    fla takes seconds."""
    try:
        return importlib.metadata.version("flash-linear-attention")
    except importlib.metadata.PackageNotFoundError:
        return None


def peak_memory_gb(device: torch.device) -> float:
    """Peak allocated GPU memory, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a synced temporary file: a crash leaves the old file or the new, not a part."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)     # a full disk must not leave a partial .tmp beside the file
        raise


class JsonlWriter:
    """Appends one JSON object per line, flushed each time, so a crash loses nothing written."""

    def __init__(self, path: Path, truncate_after_step: int | None = None, log: Callable[[str], None] = print):
        self.path = Path(path)
        if truncate_after_step is not None and self.path.is_file():
            # a resumed run rewrites history after its checkpoint: drop rows the crash left behind
            keep = [line for line, row in self._rows(log) if row.get("step", 0) <= truncate_after_step]
            write_atomic(self.path, "".join(line + "\n" for line in keep))
        self.f = open(self.path, "a")

    def _rows(self, log: Callable[[str], None]) -> list[tuple[str, dict]]:
        """(line, row) of every row. A crash mid-write (power loss, full disk) can tear the last line only: it is
        dropped with a note. An unreadable line before the last is not ours to guess at, and is an error."""
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        rows = []
        for i, line in enumerate(lines):
            try:
                rows.append((line, json.loads(line)))
            except json.JSONDecodeError as e:
                if i < len(lines) - 1:
                    raise UserError(f"{self.path}: line {i + 1} is not JSON ({e}); fix or remove it, then resume "
                                    "again") from None
                log(f"{self.path}: dropped a torn last line (a crash mid-write): {line[:80]!r}")
        return rows

    def write(self, row: dict) -> None:
        try:
            self.f.write(json.dumps(row) + "\n")
            self.f.flush()
        except OSError as e:
            raise write_error(e, self.path, "free space or make it writable, then continue with the same command and "
                                          "--resume") from None

    def close(self) -> None:
        try:
            self.f.close()
        except OSError:     # the rows a full disk refused were reported by write(); closing must not mask that
            pass

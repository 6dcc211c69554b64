"""Optional peers, found at run time and never required: Liger-Kernel's rope and flash-attention's Triton rotary.

* Liger-Kernel: ``import liger_kernel.ops.rope`` when it is installed; otherwise from ``.peers/site`` (the unpacked
  wheel ``tools/fetch_peers.sh`` puts there), and if the package does not import on this stack, its ``ops/rope.py``
  alone by file path (it needs only torch and triton).
* flash-attention cannot be installed on the GPU machine; its ``flash_attn/ops/triton/rotary.py`` is loaded by file
  path from ``.peers/flash_attn_rotary.py`` (torch and triton only).

``.peers/`` is git-ignored and never imported by the package outside this benchmark.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

__all__ = ["Peer", "peers_dir", "load_liger", "load_flash_attn", "FLASH_FILE"]

FLASH_FILE = "flash_attn_rotary.py"


@dataclass
class Peer:
    """A loaded peer module, or the reason it is not there."""

    module: ModuleType | None
    info: dict = field(default_factory=dict)  # version / source, recorded in the JSON

    @property
    def reason(self) -> str | None:
        return None if self.module is not None else self.info.get("reason", "not available")


def peers_dir(explicit: str | os.PathLike | None = None) -> Path:
    """``explicit``, else ``$ROPEKIT_PEERS``, else ``.peers`` in the repository root (or the working directory)."""
    if explicit:
        return Path(explicit)
    if os.environ.get("ROPEKIT_PEERS"):
        return Path(os.environ["ROPEKIT_PEERS"])
    repo_peers = Path(__file__).resolve().parents[2] / ".peers"
    return repo_peers if repo_peers.is_dir() else Path.cwd() / ".peers"


def _load_by_path(module_name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Triton's JIT looks functions' modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_liger(directory: Path | None = None) -> Peer:
    directory = peers_dir(directory)
    errors = []
    site = directory / "site"
    for attempt in ("installed", "peers-site"):
        if attempt == "peers-site":
            if not site.is_dir():
                break
            if str(site) not in sys.path:
                sys.path.append(str(site))  # appended: an installed Liger always wins
        try:
            module = importlib.import_module("liger_kernel.ops.rope")
        except Exception as error:  # noqa: BLE001  (any import failure means "not available", with its reason)
            errors.append(f"{attempt}: {type(error).__name__}: {error}")
            continue
        try:
            version = importlib.metadata.version("liger-kernel")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return Peer(module, {"version": version, "loaded_from": str(Path(module.__file__).parent.parent.parent)})
    rope_file = site / "liger_kernel" / "ops" / "rope.py"
    if rope_file.is_file():
        try:
            module = _load_by_path("ropekit_bench_peer_liger_rope", rope_file)
            dist = next(site.glob("liger_kernel-*.dist-info"), None)
            version = dist.name.split("-")[1] if dist else "unknown"
            return Peer(module, {"version": version, "loaded_from": f"{rope_file} (by file path)",
                                 "package_import_error": "; ".join(errors)})
        except Exception as error:  # noqa: BLE001
            errors.append(f"file {rope_file}: {type(error).__name__}: {error}")
    reason = "; ".join(errors) if errors else "liger_kernel is not installed"
    return Peer(None, {"reason": f"Liger-Kernel not importable ({reason}); run tools/fetch_peers.sh"})


def load_flash_attn(directory: Path | None = None) -> Peer:
    path = peers_dir(directory) / FLASH_FILE
    if not path.is_file():
        return Peer(None, {"reason": f"{path} not found; run tools/fetch_peers.sh"})
    try:
        module = _load_by_path("ropekit_bench_peer_flash_attn_rotary", path)
    except Exception as error:  # noqa: BLE001
        return Peer(None, {"reason": f"loading {path} failed: {type(error).__name__}: {error}"})
    source = path.with_suffix(".SOURCE")
    info = {"loaded_from": str(path), "sha256": _sha256(path)}
    if source.is_file():
        info["source"] = source.read_text().strip()
    return Peer(module, info)

"""Policies by name: built-ins, presets, ``module:Class`` references and entry points, behind one loader.

:func:`load_policy` takes what a user types after ``--policy`` or puts in ``MODEL_CONCURRENCY_POLICY`` and
resolves it, first match wins:

1. a path to a ``.toml`` preset file (anything ending in ``.toml``, or an ``os.PathLike``);
2. ``module:Class`` (a colon): ``package.module:Class`` is imported; ``some/file.py:Class`` is loaded from that
   file (relative paths are relative to the current directory, or, inside a preset, to the preset's folder);
3. a built-in name (:data:`BUILTIN_POLICIES`); built-ins cannot be shadowed, so ``aimd`` always means the
   built-in rule;
4. a preset name: ``NAME.toml`` (or a file whose ``name`` key is NAME) in the folders listed in
   ``MODEL_CONCURRENCY_POLICY_PATH`` (``os.pathsep``-separated, searched first) and then the repository's
   ``policies/`` folder;
5. an entry point named NAME in the group ``model_concurrency.policies`` (third-party packages).

A preset is a TOML file: ``name``, ``policy`` (any reference above except another ``.toml`` path; a preset name
is allowed, looked up in the preset's own folder first, to a depth of 8), optional ``description``, and every
other top-level key is a constructor parameter. Keyword parameters given to :func:`load_policy` override the
preset's. Every failure (unknown name, missing file, import error, bad parameters, an object without
``next_target``) is a ``ValueError`` saying which.
Each call builds a new instance: policies may keep state, one instance per controller.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from model_concurrency.bundled import bundled_dir
from model_concurrency.knobs import POLICY_PATH, setting
from model_concurrency.policies.adaptive import Adaptive
from model_concurrency.policies.aimd import AIMD
from model_concurrency.policies.aimd_slowstart import AIMDSlowStart
from model_concurrency.policies.base import Policy
from model_concurrency.policies.capacity import Capacity
from model_concurrency.policies.core import AdaptiveCore
from model_concurrency.policies.gradient import Gradient
from model_concurrency.policies.neighbour import AdaptiveNeighbour
from model_concurrency.policies.peers import AIBrix, BatchGatewayAIMD, LlmdAIMD, QueueTimeAIMD
from model_concurrency.policies.queue import QueuePolicy
from model_concurrency.policies.seed_aimd import SeedAIMD
from model_concurrency.policies.setpoint import Setpoint
from model_concurrency.policies.static import Static

__all__ = [
    "BUILTIN_POLICIES",
    "ENTRY_POINT_GROUP",
    "POLICY_PATH_ENV",
    "PolicyPreset",
    "find_preset",
    "load_policy",
    "load_preset",
    "policy_names",
    "preset_dirs",
]

ENTRY_POINT_GROUP = "model_concurrency.policies"
POLICY_PATH_ENV = POLICY_PATH[0]
#: The bundled presets: the repository's policies/ folder, shipped inside the package (model_concurrency.bundled).
REPO_PRESET_DIR = bundled_dir("policies")
_PRESET_KEYS = frozenset({"name", "policy", "description"})
_MAX_PRESET_DEPTH = 8

BUILTIN_POLICIES: dict[str, Callable[..., Policy]] = {
    "aimd": AIMD,
    "seed-aimd": SeedAIMD,
    "aimd-slowstart": AIMDSlowStart,
    "queue": QueuePolicy,
    "gradient": Gradient,
    "setpoint": Setpoint,
    "capacity": Capacity,
    "adaptive": Adaptive,
    # A small DCTCP-style policy (policies/core.py): more goodput for more queueing.
    "adaptive-core": AdaptiveCore,
    # The neighbour mode (policies/neighbour.py): adaptive, plus a cut at a neighbour's burst and headroom.
    "adaptive-neighbour": AdaptiveNeighbour,
    "static": Static,
    # The direct peers (policies/peers.py), from their published rules.
    "aibrix": AIBrix,
    "llmd-aimd": LlmdAIMD,
    "batch-gateway-aimd": BatchGatewayAIMD,
    "queue-time-aimd": QueueTimeAIMD,
}


@dataclass(frozen=True, slots=True)
class PolicyPreset:
    """One ``policies/*.toml`` file: a named policy reference with constructor parameters."""

    name: str
    policy: str
    path: Path
    params: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def preset_dirs() -> list[Path]:
    """Folders searched for presets, in order: ``MODEL_CONCURRENCY_POLICY_PATH`` entries, then the repo's."""
    dirs = [Path(p).expanduser() for p in setting(POLICY_PATH_ENV, "").split(os.pathsep) if p.strip()]
    dirs.append(REPO_PRESET_DIR)
    return [d for d in dirs if d.is_dir()]


def _preset_files(first: Path | None = None) -> Iterator[Path]:
    folders = preset_dirs()
    if first is not None and first.is_dir():
        folders.insert(0, first)
    for folder in folders:
        yield from sorted(folder.glob("*.toml"))


def load_preset(path: str | os.PathLike[str]) -> PolicyPreset:
    """Read and check one preset file (it is not built: see :func:`load_policy`)."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read policy preset {str(file)!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"policy preset {str(file)!r} is not valid TOML: {exc}") from None
    name, policy, description = data.get("name", file.stem), data.get("policy"), data.get("description", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy preset {str(file)!r}: 'name' must be a non-empty string")
    if not isinstance(policy, str) or not policy:
        raise ValueError(f"policy preset {str(file)!r}: 'policy' must name a policy (built-in or module:Class)")
    if not isinstance(description, str):
        raise ValueError(f"policy preset {str(file)!r}: 'description' must be a string")
    params = {k: v for k, v in data.items() if k not in _PRESET_KEYS}
    return PolicyPreset(name=name, policy=policy, path=file.resolve(), params=params, description=description)


def find_preset(name: str, *, first: Path | None = None) -> Path | None:
    """The preset file for ``name`` on the search path: ``NAME.toml`` first, else a file with ``name = NAME``.

    ``first`` is searched before the path (a preset naming another preset finds its siblings first).
    """
    files = list(_preset_files(first))
    for file in files:
        if file.stem == name:
            return file
    for file in files:
        try:
            if tomllib.loads(file.read_text(encoding="utf-8")).get("name") == name:
                return file
        except (OSError, tomllib.TOMLDecodeError):
            continue
    return None


def _preset_names() -> set[str]:
    names: set[str] = set()
    for file in _preset_files():
        try:
            preset = load_preset(file)
        except ValueError:
            continue
        names.update({file.stem, preset.name})
    return names


def policy_names() -> list[str]:
    """Every name :func:`load_policy` accepts without a path: built-ins, presets and entry points."""
    names = set(BUILTIN_POLICIES) | _preset_names()
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _module_from_file(file: Path) -> Any:
    if not file.is_file():
        raise ValueError(f"policy module file {str(file)!r} does not exist")
    # One module per file, reused on later loads so the class (and isinstance checks on it) stays the same.
    digest = hashlib.sha1(str(file).encode(), usedforsecurity=False).hexdigest()[:12]
    module_name = f"_model_concurrency_plugin_{file.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import policy module file {str(file)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while the class is being built
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _import(ref: str, base_dir: Path | None) -> Callable[..., Policy]:
    module_ref, _, attr = ref.rpartition(":")
    if not module_ref or not attr:
        raise ValueError(f"policy reference {ref!r} must look like 'module:Class' or 'file.py:Class'")
    try:
        if module_ref.endswith(".py") or "/" in module_ref or os.sep in module_ref:
            file = Path(module_ref).expanduser()
            if not file.is_absolute():
                file = (base_dir or Path.cwd()) / file
            obj: Any = _module_from_file(file.resolve())
        else:
            obj = importlib.import_module(module_ref)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except ValueError:
        raise
    except Exception as exc:  # ImportError, AttributeError, or whatever the plug-in module raised on import
        raise ValueError(f"cannot load policy {ref!r}: {type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise ValueError(f"policy {ref!r} is not a class or factory")
    return obj  # type: ignore[no-any-return]


def _entry_point(name: str) -> Callable[..., Policy] | None:
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        return None
    try:
        factory: Any = matches[0].load()
    except Exception as exc:
        raise ValueError(f"cannot load policy entry point {name!r}: {type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise ValueError(f"policy entry point {name!r} is not a class or factory")
    return factory  # type: ignore[no-any-return]


def _build(label: str, factory: Callable[..., Policy], params: dict[str, Any]) -> Policy:
    try:
        policy = factory(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad parameters for policy {label!r} {params!r}: {exc}") from None
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {label!r} has no next_target(target, obs) method")
    return policy


def _from_preset(preset: PolicyPreset, params: dict[str, Any], depth: int) -> Policy:
    if preset.policy.endswith(".toml"):
        raise ValueError(f"policy preset {str(preset.path)!r}: 'policy' must not be another .toml file")
    merged = {**preset.params, **params}
    try:
        return _resolve(preset.policy, merged, base_dir=preset.path.parent, depth=depth + 1)
    except ValueError as exc:
        raise ValueError(f"policy preset {preset.name!r} ({preset.path}): {exc}") from None


def _resolve(ref: str, params: dict[str, Any], *, base_dir: Path | None, depth: int) -> Policy:
    if depth > _MAX_PRESET_DEPTH:
        raise ValueError(f"policy presets nest deeper than {_MAX_PRESET_DEPTH} (a cycle?) at {ref!r}")
    if ref.endswith(".toml"):
        path = Path(ref).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return _from_preset(load_preset(path), params, depth)
    if ":" in ref:
        return _build(ref, _import(ref, base_dir), params)
    if ref in BUILTIN_POLICIES:
        return _build(ref, BUILTIN_POLICIES[ref], params)
    preset_file = find_preset(ref, first=base_dir)
    if preset_file is not None:
        return _from_preset(load_preset(preset_file), params, depth)
    factory = _entry_point(ref)
    if factory is not None:
        return _build(ref, factory, params)
    raise ValueError(f"unknown policy {ref!r}; known: {', '.join(policy_names())} (or a .toml path, module:Class)")


def load_policy(name_or_path: str | os.PathLike[str], **params: Any) -> Policy:
    """Build a new policy from a built-in name, preset name, ``.toml`` path, ``module:Class`` or entry point.

    ``params`` override the preset's parameters (or are the constructor parameters of a plain reference).
    Raises ``ValueError`` with the reason for anything that does not resolve or does not build.
    """
    if isinstance(name_or_path, os.PathLike):
        return _from_preset(load_preset(name_or_path), params, 0)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(f"a policy name must be a non-empty string, got {name_or_path!r}")
    return _resolve(name_or_path.strip(), params, base_dir=None, depth=0)

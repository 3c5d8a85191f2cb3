"""One after-fork rule for the module-level registries: a forked child starts with fresh locks and empty state.

A parent thread may hold a module's lock at fork time, and the child's copy of it would stay locked forever; and a
child inherits none of the parent's threads, so state that stands for them (poll state, running exports, worker
pools) would describe work nobody does in the child. Each module names its lock and the containers to empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

__all__ = ["reset_in_forked_child"]


class _Clearable(Protocol):
    def clear(self) -> None: ...


def reset_in_forked_child(
    namespace: MutableMapping[str, Any], lock_name: str, new_lock: Callable[[], object], *state: _Clearable
) -> None:
    """In every child forked from now on: ``namespace[lock_name] = new_lock()`` and each of ``state`` cleared.

    ``namespace`` is the calling module's ``globals()``: the module reads its lock by name, so a fresh one there
    is what its next ``with`` takes."""

    def reset() -> None:
        namespace[lock_name] = new_lock()
        for container in state:
            container.clear()

    os.register_at_fork(after_in_child=reset)

"""Is this a ``fork()``ed child of the process that made an object? Without a system call.

Every object of the package that must do nothing in a forked child (a DataLoader worker)
notes :func:`generation` when it is made; ``os.register_at_fork`` adds one to it in every
child, so ``generation() != noted`` is true exactly in a child. Calling ``os.getpid()`` per
call instead would cost a system call on every step and event, and ``torch.compile``
(Dynamo) cannot trace it: a hook that calls it breaks the graph (docs/trainer.md,
"Framework adapters"). The library refuses every call in a forked child on its own as well
(``pthread_atfork``), so a child made without Python's fork handlers (a bare ``fork()``
from C) still records nothing.
"""

from __future__ import annotations

import os

_generation = 0


def _forked_child() -> None:
    global _generation
    _generation += 1


def generation() -> int:
    """0 in the process that imported this module, more in each forked child."""
    return _generation


os.register_at_fork(after_in_child=_forked_child)

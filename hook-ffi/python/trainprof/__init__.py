"""trainprof: profile a training loop into files that smdebug 1.0.34's readers read.

A thin layer over ``libtrainprof_hook.so`` (loaded with ctypes when a :class:`Profiler` is
made, from ``$TRAINPROF_HOOK_LIB`` or from this package's directory)::

    import trainprof
    prof = trainprof.Profiler(framework="pytorch")
    for batch in loader:
        prof.step_begin("train")
        with prof.record("Forward", "Net"):
            out = model(batch)
        prof.forward_end()
        prof.step_end()
    prof.close()

Importing this package imports neither torch nor tensorflow and does not load the library.
Profiling problems never raise into the training loop: with ``TRAINPROF_DISABLE`` set, or
without a loadable library, a :class:`Profiler` does nothing (``Profiler(strict=True)``
raises :class:`LibraryError` for the library instead); what the user can fix is a
:class:`TrainprofWarning`, the rest goes to the ``trainprof`` logger (docs/python.md).
Wrong arguments (an unknown mode or feature name) raise ``ValueError``. In a ``fork()``ed
child (a DataLoader worker) every method does nothing.

The modules: ``_profiler`` (the :class:`Profiler`), ``_span`` (what ``record`` returns),
``_check`` (argument checks), ``_lib`` (the ctypes binding of the C header),
``_python_profiling`` (cProfile / pyinstrument windows), ``_seal`` (files into place),
``_fork`` and ``_log``; ``trainprof.torch`` and ``trainprof.keras`` are the adapters.
"""

from ._lib import LibraryError
from ._log import TrainprofWarning
from ._profiler import FEATURES, FRAMEWORKS, MODES, ArgValue, Profiler
from ._span import Span

__version__ = "0.1.0"
__all__ = [
    "Profiler",
    "Span",
    "ArgValue",
    "LibraryError",
    "TrainprofWarning",
    "FRAMEWORKS",
    "MODES",
    "FEATURES",
    "__version__",
]

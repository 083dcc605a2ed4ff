"""Triton kernels for ReplaySSM (shipped as ``hf_replayssm.kernels``); each entry point has a torch reference of the
same signature in ``hf_replayssm.ops`` and tests comparing the two (``tests/test_kernels_*.py``, under the Triton
interpreter on CPU).

* ``mamba2`` / ``delta_rule`` (Gated DeltaNet and KDA): the replay-or-flush decode step (phase per row, from host
  ints or read on the device) and the standard step; ``mamba2_verify`` / ``delta_verify``: speculative windows.
* ``read_copy``: decoding an fp8 / nvfp4 read copy in registers; ``read_copy_encode``: re-encoding it on the device
  for the rows that flushed; ``counts``: a device-phase step's count update.
* ``ops``: the decode steps as torch custom ops (what a compiled step traces); ``bench*``: ``hf-replayssm bench
  kernels``.

``ReplayCache(backend="auto")`` runs them on CUDA when triton imports, the torch references elsewhere.
"""

# This folder sits at the top of the repository, so with the repository root on sys.path (``python -m pytest`` or
# ``python -c`` run from there) ``import kernels`` would find it instead of Hugging Face's ``kernels`` package, which
# transformers imports when it is installed. Imported under that top-level name, this file hands over to the real
# distribution of the name found on sys.path without this folder; if there is none it leaves an empty placeholder
# module with no ``__file__``, which transformers' availability probe reads as "not installed" (raising
# ModuleNotFoundError instead would break ``import transformers``: its probe imports the module unguarded).
# The same block is in eval/__init__.py; it must not import anything of the package (it runs before transformers is
# fully imported).
if "." not in __name__:

    def _hand_over(name: str, folder: str) -> None:
        import importlib.machinery
        import importlib.util
        import os
        import sys
        import types

        folder = os.path.realpath(folder)
        path = [entry for entry in sys.path
                if isinstance(entry, str) and os.path.realpath(os.path.join(entry or os.curdir, name)) != folder]
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            placeholder = types.ModuleType(name, f"Placeholder: no package named {name!r} is installed.")
            placeholder.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            placeholder.__path__ = []

            def __getattr__(attr: str):
                raise AttributeError(
                    f"no package named {name!r} is installed; the folder {folder} is hf_replayssm.{name}, not a "
                    f"top-level module (module {name!r} has no attribute {attr!r})"
                )

            placeholder.__getattr__ = __getattr__
            sys.modules[name] = placeholder
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # the import system returns whatever sys.modules holds once this file has run
        spec.loader.exec_module(module)

    _hand_over(__name__, __path__[0])
    del _hand_over

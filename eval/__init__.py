"""Evaluation harness for ReplaySSM (shipped as ``hf_replayssm.eval``)."""

# Never a top-level module named ``eval``: see kernels/__init__.py for why and how (the same block).
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

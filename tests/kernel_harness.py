"""Shared harness of the Triton kernel tests: each check runs in a subprocess (the test file executed as a script)
with ``TRITON_INTERPRET=1`` set before triton is imported, so an out-of-bounds access (which segfaults the
interpreter) fails one test instead of killing pytest; ``REPLAYSSM_KERNEL_TEST_DEVICE=cuda`` runs the same checks on
a GPU."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if env.get("REPLAYSSM_KERNEL_TEST_DEVICE", "cpu") == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    return env


def _interpreter_usable() -> None:
    """On the CPU, fail with what to install where the interpreter cannot run the kernels at all (Triton <= 3.6 with
    NumPy >= 2.4; ``hf_replayssm.cache._check_interpreter_numpy``) instead of deep inside the first kernel."""
    if subprocess_env().get("TRITON_INTERPRET") == "1":
        from hf_replayssm.cache import _check_interpreter_numpy

        _check_interpreter_numpy()


def run_case(test_file: str, case: str) -> None:
    """Run ``case`` of a kernel test file in a subprocess; it must print ``OK <case>``."""
    _interpreter_usable()
    out = subprocess.run([sys.executable, str(Path(test_file).resolve()), case], cwd=ROOT, env=subprocess_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    assert f"OK {case}" in out.stdout, out.stdout[-4000:]


def run_bench_smoke(bench: str, args: list[str], result: Path) -> tuple[dict, str]:
    """Run a kernel benchmark's ``main(args + ['--smoke', '--out', result])`` in a subprocess; (its JSON, stdout)."""
    _interpreter_usable()
    code = (f"from kernel_harness import load_kernel_module; "
            f"load_kernel_module({bench!r}).main({[*args, '--smoke', '--out', str(result)]!r})")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return json.loads(result.read_text()), out.stdout


def load_kernel_module(name: str):
    """``hf_replayssm.kernels.<name>`` when the package is installed (kernels/ maps there), else the file itself."""
    try:
        return importlib.import_module(f"hf_replayssm.kernels.{name}")
    except ImportError:
        spec = importlib.util.spec_from_file_location(f"_replayssm_kernels_{name}", ROOT / "kernels" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


class RecordedKernel:
    """A Triton kernel that records the keyword arguments (constexprs) of each launch: which kernel and form a step
    ran, since the interpreter's launches return nothing to ask. ``calls``: launches so far."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    @property
    def calls(self) -> int:
        return len(self.launches)

    def __getitem__(self, grid):
        launcher = self.kernel[grid]

        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return launcher(*args, **kwargs)

        return launch


def assert_close(name, got, want, rel):
    """Max abs error within ``rel`` x max(|want|, 1), and finite."""
    import torch

    got, want = got.double(), want.double()
    err = (got - want).abs().max().item() if got.numel() else 0.0
    scale = max(want.abs().max().item() if want.numel() else 0.0, 1.0)
    print(f"  {name}: max err {err:.3e} (scale {scale:.3g})")
    assert err <= rel * scale, f"{name}: max err {err:.3e} > {rel:g} * {scale:.3g}"
    assert torch.isfinite(got).all(), name


def worker_main(kernels: str, namespace: dict, case: str) -> None:
    """Subprocess side: run ``namespace["case_<case>"](kernels module, device)`` and print ``OK <case>``."""
    import time

    import torch

    sys.path.insert(0, str(ROOT))
    device = os.environ.get("REPLAYSSM_KERNEL_TEST_DEVICE", "cpu")
    torch.manual_seed(0)
    module = load_kernel_module(kernels)
    start = time.perf_counter()
    namespace[f"case_{case}"](module, device)
    print(f"OK {case} ({time.perf_counter() - start:.1f}s)")

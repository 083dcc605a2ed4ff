"""Count Triton JIT compiles while a timed region runs.

A kernel variant compiled inside a timed run costs 0.1-9 s of host time there (run 66: 0.9-9 s per new verify
width), which no warm-up guarantees against: a new specialisation (an integer argument that turns 16-divisible, a
new constexpr, another dtype) compiles wherever it first appears. Benchmarks time inside ``JitCompiles`` and report
what compiled, so a slow run says why instead of passing for a slow kernel."""

from __future__ import annotations


def _runtime_knobs():
    try:
        import triton.knobs as knobs
    except ImportError:  # no triton, or one older than its knobs (3.4): nothing to count
        return None
    runtime = getattr(knobs, "runtime", None)
    return runtime if hasattr(runtime, "jit_post_compile_hook") else None


class JitCompiles:
    """Names of the Triton kernels compiled while active (``names``; one entry per compiled variant), through
    Triton's ``jit_post_compile_hook`` (any hook already set still runs). ``supported`` is False where this Triton
    has no such hook: then nothing is counted and reports should say "not counted", not 0."""

    def __init__(self):
        self.names: list[str] = []
        self._knobs = _runtime_knobs()
        self.supported = self._knobs is not None
        self._previous = None

    def __enter__(self):
        if self.supported:
            self._previous = self._knobs.jit_post_compile_hook
            previous = self._previous

            def record(*args, **kwargs):
                fn = kwargs.get("fn")  # its name is the kernel's __qualname__ (tests define kernels locally)
                name = getattr(fn, "name", None) or str(kwargs.get("repr", "?")).split("[")[0]
                self.names.append(name.rsplit(".", 1)[-1])
                return previous(*args, **kwargs) if previous else None

            self._knobs.jit_post_compile_hook = record
        return self

    def __exit__(self, *exc):
        if self.supported:
            self._knobs.jit_post_compile_hook = self._previous
        return False

    def summary(self) -> dict | None:
        """{kernel name: variants compiled}, or None where compiles cannot be counted."""
        if not self.supported:
            return None
        counts: dict[str, int] = {}
        for name in self.names:
            counts[name] = counts.get(name, 0) + 1
        return counts


def describe(compiled: dict[str, int]) -> str:
    """``{kernel: variants}`` as one line for a warning: ``name xN, ...``."""
    return ", ".join(f"{name} x{n}" for name, n in compiled.items())

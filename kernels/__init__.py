"""Triton kernels for ReplaySSM (shipped as ``hf_replayssm.kernels``).

Not implemented yet: every ``ReplayCache`` currently runs the pure-torch reference in ``hf_replayssm.ops``
(``backend="auto"`` resolves to ``"torch"``). Each kernel added here comes with its torch reference and a test
comparing the two.
"""

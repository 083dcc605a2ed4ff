"""Evaluation harness for ReplaySSM (shipped as ``hf_replayssm.eval``)."""

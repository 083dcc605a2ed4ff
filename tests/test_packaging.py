"""The repository's top-level ``kernels/`` and ``eval/`` folders ship as ``hf_replayssm.kernels`` /
``hf_replayssm.eval`` and must never be imported as top-level ``kernels`` / ``eval``, even with the repository root on
sys.path (``python -m pytest``, ``python -c`` or ``python -m hf_replayssm.cli`` run from there): Hugging Face's
``kernels`` package has that name, and transformers imports it when it is installed.

Every check runs in a subprocess started in the repository root with ``python -c``, which puts the root first on
sys.path, as a user's shell there does.
"""

import glob
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = r"""
import importlib.metadata, json, os, sys

root = os.path.realpath(sys.argv[1])

def ours(module):  # this repository's own folder (not a package installed into a virtual environment inside it)
    file = getattr(module, "__file__", None)
    if file is None:
        return False
    folder = os.path.join(root, module.__name__.split(".")[0])
    return os.path.realpath(file).startswith(folder + os.sep)

import transformers
from transformers import AutoModelForCausalLM  # noqa: F401
from transformers.utils import import_utils

import torch

from hf_replayssm.tiny import tiny_model

model = tiny_model("nemotron_h")
logits = model(torch.tensor([[3, 4, 5, 6]])).logits
import kernels
import eval

import hf_replayssm.eval.precision_check
import hf_replayssm.kernels

def dist(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
print(json.dumps({
    "transformers": transformers.__version__,
    "model": type(model).__name__,
    "logits_finite": bool(logits.isfinite().all()),
    "transformers_uses_kernels": bool(import_utils.is_kernels_available()),
    "kernels_dist": dist("kernels"),
    "eval_dist": dist("eval"),
    "kernels_file": getattr(kernels, "__file__", None),
    "kernels_ours": ours(kernels),
    "kernels_public": sorted(n for n in vars(kernels) if not n.startswith("__")),
    "eval_ours": ours(eval),
    "eval_public": sorted(n for n in vars(eval) if not n.startswith("__")),
    "hf_kernels_file": hf_replayssm.kernels.__file__,
    "hf_kernels_doc": hf_replayssm.kernels.__doc__,
    "precision_check": callable(hf_replayssm.eval.precision_check.precision_check),
}))
"""


def _env(pythonpath: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return env


def _check_from_root(pythonpath: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHECK, str(ROOT)], cwd=ROOT, env=_env(pythonpath),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assert_package_intact(result: dict) -> None:
    assert result["model"] == "NemotronHForCausalLM" and result["logits_finite"]
    assert Path(result["hf_kernels_file"]).resolve() == ROOT / "kernels" / "__init__.py"
    assert "Triton kernels" in result["hf_kernels_doc"]
    assert result["precision_check"]
    assert not result["eval_ours"]
    if result["eval_dist"] is None:
        assert result["eval_public"] == []


def _pip_install(target: Path, *requirements: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--target",
         str(target), *requirements],
        capture_output=True, text=True, timeout=600,
    )


@pytest.fixture(scope="session")
def hf_kernels_dir(tmp_path_factory) -> tuple[Path, bool]:
    """Hugging Face's ``kernels`` installed into a temporary directory (once per session), with ``--no-deps`` so that
    nothing of this environment is shadowed; the requirements this environment lacks (``kernels-data`` for some
    versions) are added the same way. Prefers a version the installed transformers accepts, so that transformers
    really imports it. Returns the directory and whether transformers accepts the version installed."""
    from transformers.utils import import_utils

    low = getattr(import_utils, "KERNELS_MIN_VERSION", None)
    high = getattr(import_utils, "KERNELS_MAX_VERSION", None)
    target = tmp_path_factory.mktemp("hf_kernels")
    attempts = ([f"kernels>={low},<{high}"] if low and high else []) + ["kernels"]
    errors = []
    for requirement in attempts:
        out = _pip_install(target, requirement)
        if out.returncode == 0:
            break
        errors.append(f"{requirement}: {out.stderr.strip()[-500:]}")
    else:
        pytest.skip("could not install Hugging Face's `kernels` package (no network?): " + " | ".join(errors))

    from packaging.requirements import Requirement
    from packaging.version import Version

    (info,) = glob.glob(str(target / "kernels-*.dist-info"))
    dist = importlib.metadata.Distribution.at(info)
    missing = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(str(req))
    if missing:
        out = _pip_install(target, *missing)
        if out.returncode != 0:
            pytest.skip(f"could not install the requirements of kernels {dist.version}: {out.stderr.strip()[-500:]}")
    accepted = bool(low and high and Version(low) <= Version(dist.version) < Version(high))
    return target, accepted


@pytest.mark.equivalence  # also on 5.17, where transformers really uses the package (function modules)
def test_hf_kernels_package_not_shadowed(hf_kernels_dir):
    """With Hugging Face's ``kernels`` installed, run from the repository root: transformers (which imports it when
    its version is accepted) builds a model, ``import kernels`` is the real package, ``hf_replayssm.kernels`` and
    ``hf_replayssm.eval`` still import, and so does the CLI."""
    target, accepted = hf_kernels_dir
    result = _check_from_root([str(target)])
    _assert_package_intact(result)
    assert result["kernels_dist"] is not None
    assert not result["kernels_ours"], result["kernels_file"]
    assert Path(result["kernels_file"]).resolve().is_relative_to(target.resolve()), result["kernels_file"]
    assert "get_kernel" in result["kernels_public"]
    # where transformers accepts this version (transformers 5.17 and kernels 0.16.x), it imported the real package
    assert result["transformers_uses_kernels"] == accepted

    out = subprocess.run(
        [sys.executable, "-m", "hf_replayssm.cli", "precision-check", "--tokens", "2", "--policies", "fp32,bf16",
         "--no-progress", "--json"],
        cwd=ROOT, env=_env([str(target)]), capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout)["mean_kl"]["fp32"] == 0.0


def test_no_kernels_package_imports_nothing_of_ours():
    """In this environment as installed (Hugging Face's ``kernels`` is a dependency of transformers from 5.25),
    ``import kernels`` from the repository root never yields this repository's folder, and transformers still works;
    without ``kernels`` it yields an empty placeholder (no ``__file__``, no attributes; transformers' probe reads it as
    "not installed"). (Raising ModuleNotFoundError instead would break ``import transformers``: its
    availability probe imports whatever ``find_spec`` finds, unguarded.)"""
    result = _check_from_root([])
    _assert_package_intact(result)
    assert not result["kernels_ours"], result["kernels_file"]
    if result["kernels_dist"] is None:
        assert result["kernels_file"] is None and result["kernels_public"] == []
        assert not result["transformers_uses_kernels"]


def test_top_level_names_hand_over_to_installed_packages(tmp_path):
    """The hand-over itself, without network or transformers: stand-in ``kernels`` and ``eval`` packages on
    PYTHONPATH are what ``import kernels`` / ``import eval`` give from the repository root, submodules included;
    without them the names give empty placeholders whose submodules do not import."""
    for name in ("kernels", "eval"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("from . import sub\nREAL = True\n")
        (tmp_path / name / "sub.py").write_text("VALUE = 42\n")
    script = (
        "import json, kernels, eval\n"
        "from kernels.sub import VALUE\n"
        "print(json.dumps([kernels.REAL, eval.REAL, VALUE, kernels.__file__, eval.__file__]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env([str(tmp_path)]), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    real_k, real_e, value, k_file, e_file = json.loads(out.stdout)
    assert real_k and real_e and value == 42
    assert Path(k_file).parent.parent == tmp_path and Path(e_file).parent.parent == tmp_path

    script = (
        "import kernels, eval\n"
        "assert getattr(kernels, '__file__', None) is None and getattr(eval, '__file__', None) is None\n"
        "assert [n for n in vars(kernels) if not n.startswith('__')] == []\n"
        "for name in ('kernels.sub', 'eval.precision_check'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(name + ' imported')\n"
        "try:\n"
        "    kernels.get_kernel\n"
        "except AttributeError as error:\n"
        "    assert 'hf_replayssm.kernels' in str(error)\n"
        "else:\n"
        "    raise AssertionError('placeholder has get_kernel')\n"
    )
    if any(_installed(name) for name in ("kernels", "eval")):
        pytest.skip("a package named kernels or eval is installed in this environment")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env([]), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Imports the standalone _tagma_C build, so that the tests need no vLLM,
and the pure-Python FreeRuns that vllm.tagma falls back to.

$TAGMA_EXT_DIR names the folder holding _tagma_C.abi3.so (ctest sets it);
without it, build/tagma-ext of this checkout.

$TAGMA_PY_ENGINE names the pure-Python engine, vllm/tagma/free_runs.py of
the patched tree (make test-bindings sets it). The FreeRuns tests run
against both engines (the `engine` fixture); without it, their "python"
cases fail (not skip), saying so.
"""

import importlib.util
import os
import pathlib
import sys

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[4]
EXT_DIR = pathlib.Path(os.environ.get("TAGMA_EXT_DIR", _ROOT / "build/tagma-ext"))
PY_ENGINE = os.environ.get("TAGMA_PY_ENGINE", "")

sys.path.insert(0, str(EXT_DIR))
try:
    import _tagma_C
except ImportError as e:
    raise ImportError(
        f"_tagma_C not found in {EXT_DIR} (set TAGMA_EXT_DIR, or build it: "
        "cmake -S csrc/tagma -B build/tagma-ext -DTAGMA_PYTHON_EXT=ON)"
    ) from e


def _py_engine_problem() -> str:
    if not PY_ENGINE:
        return (
            "TAGMA_PY_ENGINE is not set: it names the pure-Python FreeRuns "
            "(vllm/tagma/free_runs.py of the patched tree) that these tests "
            "also run against; make test-bindings sets it"
        )
    if not pathlib.Path(PY_ENGINE).is_file():
        return f"TAGMA_PY_ENGINE={PY_ENGINE}: no such file"
    return ""


class _NoPyEngine:
    """Stands for the missing engine: the test that uses it fails (in its
    call, so it counts as failed, not as a setup error), with the reason."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __getattr__(self, name: str):
        pytest.fail(self.why, pytrace=False)


def load_py_engine():
    """free_runs.py from $TAGMA_PY_ENGINE, by its path (it imports no vLLM);
    if the variable is unset or names no file, a stand-in that fails the
    test using it."""
    why = _py_engine_problem()
    if why:
        return _NoPyEngine(why)
    name = "_tagma_py_free_runs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PY_ENGINE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


@pytest.fixture
def t():
    """The extension module."""
    return _tagma_C


@pytest.fixture
def py_engine():
    """The pure-Python engine module (free_runs.py)."""
    return load_py_engine()


@pytest.fixture(params=["cpp", "python"])
def engine(request):
    """A module with FreeRuns: _tagma_C, or the pure-Python fallback."""
    return _tagma_C if request.param == "cpp" else load_py_engine()

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Imports the standalone _tagma_C build, so that the tests need no vLLM.

$TAGMA_EXT_DIR names the folder holding _tagma_C.abi3.so (ctest sets it);
without it, build/tagma-ext of this checkout.
"""

import os
import pathlib
import sys

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[4]
EXT_DIR = pathlib.Path(os.environ.get("TAGMA_EXT_DIR", _ROOT / "build/tagma-ext"))

sys.path.insert(0, str(EXT_DIR))
try:
    import _tagma_C
except ImportError as e:
    raise ImportError(
        f"_tagma_C not found in {EXT_DIR} (set TAGMA_EXT_DIR, or build it: "
        "cmake -S csrc/tagma -B build/tagma-ext -DTAGMA_PYTHON_EXT=ON)"
    ) from e


@pytest.fixture
def t():
    """The extension module."""
    return _tagma_C

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Test-only vLLM platform plugin: pick the CPU platform.

vLLM selects its CPU platform only when its version string contains "cpu",
which a VLLM_TARGET_DEVICE=empty build does not, and that route also turns
Triton off. This plugin returns the CPU platform directly so the patched tree's
tests run on a machine without a GPU, with Triton usable under
TRITON_INTERPRET=1. Installed into build/vllm-<v>/venv by `make build-fork` on CPU
hosts only; set TAGMA_CPU_PLATFORM=0 to switch it off.
"""

import os


def register() -> str | None:
    if os.environ.get("TAGMA_CPU_PLATFORM", "1") == "0":
        return None
    return "vllm.platforms.cpu.CpuPlatform"

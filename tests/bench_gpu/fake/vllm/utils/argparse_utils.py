# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The stand-in's parser: vLLM's takes the same flags."""

from argparse import ArgumentParser as FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]

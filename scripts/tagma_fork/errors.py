# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""The tool's exit codes and the one error type its verbs raise.

Every verb either returns one of these codes or raises ToolError (or one of
the library errors the CLI maps to EXIT_FAIL); the CLI's single handler
prints a one-line message, never a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
# A check failed, drift, a refusal that protects the stack, a failed step.
EXIT_FAIL = 1
# Bad arguments or a verb called in the wrong state.
EXIT_USAGE = 2
# A rebase stopped at a conflict; resolve and continue, or abort.
EXIT_CONFLICT = 3
# Interrupted (SIGINT), after restoring a consistent stack.
EXIT_INTERRUPTED = 130


class ToolError(RuntimeError):
    """A verb cannot go on; the message says why and what to run."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code

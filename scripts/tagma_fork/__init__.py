# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""tagma-fork: fetch, apply, edit, export, check, rebase and PR the stack."""

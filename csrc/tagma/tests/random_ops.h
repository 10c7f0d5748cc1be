// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#pragma once

// Op count of the randomized tests: --random-ops=N on the test command line,
// else $TAGMA_RANDOM_OPS, else 10^6.

#include <cstdint>

namespace tagma_test {
uint64_t random_ops();
}  // namespace tagma_test

// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: Copyright contributors to the vLLM project

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "random_ops.h"

namespace {
uint64_t g_random_ops = 1000000;
}  // namespace

uint64_t tagma_test::random_ops() { return g_random_ops; }

int main(int argc, char** argv) {
  if (const char* env = std::getenv("TAGMA_RANDOM_OPS")) {
    g_random_ops = std::strtoull(env, nullptr, 10);
  }
  // Our flag wins over the environment; doctest never sees it.
  std::vector<char*> rest;
  const char kFlag[] = "--random-ops=";
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], kFlag, sizeof(kFlag) - 1) == 0) {
      g_random_ops = std::strtoull(argv[i] + sizeof(kFlag) - 1, nullptr, 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  doctest::Context ctx;
  ctx.applyCommandLine(static_cast<int>(rest.size()), rest.data());
  return ctx.run();
}

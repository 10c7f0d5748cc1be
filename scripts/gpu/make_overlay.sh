#!/usr/bin/env bash
# .gpu/: what a GPU host needs on top of the stock vLLM kit (.kit/, from
# ../shared/gpu-kit/build_kit.sh) to run the fork: the Python files the
# patch stack adds or changes, the built vllm/_tagma_C.abi3.so, the tagma
# tests and the GPU scripts. Run after `make build-fork`.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tree=$root/build/tree
out=$root/.gpu
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/upstream/vllm.toml")
rm -rf "$out"
mkdir -p "$out/vllm" "$out/tests"
git -C "$tree" diff --name-only --diff-filter=AM "upstream/v$version" HEAD -- vllm tests |
  while read -r f; do
    case $f in
      vllm/*) dest=$out/$f ;;
      tests/*) dest=$out/$f ;;
    esac
    mkdir -p "$(dirname "$dest")"
    cp "$tree/$f" "$dest"
  done
# tests/ packages need their __init__.py files to import as in the tree.
(cd "$tree" && find tests -name __init__.py) | while read -r f; do
  if [ -d "$out/$(dirname "$f")" ]; then cp "$tree/$f" "$out/$f"; fi
done
so=$(ls "$tree"/vllm/_tagma_C*.so 2>/dev/null | head -1 || true)
if [ -n "$so" ]; then cp "$so" "$out/vllm/"; else echo "warning: no _tagma_C built" >&2; fi

du -sh "$out"
find "$out" -type f | sort

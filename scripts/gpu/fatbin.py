# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the tagma-vllm project
"""Keep only the device code one GPU architecture can load in a CUDA ELF.

vLLM's wheel carries SASS for sm_80..sm_120 in one .nv_fatbin section; a
Hopper host loads the sm_90 cubin and nothing else. Each fatbin container
in the section is rewritten in place: the entries to keep move to the front,
the container's payload size shrinks to them and the rest is zero-filled.
Container offsets, the section size and the file size stay the same, so the
.nvFatBinSegment pointers remain valid; the zeros vanish under xz.

Kept per container: the cubin for the target architecture; when a container
has none, its PTX for an architecture at or below the target (the driver
JIT-compiles it).  python3 fatbin.py IN.so OUT.so [--arch 90]
"""

from __future__ import annotations

import argparse
import struct
from dataclasses import dataclass

CONTAINER_MAGIC = 0xBA55ED50
KIND_PTX, KIND_CUBIN = 1, 2
_ELF_SHDR = struct.Struct("<IIQQQQQQ")  # name type flags addr offset size ...


@dataclass
class Entry:
    kind: int
    arch: int
    start: int
    size: int  # header + payload


def _section(data: bytes | bytearray, wanted: bytes) -> tuple[int, int]:
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [_ELF_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    for h in headers:
        start = names_at + h[0]
        if bytes(data[start : data.index(b"\0", start)]) == wanted:
            return h[4], h[5]
    raise ValueError(f"no {wanted.decode()} section")


def _entries(data: bytearray, first: int, end: int) -> list[Entry]:
    out, pos = [], first
    while pos < end:
        kind, _, header_size, payload_size = struct.unpack_from("<HHIQ", data, pos)
        (arch,) = struct.unpack_from("<I", data, pos + 28)
        out.append(Entry(kind, arch, pos, header_size + payload_size))
        pos += header_size + payload_size
    if pos != end:
        raise ValueError(f"fatbin entries overrun their container at {first:#x}")
    return out


def prune(data: bytearray, arch: int = 90) -> tuple[int, int]:
    """Rewrite `data` in place; returns (bytes kept, bytes zeroed)."""
    offset, size = _section(data, b".nv_fatbin")
    pos, end = offset, offset + size
    kept = zeroed = 0
    while pos < end:
        magic, _, header_size, payload = struct.unpack_from("<IHHQ", data, pos)
        if magic != CONTAINER_MAGIC:
            pos += 8  # containers are 8-byte aligned; skip the padding
            continue
        first, stop = pos + header_size, pos + header_size + payload
        entries = _entries(data, first, stop)
        has_cubin = any(e.kind == KIND_CUBIN and e.arch == arch for e in entries)
        keep = [
            e
            for e in entries
            if (e.kind == KIND_CUBIN and e.arch == arch)
            or (e.kind == KIND_PTX and not has_cubin and e.arch <= arch)
        ]
        blob = b"".join(bytes(data[e.start : e.start + e.size]) for e in keep)
        data[first:stop] = blob + bytes(payload - len(blob))
        struct.pack_into("<Q", data, pos + 8, len(blob))
        kept += len(blob)
        zeroed += payload - len(blob)
        pos = stop
    return kept, zeroed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    with open(args.src, "rb") as f:
        data = bytearray(f.read())
    kept, zeroed = prune(data, args.arch)
    with open(args.dst, "wb") as f:
        f.write(data)
    print(
        f"{args.src}: kept {kept / 2**20:.1f} MiB of device code for sm_{args.arch}, "
        f"zeroed {zeroed / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()

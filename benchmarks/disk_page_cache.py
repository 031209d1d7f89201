#!/usr/bin/env python3
"""What the page cache costs the disk tier: saves `--tensors` CPU tensors of `--mb` MiB through an
OffloadManager(disk_only=True) with and without disk_direct_io, alternating, and reports per round
the host memory the page cache grew by (/proc/meminfo "Cached"), the time until every file is
written (save + synchronize), the time to restore all of them newest first, and the share of the
reads the page cache served. CPU tensors: runs on any Linux machine, GPU or not.

python3 benchmarks/disk_page_cache.py [--dir /tmp/x] [--tensors 16] [--mb 64] [--rounds 2]
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch_offload  # noqa: E402
from torch_offload._ops import offload_restore, offload_save  # noqa: E402


def cached_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    return -1


def one_run(directory: str, direct: bool, tensors: int, mb: int) -> dict:
    manager = torch_offload.OffloadManager(disk_dir=directory, disk_only=True, disk_direct_io=direct,
                                           prefetch_depth=1)
    xs = [torch.randint(0, 255, (mb << 20,), dtype=torch.uint8) for _ in range(tensors)]
    cached_before = cached_bytes()
    start = time.perf_counter()
    handles = [offload_save(x, manager.id()) for x in xs]
    manager.synchronize()
    written_s = time.perf_counter() - start
    cached_growth = cached_bytes() - cached_before
    start = time.perf_counter()
    for x, h in zip(reversed(xs), reversed(handles)):
        if not torch.equal(offload_restore(h, x.device, manager.id()), x):
            raise AssertionError("a restored tensor differs from the saved one")
    restored_s = time.perf_counter() - start
    stats = manager.stats()
    read = stats["disk_bytes_read"]
    return {"direct_io": int(stats["disk_direct_io"]), "page_cache_growth_MB": cached_growth / 2**20,
            "write_s": written_s, "restore_s": restored_s,
            "write_GBps": tensors * (mb << 20) / written_s / 1e9,
            "read_from_page_cache": stats["disk_bytes_read_from_page_cache"] / read if read else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="disk_dir (default: a new directory in the temp dir)")
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="torch_offload_page_cache_")
    rows = []
    for round_ in range(args.rounds):
        for direct in (False, True):
            row = {"round": round_, **one_run(directory, direct, args.tensors, args.mb)}
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    if args.json:
        Path(args.json).write_text(json.dumps({"dir": directory, "tensors": args.tensors, "mb": args.mb,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

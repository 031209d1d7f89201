"""The disk's own bandwidth, measured where the disk tier writes: reported beside the disk-tier
rows so their speed can be read against what the disk can do.

Direct IO (O_DIRECT, from page-aligned memory) in blocks of 16 MiB: the disk's speed, not the page
cache's; then the same bytes written through the page cache with fdatasync (what the default tier
pays once the cache must reach the disk)."""
import mmap
import os
import tempfile
import time

BLOCK = 16 << 20


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def disk_bandwidth(directory: str, total_bytes: int = 1 << 30) -> dict:
    """GB/s of direct write, direct read and buffered write + fdatasync of `total_bytes` in a
    temporary file of `directory`; {"error": ...} where the filesystem refuses O_DIRECT."""
    blocks = max(1, total_bytes // BLOCK)
    buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
    buffer.write(os.urandom(1 << 20) * (BLOCK >> 20))
    os.makedirs(directory, mode=0o700, exist_ok=True)  # as the disk tier makes it
    fd, path = tempfile.mkstemp(dir=directory, prefix="torch_offload_bandwidth_")
    os.close(fd)
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_DIRECT)
        except OSError as error:
            return {"error": f"no direct IO in {directory}: {error}"}
        try:
            def write_direct():
                for i in range(blocks):
                    os.pwrite(fd, buffer, i * BLOCK)
                os.fsync(fd)

            def read_direct():
                for i in range(blocks):
                    os.preadv(fd, [buffer], i * BLOCK)

            write_s, read_s = _timed(write_direct), _timed(read_direct)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDWR | os.O_TRUNC)
        try:
            def write_buffered():
                for i in range(blocks):
                    os.pwrite(fd, buffer, i * BLOCK)
                os.fdatasync(fd)

            buffered_s = _timed(write_buffered)
        finally:
            os.close(fd)
    finally:
        os.unlink(path)
        buffer.close()
    moved = blocks * BLOCK / 1e9
    return {"bytes": blocks * BLOCK, "direct_write_GBps": moved / write_s, "direct_read_GBps": moved / read_s,
            "buffered_write_fdatasync_GBps": moved / buffered_s}

"""Disk-tier files on a shared machine: nothing named, nothing left behind on any exit, nothing of
another process visible, a foreign world-writable directory refused, tampering and planted files
detected or ignored, and a disk-full error that is not reported once space is back."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_offload

save = torch.ops.offload.offload_save
restore = torch.ops.offload.offload_restore
CPU = torch.device("cpu")


def _disk_manager(directory):
    return torch_offload.OffloadManager(disk_dir=str(directory), disk_only=True)


def _regular_files(directory):
    return [os.path.join(d, f) for d, _, files in os.walk(directory) for f in files]


def _open_files_in(directory, pid="self"):
    """Descriptors of process `pid` on files in `directory` (unnamed files show as '#N (deleted)')."""
    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + "/"):
            fds.append(int(fd))
    return fds


def _child(code, directory, prefix=()):
    script = textwrap.dedent("""
        import sys, time, torch, torch_offload
        save, restore = torch.ops.offload.offload_save, torch.ops.offload.offload_restore
        m = torch_offload.OffloadManager(disk_dir=sys.argv[1], disk_only=True)
    """) + textwrap.dedent(code)
    return subprocess.Popen([*prefix, sys.executable, "-c", script, str(directory)], stdout=subprocess.PIPE,
                            text=True, env=os.environ.copy())


def test_tensors_on_disk_are_open_files_without_a_name(tmp_path):
    m = _disk_manager(tmp_path)
    handles = [save(torch.randn(1000), m.id()) for _ in range(3)]
    m.synchronize()
    assert len(_open_files_in(tmp_path)) == 3 and m.stats()["disk_files"] == 3
    assert _regular_files(tmp_path) == []
    del handles
    # Freed, the files stay open for the next tensors of their size, until empty_pool().
    assert len(_open_files_in(tmp_path)) == 3 and m.stats()["disk_files"] == 0
    assert m.stats()["disk_bytes_cached"] == 3 * 4000
    m.empty_pool()
    assert _open_files_in(tmp_path) == [] and m.stats()["disk_bytes_cached"] == 0


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "os._exit"])
def test_nothing_is_left_behind_however_the_process_ends(tmp_path, how):
    child = _child("""
        hs = [save(torch.randn(4096), m.id()) for _ in range(8)]
        m.synchronize()
        print("ready", flush=True)
        if sys.argv[2] == "os._exit":
            import os; os._exit(0)
        time.sleep(60)
    """.replace("sys.argv[2]", repr(how)), tmp_path)
    assert child.stdout.readline().strip() == "ready"
    if how != "os._exit":
        assert len(_open_files_in(tmp_path, child.pid)) == 8  # the data really is on disk
        child.send_signal(getattr(signal, how))
    child.wait(timeout=60)
    assert _regular_files(tmp_path) == []


def test_two_processes_sharing_a_disk_dir_never_see_each_others_files(tmp_path):
    # Same tensor shapes and save order in both: names derived from a pid and a counter collided
    # across PID namespaces (containers on one volume).
    code = """
        value = float(sys.argv[2])
        hs = [save(torch.full((4096,), value + i), m.id()) for i in range(20)]
        m.synchronize()
        time.sleep(0.5)  # both processes hold their files now
        ok = all(torch.equal(restore(h, torch.device("cpu"), m.id()), torch.full((4096,), value + i))
                 for i, h in enumerate(hs))
        print("ok" if ok else "WRONG", flush=True)
    """
    # As root, each child runs in a PID namespace of its own: both are pid 1, like two containers.
    prefix = ("unshare", "--pid", "--fork") if os.geteuid() == 0 and shutil.which("unshare") else ()
    children = [_child(code.replace("sys.argv[2]", repr(str(v))), tmp_path, prefix)
                for v in (1000.0, 2000.0)]
    assert [c.communicate(timeout=120)[0].strip() for c in children] == ["ok", "ok"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another user")
def test_world_writable_directory_of_another_user_is_refused(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 4321, 4321)
    os.chmod(foreign, 0o777)
    with pytest.raises(RuntimeError, match="refusing disk_dir .*belongs to user id 4321"):
        _disk_manager(foreign)
    os.chmod(foreign, 0o755)  # another user's, but only they may write: nothing to fear
    _disk_manager(foreign)


def test_tampered_file_is_a_clear_error_naming_it(tmp_path):
    m = _disk_manager(tmp_path)
    x = torch.randn(2048)
    h = save(x, m.id())
    newest = save(torch.randn(2048), m.id())  # its bytes stay in memory too; x is read from its file
    m.synchronize()
    for fd in _open_files_in(tmp_path):
        with open(f"/proc/self/fd/{fd}", "r+b") as f:  # what another process of this user could do
            f.seek(100)
            f.write(b"\0" * 8)
    with pytest.raises(RuntimeError, match=r"disk-tier file \d+ .*do not match the checksum"):
        restore(h, CPU, m.id())


def test_planted_fifo_and_symlinks_are_never_opened(tmp_path):
    # A FIFO where the IO thread opened a file by name hung it; a symlink made it overwrite the
    # target. Run in a child: a hang must fail this test, not the suite.
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    child = _child("""
        import os
        d, pid = sys.argv[1], os.getpid()
        for i in range(4):  # the names the old scheme gives the next store's files
            name = f"{d}/torch_offload_{pid}_1_{i}.bin"
            os.mkfifo(name) if i % 2 else os.symlink(f"{d}/victim.txt", name)
        m = torch_offload.OffloadManager(disk_dir=d, disk_only=True)
        xs = [torch.randn(512) for _ in range(4)]
        hs = [save(x, m.id()) for x in xs]
        ok = all(torch.equal(restore(h, torch.device("cpu"), m.id()), x) for h, x in zip(hs, xs))
        print("ok" if ok else "WRONG", flush=True)
    """, tmp_path)
    try:
        out = child.communicate(timeout=60)[0].strip()
    finally:
        child.kill()
    assert out == "ok"
    assert victim.read_text() == "precious"


def test_disk_full_error_is_not_reported_once_space_is_back(tmp_path):
    m = _disk_manager(tmp_path)
    m._simulate_full_disk(True)
    a = torch.randn(1024)
    ha = save(a, m.id())  # its write fails: the data stays in host memory
    m.synchronize()
    m._simulate_full_disk(False)  # space was freed
    b = torch.randn(1024)
    hb = save(b, m.id())  # no stale "disk full" error
    assert torch.equal(restore(ha, CPU, m.id()), a) and torch.equal(restore(hb, CPU, m.id()), b)


def test_a_disk_handle_reads_as_its_data_once_written(tmp_path):
    m = _disk_manager(tmp_path)
    x = torch.randn(6, 7)
    h = save(x, m.id())
    m.synchronize()
    # The README allows reading a handle after synchronize(); a disk handle used to read as the
    # bytes of a small key, broadcast. A copy of it restores as a plain tensor.
    assert torch.equal(h, x) and h.is_contiguous()
    assert torch.equal(restore(h.clone(), CPU, m.id()), x)
    with pytest.raises(RuntimeError, match="view of a disk-tier handle"):
        restore(h.t(), CPU, m.id())
    h.add_(1)  # writes to the mapping are the process's own: the file keeps the saved bytes
    assert torch.equal(restore(h, CPU, m.id()), x)


def test_a_nul_character_in_disk_dir_is_refused(tmp_path):
    # The system reads a path up to its first NUL: the files used to go to the directory named by
    # the part before it.
    inside = tmp_path / "tier"
    cut = str(inside) + "\0more"
    with pytest.raises(ValueError, match=r"torch_offload.OffloadManager: disk_dir='.*tier\\x00more' contains a NUL"):
        torch_offload.OffloadManager(disk_dir=cut, disk_only=True)
    with pytest.raises(RuntimeError, match=rf"disk_dir contains a NUL character at position {len(str(inside))} "):
        torch.classes.offload.OffloadManager(4, 1, 0, False, cut, True)
    with pytest.raises(ValueError, match=r"apply\(mode='disk'\): disk_dir='.*' contains a NUL character"):
        torch_offload.apply(torch.nn.Sequential(torch.nn.Linear(4, 4)), "disk", disk_dir=cut)
    assert not inside.exists()

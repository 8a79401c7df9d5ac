"""glibc's mmap threshold fixed, so freed statistics go back to the system."""

from ovalp_flwr.core import memory


def test_only_linux_with_glibc_is_tuned(monkeypatch):
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory.return_large_frees() is False



def test_the_threshold_is_fixed_here():
    """This machine runs glibc: the set-up's statistics rely on it (docs/scale.md has the
    measured effect: 600 in-process clients, RSS 2.3 GB -> 1.1 GB)."""
    assert memory.return_large_frees() is True

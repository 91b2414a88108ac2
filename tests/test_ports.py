"""The ports a multi-host launch gives its servers (`jrl.run.distributed.multihost.pick_port`), which are picked
on the launching host for servers on other hosts."""

import socket

import pytest

pytestmark = pytest.mark.needs_reverb  # jrl.run.distributed.multihost imports Launchpad

from jrl.run.distributed import multihost  # noqa: E402


def test_ports_are_below_the_ephemeral_range_and_never_given_twice():
  # A host's own sockets (Slurm's step daemons, outgoing connections) take ports from its ephemeral
  # range, unseen by the launching host: a server port from that range could be taken when its node
  # binds it. Below the range, and distinct over a launch.
  first_ephemeral = multihost.ephemeral_range()[0]
  ports = [multihost.pick_port() for _ in range(500)]
  assert all(multihost.PORTS_FROM <= port < first_ephemeral for port in ports), (min(ports), max(ports))
  assert len(set(ports)) == len(ports)


def test_a_port_in_use_here_is_skipped(monkeypatch):
  held, released = socket.socket(), socket.socket()
  held.bind(("", 0))
  held.listen()
  released.bind(("", 0))
  free = released.getsockname()[1]
  released.close()
  try:
    taken = held.getsockname()[1]
    monkeypatch.setattr(multihost, "PORTS_FROM", 1024)
    monkeypatch.setattr(multihost, "ephemeral_range", lambda: (65000, 65535))
    draws = iter([taken, taken, free])

    class Draws:
      def randrange(self, low, high):
        return next(draws)

    monkeypatch.setattr(multihost.random, "SystemRandom", Draws)
    port = multihost.pick_port()
  finally:
    held.close()
  assert port == free


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults_to_linux(tmp_path):
  path = tmp_path / "ip_local_port_range"
  path.write_text("40000\t50000\n")
  assert multihost.ephemeral_range(str(path)) == (40000, 50000)
  assert multihost.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)

"""Keeps the servers of local launches on one address (loopback unless told otherwise).

Reverb and courier servers listen on every interface, with no option to change
it; `launch/loopback.c`, preloaded into each node process, turns their wildcard
binds into binds of `JRL_BIND_ADDRESS`. The launcher's environment chooses the
address: unset means 127.0.0.1, an IP address means that address (a multi-host
launcher binds each host's own), and `*` means every interface (no shim).

The shim is compiled with the system C compiler (`$CC`, else `cc`) on first use,
once per source version, into the venv's lib/ (or ~/.cache/jrl). Without a
compiler a local launch stops with a message saying so, rather than quietly
listening on every interface.
"""

import hashlib
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict

from jrl.errors import ConfigError

ADDRESS_ENV = "JRL_BIND_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1"
EVERY_INTERFACE = "*"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loopback.c")


class ShimUnavailable(RuntimeError):
  pass


def bind_address() -> str:
  """The address node servers bind: JRL_BIND_ADDRESS, 127.0.0.1 when unset, '*' for all."""
  address = os.environ.get(ADDRESS_ENV, "").strip() or DEFAULT_ADDRESS
  if address != EVERY_INTERFACE:
    try:
      ipaddress.ip_address(address)
    except ValueError:
      raise ConfigError(ADDRESS_ENV, f"must be an IP address or '{EVERY_INTERFACE}', got '{address}'") from None
  return address


def _cache_dirs():
  yield os.path.join(sys.prefix, "lib")
  yield os.path.join(os.path.expanduser("~"), ".cache", "jrl")


def shim_path() -> str:
  """The compiled shim, built now if this version of the source has not been built yet."""
  with open(SOURCE, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:12]
  name = f"jrl-loopback-{digest}.so"
  for directory in _cache_dirs():
    if os.path.exists(os.path.join(directory, name)):
      return os.path.join(directory, name)
  compiler = shutil.which(os.environ.get("CC", "cc"))
  if compiler is None:
    raise ShimUnavailable(
        f"no C compiler ('{os.environ.get('CC', 'cc')}') to build {SOURCE}, which keeps the servers of local "
        f"launches on {DEFAULT_ADDRESS}; install one (e.g. apt-get install gcc), or set {ADDRESS_ENV}='*' to "
        "let them listen on every interface")
  errors = []
  for directory in _cache_dirs():
    try:
      os.makedirs(directory, exist_ok=True)
      fd, partial = tempfile.mkstemp(suffix=".so", dir=directory)
      os.close(fd)
    except OSError as e:
      errors.append(f"{directory}: {e}")
      continue
    out = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", partial, SOURCE, "-ldl"],
                         capture_output=True, text=True)
    if out.returncode != 0:
      os.unlink(partial)
      raise ShimUnavailable(f"{compiler} failed to build {SOURCE}:\n{out.stderr.strip()}")
    os.chmod(partial, 0o755)
    os.replace(partial, os.path.join(directory, name))  # atomic: concurrent launches may build it too
    return os.path.join(directory, name)
  raise ShimUnavailable(f"no writable place for the loopback shim: {'; '.join(errors)}")


def node_env(address: str) -> Dict[str, str]:
  """Environment entries that make a node process's servers bind `address`."""
  if address == EVERY_INTERFACE:
    return {}
  preload = " ".join(p for p in (shim_path(), os.environ.get("LD_PRELOAD", "")) if p)
  return {"LD_PRELOAD": preload, ADDRESS_ENV: address}


if __name__ == "__main__":  # set-up builds it ahead: python -m launch.loopback
  try:
    print(shim_path())
  except ShimUnavailable as e:
    print(f"launch.loopback: {e}", file=sys.stderr)
    sys.exit(1)

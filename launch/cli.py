"""Command-line flags generated from config dataclasses (one flag per field), and how a command
ends (`end_process`)."""

import argparse
import atexit
import dataclasses
import difflib
import fractions
import functools
import os
import sys
import textwrap
import typing
from typing import Any, Dict, NoReturn, Optional, Sequence, Tuple, Type

from jrl.errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
  """argparse whose errors are a single line and exit status 2; no abbreviated flags
  (a typo like --learning_rat must not silently set --learning_rate)."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("allow_abbrev", False)
    super().__init__(*args, **kwargs)

  def error(self, message: str) -> NoReturn:
    if message.startswith("unrecognized arguments"):
      unknown = message.split(":", 1)[1].strip()
      message = self._unknown_flag(unknown.split()) or f"unknown config field or flag: {unknown} (see --help)"
    print(f"{self.prog}: error: {message}", file=sys.stderr)
    sys.exit(2)

  def _unknown_flag(self, unknown: Sequence[str]) -> Optional[str]:
    """'unknown flag --X; did you mean --Y?' for the first unknown flag (the closest listed flag, if
    any is close); None when no unknown word is a flag."""
    flag = next((word.split("=", 1)[0] for word in unknown if word.startswith("--")), None)
    if flag is None:
      return None
    listed = [option for action in self._actions if action.help != argparse.SUPPRESS
              for option in action.option_strings if option.startswith("--")]
    close = difflib.get_close_matches(flag, listed, n=1, cutoff=0.75)
    return f"unknown flag {flag}; " + (f"did you mean {close[0]}?" if close else "see --help for the flags")


def parse_bool(text: str) -> bool:
  lowered = str(text).lower()
  if lowered in ("1", "true", "yes", "on"):
    return True
  if lowered in ("0", "false", "no", "off"):
    return False
  raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


# Suffixes an integer flag may end with: --steps 100k, 2M.
INT_SUFFIXES = {"k": 10**3, "K": 10**3, "M": 10**6}


def parse_int(text: str) -> int:
  """An integer written as people write step counts: 100000, 100_000, 1e5, 100k, 2.5M; refuses what
  is not a whole number (1.5e0, 0.0005k). Exact (a fraction, not a float): 1.0000000000000001e0 is
  refused, not rounded to 1."""
  word = str(text).strip().replace("_", "")
  scale = INT_SUFFIXES.get(word[-1:], 1)
  if scale != 1:
    word = word[:-1]
  try:
    value = fractions.Fraction(word) * scale if "/" not in word else None  # Fraction also reads '3/1'
  except ValueError:  # not a number, or 'inf', 'nan'
    value = None
  if value is None or value.denominator != 1:
    raise argparse.ArgumentTypeError(f"expected a whole number (e.g. 100000, 1e5, 100k, 2M), got '{text}'")
  return int(value)


def parse_int_tuple(text: str) -> Tuple[int, ...]:
  try:
    return tuple(int(part) for part in str(text).split(",") if part.strip())
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from e


@functools.lru_cache(maxsize=None)
def _source_lines(cls: Type) -> Tuple[str, ...]:
  """The class's source lines, read once per class (not once per field: 0.15 s of start-up)."""
  import inspect
  try:
    return tuple(inspect.getsource(cls).splitlines())
  except (OSError, TypeError):
    return ()


def _field_doc(cls: Type, name: str) -> str:
  """The trailing `# comment` of a dataclass field, with the comment-only lines that continue it,
  used as its help text; read where the field is declared (a base class of `cls`: the experiment
  config's fields are declared by its groups' dataclasses)."""
  for klass in getattr(cls, "__mro__", (cls,)):
    if name not in vars(klass).get("__annotations__", {}):
      continue
    lines = _source_lines(klass)
    for i, line in enumerate(lines):
      stripped = line.strip()
      if stripped.startswith(f"{name}:") and "#" in stripped:
        column = line.index("#")
        parts = [stripped.split("#", 1)[1].strip()]
        for following in lines[i + 1:]:
          if not following.strip().startswith("#") or following.index("#") != column:
            break
          parts.append(following.strip()[1:].strip())
        return " ".join(parts)
  return ""


def add_grouped_flags(parser: argparse.ArgumentParser, cls: Type, groups, title_prefix: str = "",
                      notes: Optional[Dict[str, str]] = None) -> None:
  """One flag per field of `cls`, under one `--help` heading per group: `groups` is a sequence of
  (name, description, field names) that together name every field once; `notes` (by group name)
  is a line printed under a heading."""
  named = [name for _, _, names in groups for name in names]
  every = [f.name for f in dataclasses.fields(cls)]
  if sorted(named) != sorted(every):
    raise ValueError(f"{cls.__name__} groups miss or repeat fields: {sorted(set(every) ^ set(named))}")
  for name, description, names in groups:
    note = (notes or {}).get(name)
    add_dataclass_flags(parser, cls, f"{title_prefix}{name}: {description}", only=names,
                        description=textwrap.fill(note, width=76) if note else None)


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: Type, title: str, skip: Sequence[str] = (),
                        only: Optional[Sequence[str]] = None, description: Optional[str] = None) -> None:
  group = parser.add_argument_group(title, description)
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    if field.name in skip or (only is not None and field.name not in only):
      continue
    hint = hints[field.name]
    if typing.get_origin(hint) is typing.Union:  # Optional[X]: the flag takes X; the default may be None
      hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    default = field.default
    doc = _field_doc(cls, field.name)
    if hint is bool:
      group.add_argument(f"--{field.name}", type=parse_bool, nargs="?", const=True, default=None,
                         metavar="BOOL", help=f"{doc} (default {default})")
    elif typing.get_origin(hint) is tuple:
      group.add_argument(f"--{field.name}", type=parse_int_tuple, default=None, metavar="N,N",
                         help=f"{doc} (default {','.join(map(str, default))})")
    else:
      group.add_argument(f"--{field.name}", type=parse_int if hint is int else hint, default=None,
                         metavar=hint.__name__.upper(), help=f"{doc} (default {default})")


def given_fields(cls: Type, args: argparse.Namespace) -> Dict[str, Any]:
  """The fields of `cls` whose flags were given on the command line."""
  return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if getattr(args, f.name, None) is not None}


def build_config(cls: Type, args: argparse.Namespace) -> Any:
  """The dataclass with every flag that was given; validation errors name the field."""
  return cls(**given_fields(cls, args))


def fail(prog: str, error: ConfigError) -> NoReturn:
  print(f"{prog}: error: {error}", file=sys.stderr)
  sys.exit(2)


def preset_name(argv: Sequence[str]) -> Optional[str]:
  """The value of the last --preset in `argv` (None without one)."""
  name = None
  for i, word in enumerate(argv):
    if word == "--preset" and i + 1 < len(argv):
      name = argv[i + 1]
    elif word.startswith("--preset="):
      name = word.split("=", 1)[1]
  return name


def with_preset(argv: Sequence[str], agent_name: str, agent) -> list:
  """`argv` with its --preset's flags put before it (the command's own flags, later, win); ConfigError
  for an unknown preset, or one given with --resume (a resumed run keeps its config)."""
  from jrl.experiment.config import ExperimentConfig
  from jrl.experiment.presets import find_preset
  name = preset_name(argv)
  if not name:
    return list(argv)
  if any(word == "--resume" or word.startswith("--resume=") for word in argv):
    raise ConfigError("preset", "cannot change when resuming: the run keeps the settings in its config.json")
  fields = tuple(f.name for f in dataclasses.fields(ExperimentConfig)) + tuple(
      f.name for f in dataclasses.fields(agent.Config))
  return find_preset(name, agent_name, agent, fields).argv() + list(argv)


def end_process(code: int, everything_written: bool) -> NoReturn:
  """Ends a command with status `code`. Where everything it writes is written, closed and synced
  (`everything_written`: a finished run, sweep or evaluation), the interpreter's own teardown is skipped:
  atexit handlers run, the standard streams are flushed, and the process exits. That teardown
  is garbage collection over the heap a run leaves (the JAX, flax and TFP modules' objects: most
  of a second after a device run) and the C++ destructors of TensorFlow and Reverb. Elsewhere
  (bad input, a failure, an interrupt) the usual exit."""
  if not everything_written:
    sys.exit(code)
  atexit._run_exitfuncs()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(code)

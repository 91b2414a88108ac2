"""MkDocs hooks of the jrl site (mkdocs.yml: `hooks:`).

A page line `<!-- jrl:config-table MODULE:CLASS -->` becomes the table of that config dataclass's
fields: the flag, its type, its default and the field's trailing `# comment` (the same help text
`launch.train --help` prints, read by `launch.cli._field_doc`). Fields are grouped as the module's
`FIELD_GROUPS` says where it has one, otherwise by the comment lines of their own between fields
(`# Optimiser.`). The tables are made from the code at build time, so
they cannot drift from it.

Docstrings write array shapes in brackets (`metrics["priorities"] [B]`), which Markdown reads as a
reference link to an object named `B`; `on_page_content` turns such shape references back into
text before mkdocs-autorefs would report them as missing cross-references.
"""

import dataclasses
import html
import importlib
import inspect
import re
import sys
import typing
from typing import Any, List, Optional, Tuple, Type

MARKER = re.compile(r"^<!-- jrl:config-table ([\w.]+):(\w+) -->$", re.MULTILINE)
AUTOREF = re.compile(r'<autoref (?P<attrs>[^>]*)>(?P<title>.*?)</autoref>', re.DOTALL)
IDENTIFIER = re.compile(r'identifier="(?P<id>[^"]*)"')
# A shape, not an object: one or two capitals (B, T, U, E), or anything with a comma, space or star.
SHAPE = re.compile(r"[A-Z][A-Z0-9]?|.*[, *].*")


def _import_config(module_name: str, class_name: str) -> Type:
  # TFP (through rlax and distrax) refuses TF 2.8 once TensorFlow is loaded: import them before
  # anything that could pull in reverb.
  import distrax  # noqa: F401
  import rlax  # noqa: F401
  return getattr(importlib.import_module(module_name), class_name)


def _type_name(hint: Any) -> str:
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is typing.Union:
    return " or ".join("None" if arg is type(None) else _type_name(arg) for arg in args)
  if origin is tuple:
    return f"tuple of {_type_name(args[0])}"
  return getattr(hint, "__name__", str(hint))


def _default_text(value: Any) -> str:
  if isinstance(value, tuple):
    return ",".join(map(str, value))
  if isinstance(value, str):
    return value if value else '""'
  return repr(value)


def _own_source(cls: Type) -> List[str]:
  try:
    return inspect.getsource(cls).splitlines()
  except (OSError, TypeError):
    return []


def _field_line(cls: Type, name: str) -> Tuple[Optional[Type], int]:
  """The class of `cls`'s MRO that declares field `name`, and the field's line in its source."""
  for klass in cls.__mro__:
    for index, line in enumerate(_own_source(klass)):
      if line.strip().startswith(f"{name}:"):
        return klass, index
  return None, -1


def _doc(cls: Type, name: str) -> str:
  """The field's help text, as `launch.train --help` prints it (`launch.cli._field_doc`)."""
  from launch.cli import _field_doc
  for klass in cls.__mro__:  # a field declared by a base class is documented there
    if dataclasses.is_dataclass(klass):
      text = _field_doc(klass, name)
      if text:
        return text
  return ""


def _group(cls: Type, name: str) -> str:
  """The comment line of its own directly above the field, if any (`# Optimiser.`)."""
  klass, index = _field_line(cls, name)
  if klass is None or index == 0:
    return ""
  lines = _own_source(klass)
  indent = lines[index][:len(lines[index]) - len(lines[index].lstrip())]

  def is_heading(line: str) -> bool:  # a comment at the fields' indentation, not a continued field comment
    return line.startswith(indent + "#")

  if not is_heading(lines[index - 1]):
    return ""
  first = index - 1  # a heading may be a paragraph of comment lines
  while first > 0 and is_heading(lines[first - 1]):
    first -= 1
  return " ".join(line.strip()[1:].strip() for line in lines[first:index])


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def _groups(cls: Type) -> List[Tuple[str, List[dataclasses.Field]]]:
  """(heading, fields) in order: the module's FIELD_GROUPS where it has them (the headings of
  `--help`), otherwise the comment lines between the fields."""
  fields = {field.name: field for field in dataclasses.fields(cls)}
  declared = getattr(sys.modules[cls.__module__], "FIELD_GROUPS", None)
  if declared:
    return [(f"{name}: {description}", [fields[n] for n in names if n in fields])
            for name, description, names in declared]
  groups: List[Tuple[str, List[dataclasses.Field]]] = [("", [])]
  for field in fields.values():
    heading = _group(cls, field.name)
    if heading:
      groups.append((heading, []))
    groups[-1][1].append(field)
  return [group for group in groups if group[1]]


def config_table(cls: Type) -> str:
  hints = typing.get_type_hints(cls)
  rows = ["| flag | type | default | meaning |", "|---|---|---|---|"]
  for heading, fields in _groups(cls):
    if heading:
      rows.append(f"| **{_cell(heading)}** | | | |")
    for field in fields:
      rows.append(f"| `--{field.name}` | {_cell(_type_name(hints[field.name]))} | "
                  f"`{_cell(_default_text(field.default))}` | {_cell(_doc(cls, field.name))} |")
  return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
  del page, config, files
  return MARKER.sub(lambda m: config_table(_import_config(m.group(1), m.group(2))), markdown)


def _unlink_shapes(match: "re.Match[str]") -> str:
  found = IDENTIFIER.search(match.group("attrs"))
  if found and SHAPE.fullmatch(html.unescape(found.group("id"))):
    return f"[{match.group('title')}] [{found.group('id')}]"
  return match.group(0)


def on_page_content(content: str, page: Any, config: Any, files: Any) -> str:
  del page, config, files
  return AUTOREF.sub(_unlink_shapes, content)

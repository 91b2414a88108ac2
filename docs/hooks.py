"""MkDocs hooks of the jrl site (mkdocs.yml: `hooks:`).

A page line `<!-- jrl:config-table MODULE:CLASS -->` becomes the table of that config dataclass's
fields: the flag, its type, its default and the field's trailing `# comment` (the same help text
`launch.train --help` prints, read by `launch.cli._field_doc`). Fields are grouped as the module's
`FIELD_GROUPS` says where it has one, otherwise by the comment lines of their own between fields
(`# Optimiser.`). The tables are made from the code at build time, so
they cannot drift from it.

Text in angle brackets outside a code span (`runs/<agent>-<env>-s<seed>-<time>`, in a field's
comment or a page) reaches the HTML as tags, and the browser shows nothing of them
(`runs/--s-`); `mkdocs build --strict` does not see it. The table cells escape them, and
`on_page_content` checks every rendered page: an element that is opened and never closed (a
placeholder read as a tag, `<agent>`, or `<time>`, which is an HTML element too) or closed and never
opened is a warning, which --strict makes a failed build (`swallowed_tags`).

Docstrings write array shapes in brackets (`metrics["priorities"] [B]`), which Markdown reads as a
reference link to an object named `B`; `on_page_content` turns such shape references back into
text before mkdocs-autorefs would report them as missing cross-references.
"""

import dataclasses
import html
import html.parser
import importlib
import inspect
import logging
import re
import sys
import typing
from typing import Any, List, Optional, Tuple, Type

log = logging.getLogger("mkdocs.hooks.jrl")  # under "mkdocs": its warnings count for --strict

MARKER = re.compile(r"^<!-- jrl:config-table ([\w.]+):(\w+) -->$", re.MULTILINE)
AUTOREF = re.compile(r'<autoref (?P<attrs>[^>]*)>(?P<title>.*?)</autoref>', re.DOTALL)
IDENTIFIER = re.compile(r'identifier="(?P<id>[^"]*)"')
# A shape, not an object: one or two capitals (B, T, U, E), or anything with a comma, space or star.
SHAPE = re.compile(r"[A-Z][A-Z0-9]?|.*[, *].*")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
# Elements without an end tag (https://html.spec.whatwg.org/#void-elements).
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())


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


def _escape_outside_code(text: str) -> str:
  """`<` and `>` as entities except inside code spans, where Markdown shows them as typed."""
  out, last = [], 0
  for span in CODE_SPAN.finditer(text):
    out += [text[last:span.start()].replace("<", "&lt;").replace(">", "&gt;"), span.group(0)]
    last = span.end()
  return "".join(out + [text[last:].replace("<", "&lt;").replace(">", "&gt;")])


def _cell(text: str) -> str:
  return _escape_outside_code(text).replace("|", "\\|")


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


class _TagBalance(html.parser.HTMLParser):
  """Start and end tags paired as a stack; what does not pair is collected."""

  def __init__(self) -> None:
    super().__init__(convert_charrefs=True)
    self.open: List[str] = []
    self.unpaired: List[str] = []

  def handle_starttag(self, tag: str, attrs: Any) -> None:
    if tag not in VOID:
      self.open.append(tag)

  def handle_endtag(self, tag: str) -> None:
    if tag in VOID:
      return
    if tag not in self.open:
      self.unpaired.append(f"</{tag}>")
      return
    at = len(self.open) - 1 - self.open[::-1].index(tag)
    self.unpaired += [f"<{inner}>" for inner in self.open[at + 1:]]  # opened inside this element, never closed
    del self.open[at:]


def swallowed_tags(content: str) -> List[str]:
  """The tags of a rendered page (HTML) that do not pair up, in order: `<agent>` for a placeholder
  the browser reads as an element (and shows nothing of). Markdown, the Python handler of
  mkdocstrings and the extensions of mkdocs.yml close every element they open, so a rendered page
  has none unless text in angle brackets reached it as HTML."""
  parser = _TagBalance()
  parser.feed(content)
  parser.close()
  return parser.unpaired + [f"<{tag}>" for tag in parser.open]


def on_page_content(content: str, page: Any, config: Any, files: Any) -> str:
  del config, files
  swallowed = swallowed_tags(content)
  if swallowed:
    log.warning(f"{page.file.src_uri}: text in angle brackets reached the page as HTML tags, which the browser "
                f"does not show: {', '.join(dict.fromkeys(swallowed))}; write it in a code span or as &lt;...&gt;")
  return AUTOREF.sub(_unlink_shapes, content)

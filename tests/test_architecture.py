"""docs/architecture.md against the import-linter contracts (pyproject.toml [tool.importlinter]) and
the tree: the page's table of layers is the contract's, layer for layer (top first), module for
module; every module a contract names exists and every top-level module of jrl/ is in a layer;
every path and `jrl.`/`launch.` name the page gives exists; every agent folder is on the page.

Pure text and file checks (no import-linter, no JAX): they run in either venv. Each check returns
its problems, so a planted fault (an agent folder the page leaves out, a layer the page lacks, a
module that is gone) is shown to be caught.
"""

import ast
import importlib
import pathlib
import re
from typing import List, NamedTuple, Sequence

try:
  import tomllib
except ImportError:  # Python 3.10 (.venv): pytest's own dependency
  import tomli as tomllib

import jrl

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PYPROJECT = ROOT / "pyproject.toml"
LAYERS_HEADING = "## The layers"
MAIN_CONTRACT = "jrl's layers: each imports only from the layers below it"  # jrl.run's own is in the text
# Folders whose paths the page may name, relative to the repository root.
TREE_FOLDERS = ("jrl", "launch", "tests", "bench", "examples", "scripts", "docs")


class Layer(NamedTuple):
  modules: frozenset
  independent: bool  # siblings that may not import one another ("a | b"; "a : b" may)


def contract_layers(pyproject_text: str) -> List[Layer]:
  """The layers contract's layers, top first."""
  contracts = tomllib.loads(pyproject_text)["tool"]["importlinter"]["contracts"]
  (layers,) = [c["layers"] for c in contracts if c["name"] == MAIN_CONTRACT]
  return [Layer(frozenset(name.strip() for name in re.split(r"[|:]", layer)), "|" in layer) for layer in layers]


def page_layers(page: str) -> List[Layer]:
  """The rows of the table under the page's layers heading, top first: the modules each row's first
  cell names in backticks, and whether it says '(independent)'."""
  section = page.split(LAYERS_HEADING, 1)[1].split("\n## ", 1)[0] if LAYERS_HEADING in page else ""
  rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # header, separator
  layers = []
  for row in rows:
    first = row.strip("|").split("|")[0]
    layers.append(Layer(frozenset(re.findall(r"`([\w.]+)`", first)), "(independent)" in first))
  return layers


def layer_problems(page: str, pyproject_text: str) -> List[str]:
  """Where the page's layers and the contract's differ."""
  mine, theirs = page_layers(page), contract_layers(pyproject_text)
  if not mine:
    return [f"the page has no table of layers under '{LAYERS_HEADING}'"]
  problems = []
  if len(mine) != len(theirs):
    problems.append(f"the page has {len(mine)} layers, the contract {len(theirs)}")
  for index, (row, layer) in enumerate(zip(mine, theirs)):
    for name in sorted(layer.modules - row.modules):
      problems.append(f"layer {index + 1}: {name} is in the contract, not on the page")
    for name in sorted(row.modules - layer.modules):
      problems.append(f"layer {index + 1}: {name} is on the page, not in the contract")
    if row.independent != layer.independent and len(layer.modules) > 1:
      problems.append(f"layer {index + 1}: the contract's siblings are {'' if layer.independent else 'not '}"
                      "independent, the page says otherwise")
  return problems


def module_file(name: str, root: pathlib.Path = ROOT):
  """The file of a dotted module name in the tree (package: its __init__.py), or None."""
  base = root.joinpath(*name.split("."))
  for path in (base.with_suffix(".py"), base / "__init__.py"):
    if path.is_file():
      return path
  return None


def contract_module_problems(pyproject_text: str, root: pathlib.Path = ROOT) -> List[str]:
  """Modules a contract names that do not exist, and top-level modules of jrl/ no layer names."""
  named = set().union(*(layer.modules for layer in contract_layers(pyproject_text)))
  problems = [f"the contract names {name}, which does not exist" for name in sorted(named)
              if module_file(name, root) is None]
  for path in sorted((root / "jrl").iterdir()):
    name = "jrl." + path.stem
    is_module = (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    if is_module and name not in named:
      problems.append(f"{name} is in no layer of the contract")
  return problems


def defined_names(path: pathlib.Path) -> set:
  """Names a module binds at its top level (definitions, assignments, imports)."""
  names = set()
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      names.update(t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
  return names


def dotted_name_exists(name: str, root: pathlib.Path = ROOT) -> bool:
  """`jrl.replay.local` (a module), `jrl.replay.calls_due` (a name one binds), `jrl.load_policy`
  (a stable name of `import jrl`), or an old module path that `jrl` aliases."""
  if name in jrl.MOVED_MODULES:
    return True
  parts = name.split(".")
  for cut in range(len(parts), 0, -1):
    path = module_file(".".join(parts[:cut]), root)
    if path is None:
      continue
    if cut == len(parts):
      return True
    rest = parts[cut]
    # A name the module binds, or a lazy one it lists in `__all__` (`jrl.load_policy`, `jrl.replay.calls_due`).
    return rest in defined_names(path) or rest in getattr(importlib.import_module(".".join(parts[:cut])), "__all__", ())
  return False


def path_problems(page: str, root: pathlib.Path = ROOT) -> List[str]:
  """Paths (`jrl/replay/`, `jrl/run/distributed/nodes.py`; `<name>` is any folder) and dotted names (`jrl.types`)
  the page gives that the tree lacks."""
  problems = []
  folders = "|".join(TREE_FOLDERS)
  for path in sorted(set(re.findall(rf"(?<![\w./-])((?:{folders})/[\w./<>*-]*)", page))):
    if re.search(r"-v\d+$", path):  # an env id (`jrl/MaskedCartPole-v1`), not a path
      continue
    pattern = re.sub(r"<\w+>", "*", path.rstrip("/."))
    if not list(root.glob(pattern)):
      problems.append(f"the page names {path}, which does not exist")
  for name in sorted(set(re.findall(r"`((?:jrl|launch)(?:\.\w+)+)`", page))):
    if not dotted_name_exists(name, root):
      problems.append(f"the page names {name}, which does not exist")
  return problems


def agent_folders(root: pathlib.Path = ROOT) -> List[str]:
  return sorted(p.name for p in (root / "jrl" / "agents").iterdir() if (p / "__init__.py").is_file())


def agent_problems(page: str, folders: Sequence[str]) -> List[str]:
  """Agent folders that no line naming `jrl/agents/` lists by name."""
  lines = [line for line in page.splitlines() if "jrl/agents/" in line]
  return [f"the agent folder jrl/agents/{name}/ is not on the page" for name in folders
          if not any(re.search(rf"\b{name}\b", line) for line in lines)]


def _page() -> str:
  return PAGE.read_text()


def _pyproject() -> str:
  return PYPROJECT.read_text()


def test_the_page_lists_the_contract_layers():
  assert layer_problems(_page(), _pyproject()) == []


def test_the_contract_names_the_tree():
  assert contract_module_problems(_pyproject()) == []


def test_what_the_page_names_exists():
  assert path_problems(_page()) == []


def test_every_agent_folder_is_on_the_page():
  folders = agent_folders()
  assert {"dqn", "td3", "pqn"} <= set(folders)
  assert agent_problems(_page(), folders) == []


def test_planted_differences_are_caught(tmp_path):
  """Each check finds a fault planted in the real page, contract or tree."""
  page, pyproject = _page(), _pyproject()
  # The contract gains a layer and a sibling the page does not have.
  grown = pyproject.replace('"jrl.run",', '"jrl.run",\n  "jrl.planted",', 1)
  assert grown != pyproject
  count = len(contract_layers(pyproject))
  assert f"the page has {count} layers, the contract {count + 1}" in layer_problems(page, grown)
  sibling = pyproject.replace('"jrl.actors | jrl.learners"', '"jrl.actors | jrl.learners | jrl.sibling"', 1)
  assert "layer 4: jrl.sibling is in the contract, not on the page" in layer_problems(page, sibling)
  # ... and that layer does not exist, while a new top-level module is in none.
  assert "the contract names jrl.planted, which does not exist" in contract_module_problems(grown)
  fake = tmp_path / "tree"
  for name in ("jrl",):
    (fake / name).mkdir(parents=True)
  for layer in contract_layers(pyproject):
    for module in layer.modules:
      target = fake.joinpath(*module.split(".")).with_suffix(".py")
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text("")
  assert contract_module_problems(pyproject, fake) == []
  (fake / "jrl" / "unlayered.py").write_text("")
  assert contract_module_problems(pyproject, fake) == ["jrl.unlayered is in no layer of the contract"]
  # The page names a module and a file that do not exist, and leaves an agent out.
  planted = page + "\n`jrl.replay.no_such_module` and `launch/no_such_tool.py`\n"
  assert path_problems(planted) == ["the page names launch/no_such_tool.py, which does not exist",
                                    "the page names jrl.replay.no_such_module, which does not exist"]
  assert agent_problems(page, agent_folders() + ["planted_agent"]) == [
      "the agent folder jrl/agents/planted_agent/ is not on the page"]

"""The documentation site (docs/, mkdocs.yml): it builds with --strict and no warning, its config
tables are generated, its Python programs run as typed, and the flags its commands give
`launch.train` exist.

Python blocks fenced as `python` are whole programs: each runs in a fresh namespace from the
repository root (mktestdocs finds them; blocks fenced `py` are excerpts and are not run). The
site is built by `scripts/build_docs.sh` (what `make docs` runs: it installs
requirements-docs.txt into .venv once), so a run under another interpreter (`make test-core`)
skips the build; the programs use only the core and run under either.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))

# (page, index of its python block) -> why it is in the slow tier: programs that take more than
# ~10 s. None now: the two that train (library.md's own loop, 1,000 env steps; checkpoints.md's
# 2,000-step run) take 4-10 s each in the test process (2-core box, other tests running), and the
# whole file 50-65 s, the site's build (12-17 s) included.
SLOW_PROGRAMS = {}


def _grab_python_blocks(text):
  from mktestdocs import grab_code_blocks  # requirements-docs.txt; pure Python
  return grab_code_blocks(text, lang="python")


def _programs():
  try:
    import mktestdocs  # noqa: F401
  except ImportError:  # installed by scripts/build_docs.sh (make docs) into .venv
    return [pytest.param(None, None, marks=pytest.mark.skip(reason="mktestdocs not installed: run make docs"),
                         id="mktestdocs-missing")]
  params = []
  for page in PAGES:
    name = page.relative_to(DOCS).as_posix()
    for index, source in enumerate(_grab_python_blocks(page.read_text())):
      marks = [pytest.mark.slow] if (name, index) in SLOW_PROGRAMS else []
      params.append(pytest.param(name, source, marks=marks, id=f"{name}[{index}]"))
  return params


def _uses_project_venv() -> bool:
  venv = ROOT / ".venv"
  return pathlib.Path(sys.prefix).resolve() == venv.resolve() if venv.exists() else False


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
  """The site built as `make docs` builds it, into a temporary folder: (site dir, output)."""
  if not _uses_project_venv():
    pytest.skip("the site is built with .venv (make docs); this run uses another interpreter")
  site = tmp_path_factory.mktemp("site")
  start = time.perf_counter()
  result = subprocess.run(["bash", "scripts/build_docs.sh", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
  output = result.stdout + result.stderr
  print(f"docs build: {time.perf_counter() - start:.1f} s, exit {result.returncode}")
  assert result.returncode == 0, output
  return site, output


def test_site_builds_strict_without_warnings(built_site):
  site, output = built_site
  warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
  assert not warnings, "\n".join(warnings)
  for page in PAGES:
    html = site / page.relative_to(DOCS).with_suffix(".html")
    assert html.is_file(), f"{page} was not built"


def test_config_tables_are_generated_from_the_dataclasses(built_site):
  site, _ = built_site
  import dataclasses
  from jrl.agents import AGENTS, get_agent
  from jrl.experiment.config import ExperimentConfig
  for name in AGENTS:
    html = (site / "agents" / f"{name}.html").read_text()
    assert "jrl:config-table" not in html
    for field in dataclasses.fields(get_agent(name).Config):
      assert f"--{field.name}<" in html, f"agents/{name}: no row for {field.name}"
  html = (site / "training.html").read_text()
  assert all(f"--{field.name}<" in html for field in dataclasses.fields(ExperimentConfig))


def test_placeholders_in_angle_brackets_show_on_the_built_pages(built_site):
  """The run_dir field's comment, `runs/<agent>-<env>-s<seed>-<time>`, once showed as `runs/--s-`."""
  site, _ = built_site
  for page in ("training.html", "api/experiment-config.html"):
    assert "runs/&lt;agent&gt;-&lt;env&gt;-s&lt;seed&gt;-&lt;time&gt;" in (site / page).read_text(), page


def _hooks():
  import importlib.util
  spec = importlib.util.spec_from_file_location("jrl_docs_hooks", DOCS / "hooks.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_build_finds_text_swallowed_as_html_tags():
  """The check `on_page_content` runs on every rendered page (a warning: --strict fails the build),
  fed pages rendered as the site renders them: the defect, in a table and in a paragraph, and the
  same text escaped or in a code span."""
  markdown = pytest.importorskip("markdown")  # requirements-docs.txt
  hooks = _hooks()

  def render(text):
    return markdown.markdown(text, extensions=["tables", "attr_list", "md_in_html", "admonition"])

  table = "| flag | meaning |\n|---|---|\n| `--run_dir` | empty means {} |\n"
  placeholder = "runs/<agent>-<env>-s<seed>-<time>"
  assert hooks.swallowed_tags(render(table.format(placeholder))) == ["<agent>", "<env>", "<seed>", "<time>"]
  assert hooks.swallowed_tags(render(f"Runs go to {placeholder}/ by default.")) == [
      "<agent>", "<env>", "<seed>", "<time>"]
  assert hooks.swallowed_tags(render(table.format(hooks._cell(placeholder)))) == []
  assert hooks.swallowed_tags(render(f"Runs go to `{placeholder}/` by default.\n\n<!-- a comment -->\n\n"
                                     "a &lt;b&gt; line<br>\n\n!!! note\n    text\n")) == []
  assert hooks._cell("`<x>` or <y> | z") == "`<x>` or &lt;y&gt; \\| z"  # code spans show < as typed


def test_api_reference_renders_the_docstrings(built_site):
  site, _ = built_site
  replay = (site / "api" / "replay.html").read_text()
  assert "LocalReplay" in replay and "calls_due" in replay
  dqn = (site / "agents" / "dqn.html").read_text()
  assert "make_learner" in dqn and "Double Q-learning" in dqn


@pytest.mark.parametrize("page, source", _programs())
def test_python_program_runs_as_typed(page, source, monkeypatch, capsys):
  """One `python` block of a page, run as a whole program from the repository root."""
  monkeypatch.chdir(ROOT)
  start = time.perf_counter()
  exec(compile(source, f"docs/{page}", "exec"), {"__name__": "__main__"})  # noqa: S102
  with capsys.disabled():
    print(f"\n  docs/{page}: {time.perf_counter() - start:.1f} s")


def _code_commands(text):
  """Shell commands of fenced bash blocks (continuation lines joined) and of inline code spans."""
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
    commands += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
  commands += re.findall(r"`([^`\n]*-m launch\.train[^`\n]*)`", text)
  return commands


def _train_commands():
  texts = [page.read_text() for page in PAGES] + [(ROOT / "README.md").read_text()]
  return [command for text in texts for command in _code_commands(text) if "-m launch.train" in command]


def test_every_flag_given_to_launch_train_exists():
  """The flags of every `launch.train` command in the docs and the README are flags of its parser
  (for the agent the command names): a renamed field cannot leave a dead flag in the docs."""
  from jrl.agents import get_agent
  from launch.train import make_parser
  commands = _train_commands()
  assert len(commands) >= 10, commands
  for command in commands:
    words = shlex.split(command.split("  #")[0], comments=True)
    words = words[words.index("launch.train") + 1:]
    agent = words[words.index("--agent") + 1] if "--agent" in words else "dqn"
    known = set(make_parser(agent, get_agent(agent))._option_string_actions)
    given = {word.split("=")[0] for word in words if word.startswith("--")}
    assert given <= known, f"{command}: unknown flags {sorted(given - known)}"


# How long a command takes, roughly: "~1 min", "6-9 min", "41 s", "a few seconds", "several minutes",
# "tens of minutes", "of the order of an hour", "runs until stopped"; not "per second".
ROUGH_TIME = re.compile(r"(?:\d|\b(?:an?|few|several|tens of|one to two))\s?(?:s|min|minutes?|h|hours?|seconds?)\b|"
                        r"until stopped")
COMMAND_CELL = re.compile(r"\s*`(?:make |\.venv/bin/|bash )")  # a cell that starts with a command


def _commands_without_a_time(text):
  """The commands of a page that say nothing of how long they take: a ```bash block's command
  (continuation lines joined) without a time in its `# comment`, and a table row with a command
  cell without a time in its other cells."""
  missing = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
    for line in block.replace("\\\n", " ").splitlines():
      command, _, comment = line.partition(" #")
      if command.strip() and not ROUGH_TIME.search(comment):
        missing.append(command.strip())
  for row in re.findall(r"^\|(.*)\|$", text, re.MULTILINE):
    cells = row.split("|")
    commands = [cell for cell in cells if COMMAND_CELL.match(cell)]
    if commands and not ROUGH_TIME.search(" ".join(cell for cell in cells if cell not in commands)):
      missing.append(commands[0].strip())
  return missing


def test_every_command_says_roughly_how_long_it_takes():
  """A user deciding whether to run a command now wants its time on the reference machine (the
  README and docs/index.md say which); the distributed run and the sweeps once gave none."""
  assert _commands_without_a_time("```bash\nmake train   # ~1 min\nmake test\n```\n| `make bench` | x |\n") == [
      "make test", "`make bench`"]
  for page in [ROOT / "README.md"] + PAGES:
    missing = _commands_without_a_time(page.read_text())
    assert not missing, f"{page.relative_to(ROOT)}: no time given for {missing}"


def test_the_lists_of_agent_modules_name_every_agent():
  """The API page and the library page list the agent modules by hand; the API page once left out
  TD3 and PQN."""
  from jrl.registry import AGENTS
  for page in ("api/jrl.md", "library.md"):
    text = (DOCS / page).read_text()
    missing = [name for name in AGENTS if f"`jrl.{name}`" not in text]
    assert not missing, f"docs/{page} does not name {missing}"


def test_no_page_is_left_out_of_the_nav():
  import yaml
  nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

  def files(entry):
    if isinstance(entry, str):
      return [entry]
    if isinstance(entry, list):
      return [f for item in entry for f in files(item)]
    return [f for value in entry.values() for f in files(value)]

  assert sorted(files(nav)) == sorted(page.relative_to(DOCS).as_posix() for page in PAGES)
  assert os.path.isfile(DOCS / "hooks.py")

"""The README's code blocks, and those of the docs pages its quickstart hands over to, cannot rot.

The blocks read are those of ``SOURCES``: the README, docs/usage.md (policies, episode pictures),
docs/interop.md (gymnax and brax) and the launch recipes of docs/distributed.md.

Fast tier: every ``imaginejax`` command of every shell block (also inside ``srun`` / ``gcloud ... --command``)
is parsed by the command's own parser, and the configuration of ``train`` / ``bench`` / ``imagine`` is
loaded and checked as the command would before any data work (keys, values, algorithms, hyperparameters);
every ``make`` target exists; every Python block compiles and uses no name before it binds or imports it.

Slow tier: the chain a reader follows runs verbatim in a fresh directory — ``collect``, ``imagine``, the
``fit()`` block, ``export``, ``evaluate`` (with ``--frames``), the Policy block and the Gymnasium block —
the data each block needs having been written by the blocks before it.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from imaginejax import cli
from imaginejax.bench.sweeps import check_algorithms

REPO = Path(__file__).resolve().parents[1]
README_PATH = REPO / "README.md"
# (file, the heading whose section is read or None for the whole file): the measurement commands of
# docs/distributed.md's other sections use shell variables for their flags and are not a reader's recipe.
SOURCES = [("README.md", None), ("docs/usage.md", None), ("docs/interop.md", None),
           ("docs/distributed.md", "## Launching a job")]


def blocks(language: str) -> list[tuple[str, str]]:
    """("file:first line", text) of every fenced block of ``language`` in ``SOURCES``."""
    found = []
    for name, section in SOURCES:
        lines = (REPO / name).read_text(encoding="utf-8").splitlines()
        first, last = 0, len(lines)
        if section is not None:
            first = lines.index(section)
            last = next((i for i in range(first + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        start = None
        for number in range(first + 1, last + 1):
            line = lines[number - 1]
            if line.startswith("```"):
                if start is None:
                    start, lang = number, line[3:].strip()
                else:
                    if lang == language:
                        found.append((f"{name}:{start + 1}", "\n".join(lines[start:number - 1])))
                    start = None
    return found


def commands(text: str, program: str) -> list[list[str]]:
    """The argument lists of every call of ``program`` (also as ``.../bin/program``) in a shell block:
    continuation lines joined, comments dropped, quoted sub-commands (``--command '...'``) searched too."""
    found = []

    def search(words: list[str]) -> None:
        for i, word in enumerate(words):
            if word == program or word.endswith("/bin/" + program):
                args = []
                for arg in words[i + 1:]:
                    if arg in ("&&", "||", ";", "|"):
                        break
                    args.append(arg)
                found.append(args)
                return
            if i and words[i - 1] in ("--command", "-c"):  # a command line passed as one argument
                search(shlex.split(word))

    for line in text.replace("\\\n", " ").splitlines():
        search(shlex.split(line, comments=True))
    return found


def test_the_readme_has_the_blocks_this_test_reads():
    assert len(blocks("bash")) >= 6 and len(blocks("python")) >= 4
    assert sum(len(commands(text, "imaginejax")) for _, text in blocks("bash")) >= 10
    readme = [where for where, _ in blocks("bash") + blocks("python") if where.startswith("README.md:")]
    assert len(readme) >= 5  # make, install, Gymnasium, the quickstart's commands, fit() and export


def test_the_chain_reads_each_block_it_runs_from_one_place():
    for language, needle in CHAIN:
        assert len([where for where, text in blocks(language) if needle in text]) == 1, needle


@pytest.mark.parametrize("line,args", [(line, args) for line, text in blocks("bash")
                                       for args in commands(text, "imaginejax")],
                         ids=lambda value: value if isinstance(value, str) else " ".join(value[:2]))
def test_every_imaginejax_command_parses_and_its_configuration_checks(line, args, monkeypatch):
    """What a command checks before it works: its flags, and for train / bench / imagine the whole
    configuration with every algorithm's hyperparameters (bench.check_algorithms)."""
    try:
        parsed = cli._build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{line}: imaginejax {' '.join(args)} does not parse")
    if parsed.command in ("train", "bench", "imagine"):
        extra = ["train.algos=[" + ", ".join(f'"{a}"' for a in parsed.algo) + "]"] if getattr(parsed, "algo", None) else []
        extra += [f"data.env={parsed.env}"] if getattr(parsed, "env", None) else []
        check_algorithms(cli._config(parsed, extra))


def test_every_make_target_exists():
    targets = set(re.findall(r"^([a-zA-Z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    called = [args[0] for _, text in blocks("bash") for args in commands(text, "make") if args]
    assert called and not set(called) - targets


def _unbound_names(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every name a module loads before it binds or imports it (builtins excepted)."""
    bound, unbound = set(dir(builtins)), []
    for statement in tree.body:
        scopes = [n for n in ast.walk(statement) if isinstance(n, (ast.Lambda, ast.FunctionDef, ast.comprehension))]
        local = {a.arg for n in scopes if isinstance(n, (ast.Lambda, ast.FunctionDef)) for a in n.args.args}
        local |= {t.id for n in scopes if isinstance(n, ast.comprehension) for t in ast.walk(n.target)
                  if isinstance(t, ast.Name)}
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound | local:
                unbound.append((node.lineno, node.id))
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.FunctionDef):
                bound.add(node.name)
    return unbound


def test_the_unbound_name_check_finds_a_name_used_before_it_is_defined():
    assert _unbound_names(ast.parse("a = obs\nobs = 1\nb = [x for x in obs]\nf = lambda y: y + a")) == [(1, "obs")]


@pytest.mark.parametrize("line,text", blocks("python"), ids=[where for where, _ in blocks("python")])
def test_every_python_block_compiles_and_defines_what_it_uses(line, text):
    tree = ast.parse(text, filename=line)
    unbound = _unbound_names(tree)
    assert not unbound, f"{line}: used before it is defined: " + ", ".join(
        f"{name} (block line {at})" for at, name in unbound)


# ----------------------------------------------------------------------------------- the chain, verbatim


# The blocks the slow test runs, in the reader's order: (language, a string only that block holds).
CHAIN = [("bash", "imaginejax collect"), ("python", "from imaginejax import fit"), ("bash", "imaginejax export"),
         ("python", "Policy.load"), ("python", "import gymnasium")]


def _block_with(language: str, needle: str) -> str:
    [text] = [text for _, text in blocks(language) if needle in text]
    return text


def test_the_readme_chain_runs_verbatim(tmp_path):
    """collect -> imagine -> fit() -> export -> evaluate -> the Policy block (docs/usage.md) -> the Gymnasium
    block, in a fresh directory with a fresh cache, each as the README and docs/usage.md write it."""
    env = dict(os.environ, IMAGINEJAX_HOME=str(tmp_path / "home"), MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    exe = str(Path(sys.executable).parent / "imaginejax")

    def shell(text: str, names: tuple[str, ...]) -> None:
        for args in commands(text, "imaginejax"):
            if args[0] in names:
                done = subprocess.run([exe, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3000)
                assert done.returncode == 0, f"imaginejax {' '.join(args)}:\n{done.stderr[-3000:]}"

    def python(text: str) -> None:
        done = subprocess.run([sys.executable, "-c", text], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=3000)
        assert done.returncode == 0, f"{text}\n{done.stderr[-3000:]}"

    shell(_block_with("bash", "imaginejax collect"), ("collect", "imagine"))
    python(_block_with("python", "from imaginejax import fit"))
    shell(_block_with("bash", "imaginejax export"), ("export", "evaluate"))
    python(_block_with("python", "Policy.load"))
    python(_block_with("python", "import gymnasium"))
    assert (tmp_path / "ws" / "imagine" / "clevr-easy-imaginary" / "manifest.json").is_file()
    assert (tmp_path / "policy" / "policy.json").is_file()


# ----------------------------------------------------------------------------------- links


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation but - and _ dropped, spaces
    to -, a repeated heading numbered."""
    found, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def test_every_relative_link_of_the_readme_and_docs_reaches_a_file_and_heading():
    broken = []
    for page in [README_PATH, *sorted((REPO / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken

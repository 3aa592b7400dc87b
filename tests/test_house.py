"""tools/house.py (the drawing of the house) on a synthetic package with a known cycle, a known upward
import and a known walk."""

from __future__ import annotations

import pathlib
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import house  # noqa: E402

FILES = {
    "pyproject.toml": """
        [project]
        name = "pkg"
        [project.scripts]
        pkg = "pkg.cli:main"
        [tool.setuptools]
        package-dir = { "pkg" = "src", "pkg.low" = "lowdir" }
        """,
    "tests/test_layers.py": """
        ROOT_PACKAGE = "pkg"
        LAYERS = (
            (0, "core", ("pkg", "pkg.config")),
            (1, "low", ("pkg.low",)),  # a comment, as in the real table
            (2, "app", ("pkg.app", "pkg.cli")),
        )
        """,
    "src/__init__.py": "",
    "src/config.py": """
        class Config:
            x = 1
        """,
    "src/cli.py": """
        from pkg import app


        def _train(args):
            config = app.load()
            return app.run(config)


        def main():
            return 0


        COMMANDS = {"train": _train}
        """,
    "src/app.py": """
        from typing import TYPE_CHECKING

        from pkg.config import Config
        from pkg.low import util

        if TYPE_CHECKING:
            from pkg import cli


        def load() -> Config:
            return Config()


        def run(config: Config):
            util.helper(config.x)
            return finish(config)


        def finish(config: "Config | None"):
            from pkg import cli  # closes the cycle app -> cli -> app
            return util.other()
        """,
    "lowdir/__init__.py": "",
    "lowdir/util.py": """
        def helper(x):
            from pkg import app  # runs back up: low (1) imports app (2)
            return app.finish(x)


        def other():
            return 1
        """,
}


def make_package(root: pathlib.Path) -> pathlib.Path:
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def test_modules_imports_cycles_and_upward_arrows(tmp_path):
    h = house.House.read(make_package(tmp_path))
    assert set(h.modules) == {"pkg", "pkg.cli", "pkg.app", "pkg.config", "pkg.low", "pkg.low.util"}
    assert h.lines["pkg.config"] == 2
    assert h.rank("pkg.low.util") == (1, "low") and h.rank("pkg") == (0, "core")
    imports = {(i.target, i.local, i.type_checking) for i in h.imports["pkg.app"]}
    assert imports == {("pkg.config", False, False), ("pkg.low.util", False, False), ("pkg.cli", False, True),
                       ("pkg.cli", True, False)}
    [(members, closing)] = h.module_cycles()
    assert members == ["pkg.app", "pkg.cli", "pkg.low.util"]
    assert set(closing) == {("pkg.cli", "pkg.app"), ("pkg.app", "pkg.cli"), ("pkg.app", "pkg.low.util"),
                            ("pkg.low.util", "pkg.app")}
    assert h.module_cycles(load_time_only=True) == []  # the back edges are function-local / TYPE_CHECKING
    assert h.floor_cycles()[0] == [("pkg", "pkg.low")]
    [(src, dst, imp)] = h.upward()[1]
    assert (src, dst, imp.line, imp.local) == ("pkg.low.util", "pkg.app", 2, True)
    assert h.closure("pkg.app") == ["pkg", "pkg.app", "pkg.config", "pkg.low", "pkg.low.util"]
    # The layer test's parser is this one: (line, target) of every import of the package.
    assert house.imported_modules("pkg.low.util", h.modules["pkg.low.util"], set(h.modules)) == [(2, "pkg.app")]


def test_walk_of_the_train_command(tmp_path):
    h = house.House.read(make_package(tmp_path))
    walker = house.Walker(h)
    start = house.find_train_handler(h, walker)
    assert start.key == "pkg.cli:_train"
    walk = walker.walk(start)
    assert [f.qualname for f in walk.functions] == ["_train", "load", "run", "helper", "finish", "other"]
    assert walk.sequence() == ["pkg.cli", "pkg.app", "pkg.cli", "pkg.app", "pkg.low.util", "pkg.app",
                               "pkg.low.util", "pkg.app", "pkg.low.util", "pkg.app", "pkg.cli"]
    assert walk.numbers() == {"functions walked": 6, "files entered": 3, "file switches": 10, "returns": 8,
                              "call edges": 6}
    climbs = [e for e in sorted(walk.edges) if house._climbs(h, *walk.edge_funcs[e])]
    assert climbs == [("pkg.low.util:helper", "pkg.app:finish")]
    taking = {f.qualname for f in walker.functions() if walker.takes_config(f)[0]}
    assert taking == {"run", "finish"}
    text = house.render(h, ["pkg.app"], runtime=False)
    assert "| closure of `import pkg.app` (files / lines) | 5 /" in text
    assert "functions / files entered / file switches / returns / climbs back up | 6 / 3 / 10 / 8 / 1 |" in text
    assert "| 1 | low | 1 |" in text


def test_a_layer_table_that_is_no_literal_is_read_by_importing_it(tmp_path):
    make_package(tmp_path)
    (tmp_path / "tests" / "test_layers.py").write_text(textwrap.dedent("""
        ROOT_PACKAGE = "pkg"
        NAMES = ("core", "low", "app")
        LAYERS = tuple((rank, name, ("pkg.app", "pkg.cli") if name == "app" else ()) for rank, name in enumerate(NAMES))
        """))
    layers, root = house.read_layers(tmp_path)
    assert root == "pkg" and layers[2] == (2, "app", ("pkg.app", "pkg.cli"))
    assert house.House.read(tmp_path).rank("pkg.cli") == (2, "app")

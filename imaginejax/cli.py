"""The ``imaginejax`` command. Subcommands: ``demo`` (the main job on the embedded default) and
``report`` (the statistics table of a sweep's run directory)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"demo": "run the CLEVR-Robot BC demo (see `imaginejax demo --help`)",
                "report": "IQM / mean with bootstrap 95% intervals of a sweep's run directory "
                          "(see `imaginejax report --help`)"}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: imaginejax <command> [options]\n\ncommands:")
        for name, text in commands.items():
            print(f"  {name:10s} {text}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    if argv[0] == "report":
        from imaginejax import report

        report.main(argv[1:])
        return 0
    from imaginejax import demo

    demo.main(argv[1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

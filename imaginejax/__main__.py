"""``python -m imaginejax ...``: the command line (:mod:`imaginejax.cli`)."""

from imaginejax.cli import main

raise SystemExit(main())

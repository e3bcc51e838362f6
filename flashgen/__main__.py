"""`python -m flashgen`: the same as the `flashgen` command."""

from flashgen.cli import main

raise SystemExit(main())

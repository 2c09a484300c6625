"""`python -m morello_build ...` is the same as the `morello` command."""

from morello_build.cli import main

raise SystemExit(main())

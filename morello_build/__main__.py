"""`python -m morello_build ...` is the same as the `morello` command."""

from morello_build.cli import entry_point

raise SystemExit(entry_point())

from mi_core.cli import entry

entry()

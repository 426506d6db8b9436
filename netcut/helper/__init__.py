"""Helper mode: a helper container that shares the namespace carries out the plan as shell
scripts, for hosts whose process cannot enter it."""

"""The egress-netcut benchmark: `python -m bench` (or `./dev.sh bench`); see docs/benchmarks.md."""

"""Benchmarks behind `glm53 bench ...` (their CLI is glm53_flash/commands/bench.py): ratios measured on
one machine in one process."""

"""Benchmarks behind `glm53 bench ...`: ratios measured on one machine in one process."""

"""The `glm53` command groups: one module per group, each with `register(subparsers)`, listed once in
GROUPS (cli.py builds the parser from this table). `bench` registers every benchmark under
`glm53 bench`. Registration modules import only argparse-level code; handlers import torch lazily,
which keeps `glm53 --help` fast."""

from __future__ import annotations

# (module, what its commands are) in the order `glm53 --help` lists them
GROUPS = (
    ("info", "glm53 info"),
    ("tasks", "glm53 tasks summary, show"),
    ("train", "glm53 pretrain, rl, select"),
    ("evaluate", "glm53 generate, eval, compare"),
    ("ledger", "glm53 ledger"),
    ("verify", "glm53 verify"),
    ("reproduce", "glm53 reproduce"),
    ("experiments", "glm53 experiment, analyze"),
    ("report", "glm53 report"),
    ("web", "glm53 slides, serve"),
    ("docs", "glm53 docs build, check, times, makefile"),
    ("vision", "glm53 vision"),
)
BENCH_GROUP = "bench"  # glm53 bench model, architecture, decode, verify

"""The run config of `glm53 eval`, declared once (options.py): each field is a flag and is recorded in
the receipt. No torch here, so building the CLI stays fast."""

from __future__ import annotations

from dataclasses import dataclass, replace

from glm53_flash.core.options import option
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS
from glm53_flash.tasks import EVAL_SPLITS, MAX_NEW_TOKENS, suite_of

# Stop rules, one name per meaning: sampling.GENERIC_STOPS (eos, none: any text), EVAL_STOP_CHOICES (those
# plus parse, the coding tasks' rule: evaluation and selection), train.config.RL_STOPS (parse, eos: rollouts).
EVAL_STOP_CHOICES = ("parse", "eos", "none")
# The original's sampling temperature: sampled evaluation, dev selection and RL rollouts all default to it.
SAMPLING_TEMPERATURE = 0.35
GREEDY_SEED, SAMPLED_SEED = 2026, 8675309
GREEDY_DEFAULTS = {"per_family": 4, "max_new_tokens": 48, "seed": GREEDY_SEED}
SAMPLED_DEFAULTS = {"per_family": 8, "samples": 8, "max_new_tokens": 48, "temperature": SAMPLING_TEMPERATURE,
                    "seed": SAMPLED_SEED}


@dataclass
class EvalConfig:
    """Every knob of `glm53 eval`. Greedy when samples is 1; the defaults that depend on that
    (per_family, seed, temperature) are None until `resolved()` fills them in."""

    checkpoint: str = option(help="checkpoint directory")
    split: str = option(help="frozen split (the rl splits are for training and cannot be evaluated; final, "
                             "confirm, holdout and the compositions suite's unseen_structures and new_constants "
                             "are sealed: see --open-sealed)",
                        choices=EVAL_SPLITS)
    output: str = option(help="receipt path (must not exist unless --force)")
    per_family: int | None = option(None, help="tasks per family (the families suite; a compositions split has one "
                                               "task per behaviour)", default_text="4 greedy, 8 sampled")
    families: str = option("", help="comma list of families (compositions: int, str, list)", default_text="all")
    samples: int = option(1, help="samples per task; 1 = greedy")
    seed: int | None = option(None, help="seed of the samples' random streams (recorded for greedy)",
                              default_text="2026 greedy, 8675309 sampled")
    stop: str = option("parse", help="stop rule: parse (the original's), eos, or none", choices=EVAL_STOP_CHOICES)
    workers: int | None = option(None, help="verifier processes", default_text="CPU count")
    temperature: float | None = option(None, help="sampling temperature (> 0)",
                                       default_text=f"greedy for one sample, {SAMPLING_TEMPERATURE} for several")
    top_k: int | None = option(None, help="sample only among the k most likely tokens", default_text="off")
    top_p: float | None = option(None, help="nucleus sampling: keep this much probability", default_text="off")
    max_new_tokens: int | None = option(None, help="cap on generated tokens",
                                        default_text="48; 64 on a compositions split")
    batch_rows: int = option(512, help="most rows in one forward")
    device: str = option(DEFAULT_DEVICE, help="where to run the model", choices=DEVICE_CHOICES)
    precision: str | None = option(None, neutral=True, choices=PRECISIONS, help=PRECISION_HELP,
                                   default_text="fp32 on the CPU, bf16 autocast on CUDA (what earlier evaluations did)")
    adapt_threads: bool = option(False, neutral=True,
                                 help="on the CPU, follow the free cores with the math threads after each decode step "
                                      "(fast beside another busy process; the last bits of a result may differ)")
    open_sealed: str | None = option(None, metavar="PURPOSE",
                                     help="open a sealed split (final, confirm, holdout) for this stated purpose; "
                                          "the receipt is recorded in the ledger (glm53 ledger)",
                                     default_text="none: a sealed split is refused")
    reopen: str | None = option(None, metavar="REASON",
                                help="open a sealed split again for the same evaluation (same checkpoint and "
                                     "settings), giving the reason, which the ledger records",
                                default_text="none: a second opening is refused")
    decision: str | None = option(None, neutral=True, metavar="FILE",
                                  help="the dev decision this sealed evaluation follows (a selection receipt, a "
                                       "plan): its sha256 goes into the ledger's opened line",
                                  default_text="none named")
    allow_dirty: bool = option(False, neutral=True,
                               help="open a sealed split even though the code has uncommitted changes (the opening "
                                    "is recorded as unvouched)")
    ledger: str | None = option(None, neutral=True, metavar="PATH",
                                help="the ledger the opening is recorded in (recorded in the receipt)",
                                default_text="results/ledger.jsonl of the checkout")
    force: bool = option(False, help="overwrite --output")
    quiet: bool = option(False, help="no progress bar")

    @property
    def greedy(self) -> bool:
        return self.samples == 1

    def check(self) -> None:
        """The settings that cannot go together, as one-line errors (the sealed-split rules are the
        ledger's: ledger.check_opening_request)."""
        if self.samples < 1:
            raise ValueError(f"--samples must be >= 1, got {self.samples}")
        if self.greedy and (self.temperature not in (None, 0.0) or self.top_k is not None or self.top_p is not None):
            raise ValueError("--temperature, --top-k and --top-p apply only with --samples > 1 (one sample is greedy)")

    def resolved(self) -> "EvalConfig":
        """A copy with every default that depends on greedy or sampled, and on the split's suite, filled
        in: per_family (the families suite only), seed, temperature (None for greedy), max_new_tokens."""
        self.check()
        defaults = GREEDY_DEFAULTS if self.greedy else SAMPLED_DEFAULTS
        suite = suite_of(self.split)
        return replace(
            self,
            per_family=defaults["per_family"] if self.per_family is None and suite == "families" else self.per_family,
            seed=defaults["seed"] if self.seed is None else self.seed,
            temperature=None if self.greedy else (SAMPLING_TEMPERATURE if self.temperature is None else self.temperature),
            max_new_tokens=MAX_NEW_TOKENS[suite] if self.max_new_tokens is None else self.max_new_tokens)

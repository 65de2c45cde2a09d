"""A headline run's summary.json as a type: what `glm53 reproduce` computes from one run directory's
receipts (experiments/reproduce.build_summary) and what the reports read (report/headline.py,
report/slides.py, evaluation/headline_stats.py). The pipeline builds a `RunSummary`; every reader
gets one from `RunSummary.read` (or `from_dict`), which checks each field's type before anything is
built from it, so a corrupt or foreign file is one line naming the field, and a field read by the
reports is an attribute, not a string. The JSON on disk is `to_dict()`: the same keys as before the
type existed, so committed summaries read back as themselves (tests/test_results.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from glm53_flash.train.plan import ReproducePlan

SCHEMA_VERSION = "1.1"


@dataclass(frozen=True)
class SealedSplit:
    """One sealed split's results in a run: per evaluated checkpoint ("before", then each RL seed)
    the paired statistics, the strong-set check and when the split was first opened."""

    seeds: dict[str, dict]
    strong_tests: dict | None
    opened_after_selection: bool
    first_opened_utc: str
    ledger: list[dict]


@dataclass(frozen=True)
class RunSummary:
    """One run (an arm at one pretraining seed) of a headline directory. `seeds` and `strong_tests`
    are the confirm split's, keyed by RL seed; `holdout` the held-out split's."""

    schema_version: str
    preset: str
    arm: str | None
    plan: ReproducePlan
    stage_seconds: dict[str, float]
    trained_families: tuple[str, ...]
    untrained_families: tuple[str, ...]
    pretrain_seed: int
    pretrain_selection: dict
    seeds: dict[str, dict]
    strong_tests: dict | None
    confirm_opened_after_selection: bool
    last_selection_utc: str
    first_confirm_utc: str
    ledger: list[dict]
    holdout: SealedSplit
    provenance: dict
    sealed_stand_in: str | None = None  # a smoke plan's: the unsealed split its sealed stages evaluated
    # What the run computed in (name, requested, reason, decode): what --precision asked for (plan.json),
    # else the pretraining receipt's; None for runs whose receipts predate the record (on the CPU those
    # ran in float32).
    precision: dict | None = None

    @property
    def precision_line(self) -> str:
        """The precision the run computed in, as a sentence for its reports."""
        if self.precision is None:
            return ("Precision: not recorded (the receipts predate the record; runs on the CPU then computed in "
                    "float32).")
        asked = self.precision.get("requested", "default")
        return (f"Precision: {self.precision['name']} (asked for: {asked}; {self.precision.get('reason', '')}).")

    @property
    def rl_seeds(self) -> list[str]:
        """The RL seeds in the plan's order, as `seeds` keys them."""
        return [str(seed) for seed in self.plan.rl_seeds]

    def to_dict(self) -> dict:
        record = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        record.update(plan=self.plan.to_dict(), trained_families=list(self.trained_families),
                      untrained_families=list(self.untrained_families), holdout=dataclasses.asdict(self.holdout))
        for name in ("sealed_stand_in", "precision"):  # absent rather than null: older summaries read back as themselves
            if record[name] is None:
                del record[name]
        return record

    @classmethod
    def from_dict(cls, data, source: str = "summary") -> RunSummary:
        """The summary in `data` (summary.json's object), every field checked; a ValueError naming
        `source` and the field otherwise."""
        def fail(rule: str):
            raise ValueError(f"{source} is not a headline run summary ({rule})")

        if not isinstance(data, dict):
            fail(f"a JSON object is needed, not {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        required = [name for name, f in fields.items() if f.default is dataclasses.MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            fail(f"missing {', '.join(missing)}")
        unknown = sorted(set(data) - set(fields))
        if unknown:
            fail(f"unknown fields {', '.join(unknown)}")
        kinds = {"schema_version": str, "preset": str, "stage_seconds": dict, "trained_families": list,
                 "untrained_families": list, "pretrain_seed": int, "pretrain_selection": dict, "seeds": dict,
                 "confirm_opened_after_selection": bool, "last_selection_utc": str, "first_confirm_utc": str,
                 "ledger": list, "holdout": dict, "provenance": dict, "plan": dict}
        for name, kind in kinds.items():
            if not isinstance(data[name], kind) or (kind is int and isinstance(data[name], bool)):
                fail(f"'{name}' must be {kind.__name__}")
        for name in ("arm", "sealed_stand_in"):
            if data.get(name) is not None and not isinstance(data[name], str):
                fail(f"'{name}' must be a string or null")
        if data["strong_tests"] is not None and not isinstance(data["strong_tests"], dict):
            fail("'strong_tests' must be an object or null")
        precision = data.get("precision")
        if precision is not None and not (isinstance(precision, dict) and isinstance(precision.get("name"), str)):
            fail("'precision' must be an object with a 'name' or null")
        try:
            plan = ReproducePlan.from_dict(data["plan"])
        except (TypeError, ValueError) as error:
            fail(f"its plan does not read: {error}")
        holdout = data["holdout"]
        split_fields = [f.name for f in dataclasses.fields(SealedSplit)]
        if sorted(holdout) != sorted(split_fields):
            fail(f"'holdout' must hold {', '.join(split_fields)}")
        if not (isinstance(holdout["seeds"], dict) and isinstance(holdout["ledger"], list)
                and isinstance(holdout["opened_after_selection"], bool)):
            fail("'holdout' has a field of the wrong type")
        return cls(**{**data, "plan": plan, "trained_families": tuple(data["trained_families"]),
                      "untrained_families": tuple(data["untrained_families"]), "holdout": SealedSplit(**holdout)})

    @classmethod
    def read(cls, path: str | Path) -> RunSummary:
        """summary.json at `path` (FileNotFoundError when missing; ValueError when it is not one)."""
        from glm53_flash.core.receipts import read_json

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        return cls.from_dict(read_json(path), source=str(path))


__all__ = ["SCHEMA_VERSION", "RunSummary", "SealedSplit"]

"""The headline pipeline's plan: the run configs of its stages (`glm53 pretrain`, `select`, `rl`, `eval`),
composed with dataclasses.replace, and its identity (plan_sha256). Torch-free and free of the
pipeline: reports read plans from here (report/headline.py, report/slides.py), the pipeline
(experiments/reproduce.py) runs them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from glm53_flash.core.options import identity_record
from glm53_flash.core.receipts import sha256_json
from glm53_flash.evaluation.config import GREEDY_SEED, SAMPLED_SEED, EvalConfig  # noqa: F401 - re-exported
from glm53_flash.train.config import PretrainConfig, RLConfig, SelectConfig

# Fields a stage fills in at run time (paths, the device, progress, whether the math threads follow the
# free cores): not part of a plan's identity.
RUN_FIELDS = frozenset({"output", "run", "initial_checkpoint", "checkpoint", "device", "resume", "progress",
                        "force", "quiet", "tensorboard", "wandb", "adapt_threads"})


@dataclass(frozen=True)
class ReproducePlan:
    """The pipeline as the run configs of its stages, each the same dataclass its own command uses
    (`glm53 pretrain`, `select`, `rl`, `eval`): a knob is declared once, in its stage's config, and a
    plan only chooses values. Fields in RUN_FIELDS are filled in when a stage runs; `rl.seed` is
    replaced by each of `rl_seeds`."""

    pretrain: PretrainConfig
    select_pretrain: SelectConfig
    rl: RLConfig
    rl_seeds: tuple[int, ...]
    select_rl: SelectConfig
    confirm_greedy: EvalConfig
    confirm_sampled: EvalConfig
    holdout_greedy: EvalConfig  # the held-out split, evaluated after confirm
    holdout_sampled: EvalConfig

    STAGES = ("pretrain", "select_pretrain", "rl", "select_rl", "confirm_greedy", "confirm_sampled",
              "holdout_greedy", "holdout_sampled")

    @property
    def families(self) -> str:
        """The trained families (RL's)."""
        return self.rl.families

    def to_dict(self) -> dict:
        record = {name: {k: v for k, v in identity_record(getattr(self, name)).items() if k not in RUN_FIELDS}
                  for name in self.STAGES}
        del record["rl"]["seed"]
        return {**record, "rl_seeds": list(self.rl_seeds)}

    @classmethod
    def from_dict(cls, values: dict) -> "ReproducePlan":
        """A plan from `to_dict`'s shape (every stage a JSON object)."""
        if not isinstance(values, dict):
            raise ValueError(f"a plan must be a JSON object, got {type(values).__name__}")
        evaluation = {"checkpoint": "", "output": ""}
        types = {"pretrain": PretrainConfig, "select_pretrain": SelectConfig, "rl": RLConfig,
                 "select_rl": SelectConfig, "confirm_greedy": EvalConfig, "confirm_sampled": EvalConfig,
                 "holdout_greedy": EvalConfig, "holdout_sampled": EvalConfig}
        placeholders = {"pretrain": {"output": ""}, "select_pretrain": {"run": ""},
                        "rl": {"initial_checkpoint": "", "output": ""}, "select_rl": {"run": ""},
                        "confirm_greedy": evaluation, "confirm_sampled": evaluation,
                        "holdout_greedy": evaluation, "holdout_sampled": evaluation}
        configs = {}
        for name, kind in types.items():
            section = values.get(name)
            if not isinstance(section, dict):
                raise ValueError(f"plan section {name!r} must be a JSON object")
            known = {f.name for f in dataclasses.fields(kind)}
            unknown = sorted(set(section) - known)
            if unknown:
                raise ValueError(f"plan section {name!r} has unknown fields: {', '.join(unknown)}")
            fields = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items()}
            configs[name] = kind(**{**placeholders[name], **fields})
        seeds = values.get("rl_seeds")
        if not isinstance(seeds, (list, tuple)) or not all(isinstance(s, int) for s in seeds):
            raise ValueError("plan field 'rl_seeds' must be a list of integers")
        return cls(rl_seeds=tuple(seeds), **configs)


def make_plan(*, preset: str, pretrain: dict, rl: RLConfig, rl_seeds: tuple[int, ...], families: str,
              max_new_tokens: int, eval_temperature: float, dev_per_family: int, dev_samples: int,
              confirm_greedy_per_family: int, confirm_sampled_per_family: int, confirm_samples: int,
              holdout_greedy_per_family: int, holdout_sampled_per_family: int,
              sealed_stand_in: str | None = None) -> ReproducePlan:
    """A plan from the values that differ from each stage's defaults (`rl`: the RL stage's config, its paths
    left empty and its families and completion cap set here); values shared by several stages
    (the trained families, the completion cap, the evaluation temperature) are given once here. The
    holdout stages evaluate like the confirm ones, on their own number of tasks. `sealed_stand_in`
    (a smoke test's plan) names an unsealed split the confirm and holdout stages evaluate instead, so
    the plan opens no sealed split."""
    confirm_split, holdout_split = (sealed_stand_in, sealed_stand_in) if sealed_stand_in else ("confirm", "holdout")
    evaluation = dict(temperature=eval_temperature, max_new_tokens=max_new_tokens)
    selection = dict(split="dev", samples=dev_samples, per_family=dev_per_family, **evaluation)
    return ReproducePlan(
        pretrain=PretrainConfig(output="", preset=preset, **pretrain),
        select_pretrain=SelectConfig(run="", families="", **selection),
        rl=dataclasses.replace(rl, families=families, max_new_tokens=max_new_tokens),
        rl_seeds=tuple(rl_seeds),
        select_rl=SelectConfig(run="", families=families, **selection),
        confirm_greedy=EvalConfig(checkpoint="", split=confirm_split, output="", per_family=confirm_greedy_per_family,
                                  families=families, samples=1, seed=GREEDY_SEED, max_new_tokens=max_new_tokens),
        confirm_sampled=EvalConfig(checkpoint="", split=confirm_split, output="", per_family=confirm_sampled_per_family,
                                   families="", samples=confirm_samples, seed=SAMPLED_SEED, **evaluation),
        holdout_greedy=EvalConfig(checkpoint="", split=holdout_split, output="", per_family=holdout_greedy_per_family,
                                  families=families, samples=1, seed=GREEDY_SEED, max_new_tokens=max_new_tokens),
        holdout_sampled=EvalConfig(checkpoint="", split=holdout_split, output="", per_family=holdout_sampled_per_family,
                                   families="", samples=confirm_samples, seed=SAMPLED_SEED, **evaluation))


def plan_sha256(plan: ReproducePlan) -> str:
    """The plan's identity in the ledger: a second opening of the confirm split for it needs a reason."""
    return sha256_json(plan.to_dict())

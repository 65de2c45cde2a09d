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
from glm53_flash.train.config import PretrainConfig, RLConfig, SelectConfig, rename_legacy_values

# Fields a stage fills in at run time (paths, the device, progress): not part of a plan's identity.
RUN_FIELDS = frozenset({"output", "run", "initial_checkpoint", "checkpoint", "device", "resume", "progress",
                        "force", "quiet", "tensorboard", "wandb"})


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
    # The held-out split, evaluated after confirm (None in plans written before it existed).
    holdout_greedy: EvalConfig | None = None
    holdout_sampled: EvalConfig | None = None

    STAGES = ("pretrain", "select_pretrain", "rl", "select_rl", "confirm_greedy", "confirm_sampled",
              "holdout_greedy", "holdout_sampled")
    OPTIONAL_STAGES = ("holdout_greedy", "holdout_sampled")

    @property
    def families(self) -> str:
        """The trained families (RL's)."""
        return self.rl.families

    def to_dict(self) -> dict:
        record = {name: {k: v for k, v in identity_record(getattr(self, name)).items() if k not in RUN_FIELDS}
                  for name in self.STAGES if getattr(self, name) is not None}
        del record["rl"]["seed"]
        return {**record, "rl_seeds": list(self.rl_seeds)}

    @classmethod
    def from_dict(cls, values: dict) -> "ReproducePlan":
        """A plan from `to_dict`'s shape, or from the flat shape older plan.json files have."""
        if not isinstance(values, dict):
            raise ValueError(f"a plan must be a JSON object, got {type(values).__name__}")
        if "pretrain" not in values:
            values = _nested_from_flat(values)
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
            if section is None and name in cls.OPTIONAL_STAGES:
                continue
            if not isinstance(section, dict):
                raise ValueError(f"plan section {name!r} must be a JSON object")
            known = {f.name for f in dataclasses.fields(kind)}
            unknown = sorted(set(section) - known)
            if unknown:
                raise ValueError(f"plan section {name!r} has unknown fields: {', '.join(unknown)}")
            fields = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items()}
            if name == "rl":
                fields = rename_legacy_values(fields)
            configs[name] = kind(**{**placeholders[name], **fields})
        seeds = values.get("rl_seeds")
        if not isinstance(seeds, (list, tuple)) or not all(isinstance(s, int) for s in seeds):
            raise ValueError("plan field 'rl_seeds' must be a list of integers")
        return cls(rl_seeds=tuple(seeds), **configs)


def _nested_from_flat(flat: dict) -> dict:
    """The flat plan of older runs (`rl_groups`, `pretrain_lr`, ...) in the nested shape."""
    def get(key):
        if key not in flat:
            raise ValueError(f"plan is missing {key!r}")
        return flat[key]

    rl = dict(groups=get("rl_groups"), checkpoints=get("rl_checkpoints"), group_size=get("rl_group_size"),
              temperature=get("rl_temperature"), learning_rate=get("rl_lr"), train_scope=get("rl_scope"),
              reward_mode=get("rl_reward"), tasks_per_family=get("rl_tasks_per_family"),
              prompts_per_update=get("rl_prompts_per_update"), logprob_source=get("rl_logprob_source"),
              loss_normalization=get("rl_loss_normalization"), eos_handling=get("rl_eos_handling"))
    try:
        plan = make_plan(
            preset=get("model_preset"),
            pretrain=dict(model_overrides=get("model_overrides"), steps=get("pretrain_steps"),
                          checkpoints=get("pretrain_checkpoints"), batch_size=get("batch_size"),
                          sequence_length=get("sequence_length"), learning_rate=get("pretrain_lr")),
            rl=rename_legacy_values(rl), rl_seeds=get("rl_seeds"), families=get("families"),
            max_new_tokens=get("max_new_tokens"), eval_temperature=get("eval_temperature"),
            dev_per_family=get("dev_per_family"), dev_samples=get("dev_samples"),
            confirm_greedy_per_family=get("confirm_greedy_per_family"),
            confirm_sampled_per_family=get("confirm_sampled_per_family"), confirm_samples=get("confirm_samples"))
    except TypeError as error:
        raise ValueError(f"plan has a value of the wrong type ({error})") from None
    return plan.to_dict()




def make_plan(*, preset: str, pretrain: dict, rl: dict, rl_seeds: tuple[int, ...], families: str,
              max_new_tokens: int, eval_temperature: float, dev_per_family: int, dev_samples: int,
              confirm_greedy_per_family: int, confirm_sampled_per_family: int, confirm_samples: int,
              holdout_greedy_per_family: int | None = None,
              holdout_sampled_per_family: int | None = None, sealed_stand_in: str | None = None) -> ReproducePlan:
    """A plan from the values that differ from each stage's defaults; values shared by several stages
    (the trained families, the completion cap, the evaluation temperature) are given once here. The
    holdout stages evaluate like the confirm ones, on their own number of tasks. `sealed_stand_in`
    (a smoke test's plan) names an unsealed split the confirm and holdout stages evaluate instead, so
    the plan opens no sealed split."""
    confirm_split, holdout_split = (sealed_stand_in, sealed_stand_in) if sealed_stand_in else ("confirm", "holdout")
    evaluation = dict(temperature=eval_temperature, max_new_tokens=max_new_tokens)
    selection = dict(split="dev", samples=dev_samples, per_family=dev_per_family, **evaluation)
    holdout = {}
    if holdout_greedy_per_family is not None:
        holdout = dict(
            holdout_greedy=EvalConfig(checkpoint="", split=holdout_split, output="", per_family=holdout_greedy_per_family,
                                      families=families, samples=1, seed=GREEDY_SEED, max_new_tokens=max_new_tokens),
            holdout_sampled=EvalConfig(checkpoint="", split=holdout_split, output="",
                                       per_family=holdout_sampled_per_family, families="", samples=confirm_samples,
                                       seed=SAMPLED_SEED, **evaluation))
    return ReproducePlan(
        pretrain=PretrainConfig(output="", preset=preset, **pretrain),
        select_pretrain=SelectConfig(run="", families="", **selection),
        rl=RLConfig(initial_checkpoint="", output="", families=families, max_new_tokens=max_new_tokens, **rl),
        rl_seeds=tuple(rl_seeds),
        select_rl=SelectConfig(run="", families=families, **selection),
        confirm_greedy=EvalConfig(checkpoint="", split=confirm_split, output="", per_family=confirm_greedy_per_family,
                                  families=families, samples=1, seed=GREEDY_SEED, max_new_tokens=max_new_tokens),
        confirm_sampled=EvalConfig(checkpoint="", split=confirm_split, output="", per_family=confirm_sampled_per_family,
                                   families="", samples=confirm_samples, seed=SAMPLED_SEED, **evaluation),
        **holdout)


def plan_sha256(plan: ReproducePlan) -> str:
    """The plan's identity in the ledger: a second opening of the confirm split for it needs a reason."""
    return sha256_json(plan.to_dict())

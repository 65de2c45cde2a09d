"""lm-evaluation-harness tasks over the dev split (the optional `lmeval` extra), for
`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --include_path TASK_DIRECTORY
--tasks glm53_dev_loglikelihood,glm53_dev_generate`.

Each YAML file's documents come from `dev_split.dev_dataset`, which builds them from the families
suite's dev split when lm-eval loads the task (nothing is copied out of the generator): the prompt is
the context, the reference completion the target. `glm53_dev_loglikelihood` scores the reference
(log-likelihood of its bytes after BOS and the prompt, and whether greedy decoding would produce it);
`glm53_dev_generate` decodes greedily up to EOS or 48 tokens (`glm53 generate --stop eos`'s rule) and
scores exact match with the reference.
"""

from pathlib import Path

TASK_DIRECTORY = Path(__file__).resolve().parent
TASKS = ("glm53_dev_loglikelihood", "glm53_dev_generate")
MAX_GENERATED_TOKENS = 48  # glm53_dev_generate.yaml's max_gen_toks

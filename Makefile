# The two commands: `make demo` (the main job, CPU by default) and `make test`.
# Each creates .venv when missing and installs the pinned dependencies first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo seeds study-generalisation study-generalisation-rerun study-switches study-pretrain-switches \
	study-pretrain-switches-rerun test test-quick clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e ".[dev]"
	touch $(STAMP)

# The demo records its openings of the sealed splits in its own ledger (runs/demo/ledger.jsonl), so the
# tracked results/ledger.jsonl stays as it is; running the same plans again with that ledger is a
# reopening, which goes ahead with this reason (recorded there too).
REOPEN ?= make demo: a rerun of the committed headline's plan
# On a machine something else keeps busy: make demo DEMO_FLAGS=--adapt-threads (the math threads follow
# the free cores; on a quiet machine nothing changes).
DEMO_FLAGS ?=
demo: $(STAMP)
	$(BIN)/glm53 reproduce --preset headline --output runs/demo --device cpu --precision auto $(DEMO_FLAGS) --reopen "$(REOPEN)"

# Two more pretraining seeds per arm (one RL seed each) beside the demo's runs, for the spread over seeds.
seeds: $(STAMP)
	$(BIN)/glm53 reproduce --preset headline --output runs/demo --device cpu --precision auto $(DEMO_FLAGS) --extra-pretrain-seeds 1,2 --reopen "$(REOPEN)"

# The compositions suite's studies (docs/STUDIES.md). Each states its power and its time on this machine
# before the first run, runs two units at a time (one thread each) and resumes when rerun; the sealed
# splits are opened once per arm and pretraining seed, recorded in results/ledger.jsonl. The rerun is
# the same study on disjoint pretraining seeds.
STUDY_PURPOSE ?= make study-generalisation: the study's sealed evaluations, after every selection on dev
study-generalisation: $(STAMP)
	$(BIN)/glm53 experiment rl-generalisation --output runs/study-generalisation --open-sealed "$(STUDY_PURPOSE)"

study-generalisation-rerun: $(STAMP)
	$(BIN)/glm53 experiment rl-generalisation --output runs/study-generalisation-rerun --seeds 6,7,8,9,10 \
		--open-sealed "$(STUDY_PURPOSE) (the rerun on disjoint pretraining seeds)"

# Which RL switch matters, from a study's pretrained checkpoints (dev only). The checkpoints are not
# committed, so run it in the same checkout as its source, e.g.
# make study-switches SWITCHES_SOURCE=runs/study-generalisation-rerun SWITCHES_FLAGS="--seeds 6,7,8"
SWITCHES_SOURCE ?= runs/study-generalisation
SWITCHES_FLAGS ?=
study-switches: $(STAMP)
	$(BIN)/glm53 experiment rl-switches --source $(SWITCHES_SOURCE) --output runs/study-switches $(SWITCHES_FLAGS)

# Which pretraining switch matters: every combination of the three that differ between the arms, under each
# pretraining seed (docs/STUDIES.md); dev decides the defaults (selection.json), then the sealed split is
# opened once for the plan to confirm. The rerun is the same design on disjoint seeds.
PRETRAIN_SWITCHES_PURPOSE ?= make study-pretrain-switches: every run's last checkpoint, after the dev decision
study-pretrain-switches: $(STAMP)
	$(BIN)/glm53 experiment pretrain-switches --output runs/study-pretrain-switches \
		--open-sealed "$(PRETRAIN_SWITCHES_PURPOSE)"

study-pretrain-switches-rerun: $(STAMP)
	$(BIN)/glm53 experiment pretrain-switches --output runs/study-pretrain-switches-rerun --seeds 24,25,26 \
		--open-sealed "$(PRETRAIN_SWITCHES_PURPOSE) (the rerun on disjoint pretraining seeds)"

test: $(STAMP)
	$(BIN)/python -m pytest

# The development subset: everything but the slow and the browser tests (markers in pyproject.toml).
test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not browser"

clean-venv:
	rm -rf $(VENV)

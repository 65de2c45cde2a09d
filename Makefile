# The two commands: `make demo` (the main job, CPU by default) and `make test`.
# Each creates .venv when missing and installs the pinned dependencies first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo seeds test test-quick clean-venv

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
# fp32 by default: the original's arithmetic. At the demo's pretraining seed (42) fp32 gives the original's
# figures bit for bit on AVX-512 CPUs, while in bf16 the faithful arm's RL fails to take off on most of its
# RL seeds there; over all the committed pretraining seeds bf16's effect on either arm is not shown
# (results/headline-distribution/REPORT.md). bf16 is faster on CPUs with AVX512-BF16 or AMX:
# make demo PRECISION=auto.
PRECISION ?= fp32
demo: $(STAMP)
	$(BIN)/glm53 reproduce --preset headline --output runs/demo --device cpu --precision $(PRECISION) $(DEMO_FLAGS) --reopen "$(REOPEN)" --allow-dirty

# Two more pretraining seeds per arm (one RL seed each) beside the demo's runs, for the spread over seeds.
seeds: $(STAMP)
	$(BIN)/glm53 reproduce --preset headline --output runs/demo --device cpu --precision $(PRECISION) $(DEMO_FLAGS) --extra-pretrain-seeds 1,2 --reopen "$(REOPEN)" --allow-dirty

# The compositions suite's studies (docs/STUDIES.md), each target declared by its study (experiments/<study>.py,
# `make_targets`) and written below by `glm53 docs makefile`. Each states its power and its time on this machine
# before the first run, runs two units at a time (one thread each) and resumes when rerun; the sealed
# splits are opened once per arm and pretraining seed, recorded in results/ledger.jsonl. The rerun is
# the same study on disjoint pretraining seeds, checked against the committed first study before it runs
# (--rerun-of: the same design but for the seeds). The committed studies ran in bf16 (`auto` on the CPUs with
# AVX512-BF16 or AMX they ran on), so the studies here ask for bf16. On a CPU without those instructions bf16
# products are emulated (about 1 GFLOP/s, measured while building, on a 2-core AVX2 EPYC whose float32 peak is
# 184 GFLOP/s: results/bench/model-avx2-epyc.json) and a study takes many times as long; the plan states its time
# before the first run.
# STUDY_PRECISION=fp32 (or auto there) is another design, which --rerun-of refuses to call a rerun.
STUDY_PRECISION ?= bf16

# >>> the studies' targets, generated from experiments/registry.py (`glm53 docs makefile`) >>>
.PHONY: study-rl-choices study-rl-choices-rerun study-rl-choices-temperature study-generalisation \
	study-generalisation-rerun study-switches study-pretrain-switches study-pretrain-switches-rerun

# Which RL choices matter on the compositions suite (docs/STUDIES.md): the original's screen (every arm's budget
# x8, plus the strong reward) from our arm's study checkpoint of one pretraining seed, the screen's winner confirmed
# on fresh seeds and the sealed unseen compositions; the rerun from another pretraining seed; and the
# original's strongest lead, temperature 0.20, confirmed as fixed in advance from both.
RL_CHOICES_PURPOSE ?= make study-rl-choices: the compositions RL-choices confirmation
STUDY_PRETRAIN_FLAGS = --preset study --tasks compositions --steps 2500 --checkpoints 1500,2000,2500 --batch-size 32 \
	--learning-rate 2e-3 --warmup 100 --precision $(STUDY_PRECISION) --quiet
runs/study-pretrain-ours-%/checkpoint-2500/model.safetensors: | $(STAMP)
	$(BIN)/glm53 pretrain $(STUDY_PRETRAIN_FLAGS) --seed $* --output runs/study-pretrain-ours-$* \
		$$(test -d runs/study-pretrain-ours-$* && echo --resume)

study-rl-choices: runs/study-pretrain-ours-11/checkpoint-2500/model.safetensors
	$(BIN)/glm53 experiment rl-choices --suite compositions --checkpoint runs/study-pretrain-ours-11/checkpoint-2500 \
		--precision $(STUDY_PRECISION) --output runs/study-rl-choices --open-sealed "$(RL_CHOICES_PURPOSE), pretraining seed 11"

study-rl-choices-rerun: runs/study-pretrain-ours-12/checkpoint-2500/model.safetensors
	$(BIN)/glm53 experiment rl-choices --suite compositions --checkpoint runs/study-pretrain-ours-12/checkpoint-2500 \
		--precision $(STUDY_PRECISION) --output runs/study-rl-choices-rerun --rerun-of results/rl-choices-compositions \
		--open-sealed "$(RL_CHOICES_PURPOSE), pretraining seed 12 (the rerun)"

study-rl-choices-temperature: runs/study-pretrain-ours-11/checkpoint-2500/model.safetensors \
		runs/study-pretrain-ours-12/checkpoint-2500/model.safetensors
	for seed in 11 12; do \
		$(BIN)/glm53 experiment rl-choices --suite compositions --checkpoint runs/study-pretrain-ours-$$seed/checkpoint-2500 \
			--precision $(STUDY_PRECISION) --output runs/study-rl-choices-temperature-$$seed --arms baseline,temp-low --seeds 101 --confirm-arm temp-low \
			--confirm-seeds 2001:10:1 \
			--open-sealed "$(RL_CHOICES_PURPOSE): temperature 0.20 fixed in advance, pretraining seed $$seed" || exit 1; \
	done

STUDY_PURPOSE ?= make study-generalisation: the study's sealed evaluations, after every selection on dev
study-generalisation: $(STAMP)
	$(BIN)/glm53 experiment rl-generalisation --output runs/study-generalisation --precision $(STUDY_PRECISION) \
		--open-sealed "$(STUDY_PURPOSE)"

study-generalisation-rerun: $(STAMP)
	$(BIN)/glm53 experiment rl-generalisation --output runs/study-generalisation-rerun --seeds 6,7,8,9,10 \
		--precision $(STUDY_PRECISION) --rerun-of results/rl-generalisation \
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
	$(BIN)/glm53 experiment pretrain-switches --output runs/study-pretrain-switches --precision $(STUDY_PRECISION) \
		--open-sealed "$(PRETRAIN_SWITCHES_PURPOSE)"

study-pretrain-switches-rerun: $(STAMP)
	$(BIN)/glm53 experiment pretrain-switches --output runs/study-pretrain-switches-rerun --seeds 24,25 \
		--precision $(STUDY_PRECISION) --rerun-of results/pretrain-switches \
		--open-sealed "$(PRETRAIN_SWITCHES_PURPOSE) (the rerun on disjoint pretraining seeds)"
# <<< the studies' targets <<<

test: $(STAMP)
	$(BIN)/python -m pytest

# The development subset: everything but the slow and the browser tests (markers in pyproject.toml).
test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not browser"

clean-venv:
	rm -rf $(VENV)

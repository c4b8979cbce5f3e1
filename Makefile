# The two commands of the README: `make demo` and `make test`.
# Each creates .venv when missing and installs the project into it; the stamp file
# is newer than pyproject.toml once the install went through, so repeated runs are fast.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.arrangedb-installed

.PHONY: demo test bench bench-smoke java clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	@touch $(STAMP)

java:
	@tools/check_java.sh

demo: $(STAMP) java
	$(BIN)/arrangedb demo $(ARGS)

# Unit, property, oracle and Spark tests, plus every benchmark once at smoke size.
test: $(STAMP) java
	$(BIN)/python -m pytest tests bench -q

# Full-size benchmarks (minutes each; run alone on an otherwise idle machine).
# Charts and figures land in bench/results/ (the README names it).
bench: $(STAMP) java
	mkdir -p bench/results
	ARRANGEDB_BENCH_SCALE=full ARRANGEDB_BENCH_PLOTS=bench/results $(BIN)/python -m pytest \
	    bench --benchmark-enable --benchmark-columns=min,mean,max,rounds -s -q
	$(BIN)/python bench/compare.py --scale 1 --json bench/results/join.json \
	    --plot bench/results/join.png
	ARRANGEDB_CRASH_SCALE=300 $(BIN)/python -m pytest -q -s \
	    tests/spine/persist/test_checkpoints.py -k killed_at_any_instant

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks .hypothesis

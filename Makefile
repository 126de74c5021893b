# The README's two commands: `make run` and `make test`. Only the Rust toolchain is needed.
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/waste
MODEL := models/stories260K

.PHONY: run build test clean

build:
	$(CARGO) build --release

# Generates, greedily, the story that follows "Once upon a time" with the embedded model
# (252 tokens: the published llama2.c sample, character for character).
run: build
	$(BIN) run $(MODEL) "Once upon a time" -n 252 --temp 0

# Every test, optimised (the numeric paths run real fixtures). Tests whose prerequisite is
# missing print `SKIP: <reason>`; the summary counts them.
test:
	@set -o pipefail; mkdir -p target; \
	$(CARGO) test --release --no-fail-fast -- --nocapture 2>&1 | tee target/test.log; status=$$?; \
	echo; echo "== summary: $$(grep -h '^test result:' target/test.log | awk '{p+=$$4; f+=$$6} END {print p" passed, "f" failed"}'), $$(grep -c '^SKIP:' target/test.log) SKIP lines"; \
	grep '^SKIP:' target/test.log | sort -u || true; \
	exit $$status

clean:
	$(CARGO) clean

# The README's two commands: `make run` and `make test`. Only the Rust toolchain is needed
# (`make test` also adds rustup's musl target for the static binary when it can).
SHELL := /bin/bash
CARGO ?= cargo
BIN := target/release/waste
MODEL := models/stories260K
MUSL := x86_64-unknown-linux-musl
STATIC := target/$(MUSL)/release/waste
MKCPIO := target/tools/mkcpio

.PHONY: run build test fuzz static boot-test clean

build:
	$(CARGO) build --release

# Generates, greedily, the story that follows "Once upon a time" with the embedded model
# (252 tokens: the published llama2.c sample, character for character).
run: build
	$(BIN) run $(MODEL) "Once upon a time" -n 252 --temp 0

# Every test, optimised (the numeric paths run real fixtures), then examples/embed.rs (the
# embedding example a reader copies) on the embedded model. Tests whose prerequisite is
# missing print `SKIP: <reason>`; the summary counts them. The static binary is built first
# (about 1.5 CPU-minutes) for tests/static_binary.rs, which runs it in an empty chroot; where it
# cannot be built (no musl target and no network to add it) the tests go on and that one
# prints SKIP, as it does for a binary older than the sources (`cargo test` alone).
test:
	@$(MAKE) --no-print-directory static || echo "make test: make static failed (above); the static binary's tests will SKIP"
	@set -o pipefail; mkdir -p target; \
	$(CARGO) test --profile checked --no-fail-fast -- --nocapture 2>&1 | tee target/test.log; status=$$?; \
	echo "== examples/embed.rs on $(MODEL)"; \
	$(CARGO) run --release --example embed -- $(MODEL) 2>&1 | tee target/embed.log || { echo "make test: examples/embed.rs failed"; status=1; }; \
	echo; echo "== summary: $$(grep -h '^test result:' target/test.log | awk '{p+=$$4; f+=$$6} END {print p" passed, "f" failed"}'), $$(grep -c '^SKIP:' target/test.log) SKIP lines"; \
	grep '^SKIP:' target/test.log | sort -u || true; \
	exit $$status

# The fuzzer's long mode (tests/fuzz.rs): every target for FUZZ_SECONDS seconds (default 600),
# one at a time; `make test` runs the same targets for 3 s each. Counts go to target/fuzz.log.
# Each long run mutates from its own FUZZ_SEED (default: the clock; printed), so runs add new
# inputs instead of repeating the short pass's fixed sequence (seed 0).
FUZZ_SECONDS ?= 600
FUZZ_SEED ?= $(shell date +%s)
fuzz:
	@set -o pipefail; mkdir -p target; \
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEED=$(FUZZ_SEED) $(CARGO) test --profile checked --test fuzz -- --nocapture --test-threads 1 2>&1 | tee target/fuzz.log; status=$$?; \
	echo; grep '^fuzz ' target/fuzz.log; exit $$status

# The static binary: musl, fully static (no interpreter, no shared library: `file` and `ldd`
# are shown and checked), with the kernels still chosen at run time (AVX-512, AVX2 or scalar),
# so no target-cpu: a RUSTFLAGS that sets one is refused.
static:
	@case "$$RUSTFLAGS $$CARGO_ENCODED_RUSTFLAGS" in *target-cpu*) \
	  echo "make static: RUSTFLAGS sets a target-cpu; the static binary must choose its kernels at run time" >&2; exit 1;; esac
	@if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx $(MUSL); then \
	  echo "rustup target add $(MUSL)"; rustup target add $(MUSL); fi
	$(CARGO) build --release --target $(MUSL)
	@# Cargo leaves a binary alone when an edit (say, a test list in Cargo.toml) does not
	@# change it; the tests' staleness check compares dates, so date the current one.
	@touch $(STATIC)
	@out="$$(file -b $(STATIC) 2>&1; ldd $(STATIC) 2>&1)"; echo "$$out" | sed 's|^\s*|$(STATIC): |'; \
	case "$$out" in *"dynamically linked"*|*"=>"*) echo "make static: $(STATIC) is not static" >&2; exit 1;; esac; \
	echo "$(STATIC): $$(stat -c %s $(STATIC)) bytes"

# The initramfs writer (tools/mkcpio.rs, standard library only).
$(MKCPIO): tools/mkcpio.rs
	@mkdir -p $(dir $@)
	rustc -O --edition 2021 $< -o $@

# Boots the static binary as PID 1 under QEMU (tests/boot.rs; serial log in target/boot/).
# tools/boot-setup.sh installs QEMU when missing and fetches the Debian kernel; when it cannot,
# it prints a SKIP line and this target stops there, successfully.
boot-test: static $(MKCPIO)
	@set -o pipefail; mkdir -p target/boot; \
	tools/boot-setup.sh target/boot; status=$$?; \
	if [ $$status = 3 ]; then exit 0; elif [ $$status != 0 ]; then exit $$status; fi; \
	$(CARGO) test --profile checked --test suite boot:: -- --ignored --nocapture 2>&1 | tee target/boot/test.log

clean:
	$(CARGO) clean

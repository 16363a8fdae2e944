# Berth: `make run` and `make test` are all a fresh machine needs.
#
# Tools are pinned and installed only when missing, so a second run is quick. Rust build
# output goes to a cache outside the clone (override CARGO_TARGET_DIR to change it).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := run

export CARGO_TARGET_DIR ?= $(HOME)/.cache/berth/target
# Incremental state is only worth its disk space while editing; a test run builds each crate
# once. (Developers who want it back: `make test CARGO_INCREMENTAL=1`.)
export CARGO_INCREMENTAL ?= 0
export PATH := $(CURDIR)/node_modules/.bin:$(HOME)/.cargo/bin:$(PATH)

SITE := target/site
WASM := $(CARGO_TARGET_DIR)/wasm32-unknown-unknown/debug/berth_app.wasm
BERTH := $(CARGO_TARGET_DIR)/debug/berth
# wasm-bindgen-cli must match the wasm-bindgen crate exactly.
WASM_BINDGEN_VERSION := $(shell sed -n '/^name = "wasm-bindgen"$$/{n;s/version = "\(.*\)"/\1/p;}' Cargo.lock)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: idp run test build tools rust-tools node-tools browser host-tools smtp-tools bench-tools site server cli unit e2e lint fmt clean \
	bench bench-smoke release release-tools api-fuzz fuzz-tools

## run: install what is missing, build, and start Berth on http://127.0.0.1:3000
run: build
	@echo "A development build (debug, uncompressed WebAssembly); \`make release\` builds what the image ships."
	BERTH_DEMO=$${BERTH_DEMO:-true} $(BERTH) serve

## idp: the local OpenID provider the tests use, for trying single sign-on next to `make run`
idp: node-tools
	node e2e/idp.mjs

## test: every test: formatting and clippy, Rust unit and integration tests, every benchmark
## in its smoke mode, then the browser end-to-end tests
test: build browser lint unit api-fuzz bench-smoke e2e

build: tools site server cli

tools: rust-tools node-tools

rust-tools:
	@rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt
	@if [ "$$(wasm-bindgen --version 2>/dev/null | cut -d' ' -f2)" != "$(WASM_BINDGEN_VERSION)" ]; then \
		echo "installing wasm-bindgen-cli $(WASM_BINDGEN_VERSION) (a few minutes, once)"; \
		cargo install wasm-bindgen-cli --version "$(WASM_BINDGEN_VERSION)" --force; \
	fi

# `npm install`, not `npm ci`: npm 11's `ci` rejects the lock file over the other platforms'
# optional Tailwind binaries. The versions are pinned exactly in package.json and the lock.
node-tools:
	@if [ ! -f node_modules/.package-lock.json ] || [ package.json -nt node_modules/.package-lock.json ]; then \
		npm install --no-audit --no-fund; \
	fi

# Debian's Chromium for the end-to-end tests (test tools that download a browser fail here).
browser:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# iproute2, nftables and ping for the tenant network test (berth-agent), which builds hosts in network
# namespaces and sets them up with the agent's own code.
host-tools:
	@command -v ip >/dev/null && command -v nft >/dev/null && command -v ping >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables iputils-ping; }

# Debian's aiosmtpd: the real SMTP server the notification tests start on loopback
# (platform/tests/notifications.rs, e2e/notifications.test.mjs).
smtp-tools:
	@test -x /usr/bin/aiosmtpd || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-aiosmtpd; }

# wrk for the load benchmark, python3 for its one-time code and the openb checker.
bench-tools:
	@command -v wrk >/dev/null && command -v python3 >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk python3; }

## site: the browser side: hydration WASM, its JS glue, CSS and static files in target/site
site: rust-tools node-tools
	cargo build -p berth-app --lib --target wasm32-unknown-unknown --no-default-features --features hydrate
	@mkdir -p $(SITE)/pkg
	wasm-bindgen --target web --no-typescript --out-dir $(SITE)/pkg --out-name berth $(WASM)
	tailwindcss --input style/main.css --output $(SITE)/pkg/berth.css --minify
	cp -r public/. $(SITE)/

server:
	cargo build -p berth-server

## cli: berthctl, the command line (users install it with `cargo install --path cli`)
cli:
	cargo build -p berthctl

RELEASE_SITE := target/release-site
RELEASE_WASM := $(CARGO_TARGET_DIR)/wasm32-unknown-unknown/wasm-release/berth_app.wasm

## release: what the image ships: an optimised `berth` ($(CARGO_TARGET_DIR)/release/berth) and a
## site (target/release-site) whose WebAssembly is built for size (the wasm-release profile,
## without its name section), whose /pkg files are named by their content's hash (listed in
## hash.txt, the file Leptos reads) and come with brotli and gzip copies;
## `berth serve --site-root target/release-site` serves them
release: tools release-tools
	cargo build --profile wasm-release -p berth-app --lib --target wasm32-unknown-unknown --no-default-features --features hydrate
	rm -rf $(RELEASE_SITE) && mkdir -p $(RELEASE_SITE)/pkg
	wasm-bindgen --target web --no-typescript --remove-name-section --remove-producers-section \
		--out-dir $(RELEASE_SITE)/pkg --out-name berth $(RELEASE_WASM)
	tailwindcss --input style/main.css --output $(RELEASE_SITE)/pkg/berth.css --minify
	cd $(RELEASE_SITE)/pkg && for file in js:berth.js wasm:berth_bg.wasm css:berth.css; do \
		kind=$${file%%:*}; name=$${file#*:}; hash=$$(sha256sum $$name | cut -c1-20); \
		mv $$name berth.$$hash.$$kind; echo "$$kind: $$hash" >> ../hash.txt; \
		gzip -9 -k berth.$$hash.$$kind; brotli -q 11 berth.$$hash.$$kind; \
	done
	cp -r public/. $(RELEASE_SITE)/
	cargo build --release -p berth-server
	@ls -l $(RELEASE_SITE)/pkg

# No wasm-opt: Debian's binaryen (108) turns wasm-bindgen's externref table into a funcref
# table, and the page fails to hydrate ("WebAssembly.Table.set(): Argument 1 is invalid");
# its -Oz output also compressed worse (877 kB brotli against 780 kB without it).
# Debian's brotli for `make release`.
release-tools:
	@command -v brotli >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq brotli; }

# Each package on its own, so `ssr` and `hydrate` are never switched on together. berthctl is
# built before the server's tests, which run the binary (server/src/tests/cli.rs).
unit: host-tools smtp-tools
	cargo test -p berth-domain --all-features
	cargo test -p berth-platform
	cargo test -p berth-app --features ssr
	cargo test -p berth-agent
	cargo test -p berthctl
	cargo build -p berthctl
	cargo test -p berth-server

## api-fuzz: schemathesis against a running Berth: every operation of /api/v1/openapi.json as
## a platform admin, a tenant member and a node agent, --checks all (server/src/tests/schemathesis.rs)
api-fuzz: fuzz-tools
	BERTH_SCHEMATHESIS=$(SCHEMATHESIS_VENV)/bin/st cargo test -p berth-server --lib tests::schemathesis -- --ignored --nocapture

# schemathesis from PyPI, pinned, in a virtual environment of its own under ~/.cache.
SCHEMATHESIS_VERSION := 4.32.5
SCHEMATHESIS_VENV := $(HOME)/.cache/berth/schemathesis-$(SCHEMATHESIS_VERSION)
fuzz-tools:
	@python3 -c 'import venv, ensurepip' 2>/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }
	@test -x $(SCHEMATHESIS_VENV)/bin/st || { \
		echo "installing schemathesis $(SCHEMATHESIS_VERSION) (once)"; \
		python3 -m venv $(SCHEMATHESIS_VENV) && $(SCHEMATHESIS_VENV)/bin/pip install -q schemathesis==$(SCHEMATHESIS_VERSION); \
	}

e2e: build browser smtp-tools
	BERTH_BIN=$(BERTH) BERTH_SITE_ROOT=$(SITE) node --test --test-concurrency=1 e2e/

lint:
	cargo fmt --all --check
	cargo clippy -p berth-domain --all-targets --all-features -- -D warnings
	cargo clippy -p berth-platform --all-targets -- -D warnings
	cargo clippy -p berth-app --all-targets --features ssr -- -D warnings
	cargo clippy -p berth-app --lib --target wasm32-unknown-unknown --no-default-features --features hydrate -- -D warnings
	cargo clippy -p berth-agent --all-targets -- -D warnings
	cargo clippy -p berth-server --all-targets -- -D warnings
	cargo clippy -p berthctl --all-targets -- -D warnings

fmt:
	cargo fmt --all

clean:
	rm -rf $(SITE)

## bench: the load benchmark of BENCHMARKS.md against a release build
bench: build bench-tools
	cargo build --release -p berth-server
	BERTH_BIN=$(CARGO_TARGET_DIR)/release/berth bench/load.sh

# The openb trace (CI has shared/ beside the clone).
OPENB_DIR ?= $(abspath $(CURDIR)/../shared/data/openb)
OPENB_SMOKE := $(CARGO_TARGET_DIR)/openb-smoke

## bench-smoke: every benchmark of BENCHMARKS.md for a few seconds on small sizes (debug
## builds), so one that breaks fails `make test`; its figures mean nothing. The openb
## replay's placements of three seeds are checked by bench/check_openb.py; the crash
## benchmark SIGKILLs a debug `berth serve` three times and checks what clients were told.
bench-smoke: build bench-tools
	BENCH_SMOKE=1 cargo test -p berth-platform --bench booking
	BENCH_SMOKE=1 cargo test -p berth-platform --bench telemetry
	BENCH_SMOKE=1 cargo test -p berth-server --bench fleet_page
	BENCH_SMOKE=1 cargo test -p berth-server --bench usage_page
	BENCH_SMOKE=1 cargo test -p berth-server --bench crash
	rm -rf $(OPENB_SMOKE)
	OPENB_DIR=$(OPENB_DIR) OPENB_SEEDS=3 OPENB_PLACEMENTS=$(OPENB_SMOKE) cargo test -p berth-domain --bench openb_replay
	python3 bench/check_openb.py $(OPENB_DIR) $(OPENB_SMOKE)
	BERTH_BIN=$(BERTH) bench/load.sh --smoke
	BERTH_BIN=$(BERTH) BERTH_SITE_ROOT=$(SITE) BENCH_SMOKE=1 node bench/hydration.mjs

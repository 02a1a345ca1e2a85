# agentloop — the two set-up commands are `make dev` and `make test`; both install what they need.
SHELL := /bin/bash
GO ?= go
ADDR ?= 127.0.0.1:8787
DATA ?= .agentloop
NPM_FLAGS := --no-audit --no-fund --loglevel=error

.PHONY: web bench-web bench-peer bench-lambda dev test test-go test-race test-fuzz test-matrix test-long fuzz vet deps node-deps bench build clean soak soak-chaos

## dev: run the whole system locally (SQLite, offline model unless OPENAI_API_KEY is set), the web app at its root
dev: web
	$(GO) run ./cmd/agentloop dev --addr $(ADDR) --data $(DATA)

## web: build the web app (web/, Vite) into web/dist/app when it is missing or older than its sources; the Go
## binaries embed it (package web), so build it before `go build` (make dev and make test do)
WEB_SRC := $(shell find web/src -type f) web/index.html web/vite.config.ts web/tsconfig.json
web: web/dist/app/index.html
web/node_modules/.installed: web/package-lock.json web/package.json
	cd web && npm ci $(NPM_FLAGS)
	touch $@
web/dist/app/index.html: web/node_modules/.installed $(WEB_SRC)
	cd web && npm run build --silent

## test: every test, including the store suite on dynalite and the AI SDK parsers (installs the pinned npm packages)
test: deps vet test-go test-race test-fuzz test-matrix

deps: node-deps web
	$(GO) mod download
	web/e2e/chromium.sh

# The pinned npm packages: the AI SDK parsers (ai@6, ai@7 + Node 22), dynalite (the DynamoDB-compatible
# server the store tests start on the machine's Node) and sfnlocal (aws-local-stepfunctions, asl-validator and
# its own Node 22: the job state machine's tests). run.sh re-installs only when the lock file changed; dynalite
# and sfnlocal are installed when their lock file is newer than the install. dynalite's npm ci runs its postinstall,
# which applies infra/dynalite/patches (apply-patches.js): a changed patch re-installs too.
node-deps: infra/dynalite/node_modules/.installed infra/sfnlocal/node_modules/.installed
	lib/uistream/aisdktest/testdata/checker/run.sh --install

infra/dynalite/node_modules/.installed: infra/dynalite/package-lock.json infra/dynalite/package.json \
		infra/dynalite/apply-patches.js $(wildcard infra/dynalite/patches/*.patch)
	cd infra/dynalite && npm ci $(NPM_FLAGS)
	touch $@

infra/sfnlocal/node_modules/.installed: infra/sfnlocal/package-lock.json infra/sfnlocal/package.json
	cd infra/sfnlocal && npm ci $(NPM_FLAGS)
	touch $@

vet:
	$(GO) vet ./...

test-go:
	$(GO) test -count=1 -timeout 30m ./...

# The concurrent core again under the race detector (claims, heartbeats, the guard, the encoder and segmenter,
# readers, the reaper, handlers). The fault-schedule simulation runs once, without -race, in test-go (it is
# clean under -race too, at a tenth of the speed).
RACE_PKGS := ./lib/engine ./lib/httpapi ./lib/uistream ./lib/segments ./lib/reaper ./lib/threads ./lib/sqlite ./lib/interrupts \
	./lib/storetest ./lib/openai ./lib/openairesponses ./lib/bedrockconverse ./lib/offline ./lib/localjobs ./lib/jobs
test-race:
	$(GO) test -race -count=1 -timeout 20m $(RACE_PKGS)

# The adapter matrix (issue 20 item 2): the engine and HTTP suites again over each adapter but lib/openai (which
# test-go runs them on), the stack's default model a models-file entry of that provider talking to the offline
# model (lib/modeltest/matrix, AGENT_TEST_PROVIDER). Each adapter's own TestMatrix runs in test-go. run.sh builds
# each package's test binary once and runs the providers from it, MATRIX_JOBS (default 4) at once,
# with -test.short (MATRIX_FLAGS): the suites' dynalite variants check the store, not the adapter, and run in
# test-go (run.sh says more).
MATRIX_PROVIDERS := openai-responses anthropic anthropic-bedrock bedrock-converse
MATRIX_PKGS := ./lib/engine ./lib/httpapi
test-matrix:
	GO="$(GO)" MATRIX_PROVIDERS="$(MATRIX_PROVIDERS)" MATRIX_PKGS="$(MATRIX_PKGS)" lib/modeltest/matrix/run.sh

# The fuzz targets, package:target (go test takes one -fuzz per invocation): the POST /chat body decoder, the
# newest-message validator and the stream encoder (FUZZ_BRIEF, run 3 s each by make test: about 15 s with the
# builds), then the stream's string encoder, the approval signature's canonical JSON and the tool input check
# (its coverage varies from run to run: the schema validator walks maps, so the fuzzer spends long stretches
# shrinking, at 0 execs/s, which is not a hang). Every target's seeds (f.Add, and testdata/fuzz/<target>/ for
# inputs that once failed) also run in test-go.
FUZZ_BRIEF := ./lib/httpapi:FuzzDecodeChat ./lib/agent:FuzzValidateIncoming ./lib/uistream:FuzzEncoder
FUZZ_TARGETS := $(FUZZ_BRIEF) ./lib/uistream:FuzzAppendString ./lib/interrupts:FuzzCanonical ./lib/toolschema:FuzzCheckInput ./lib/openairesponses:FuzzDecodeDelta
# FUZZMINIMIZETIME bounds the shrinking of each new input (go test's default, 60 s, can take a whole brief run,
# and a run that ends mid-shrink has been seen to fail with "fuzzing process hung or terminated unexpectedly").
FUZZTIME ?= 60s
FUZZMINIMIZETIME ?= 10s
test-fuzz:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=3s FUZZMINIMIZETIME=1s FUZZ_TARGETS="$(FUZZ_BRIEF)"

## fuzz: every fuzz target for FUZZTIME each (default 60s); a failing input is written under the package's
## testdata/fuzz/ (commit it: it becomes a seed)
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$pkg; \
	done

## test-long: what make test leaves to a longer run: the fault-schedule simulation over 2,000 seeds on SQLite and
## 142 on DynamoDB (make test runs 400 and 50, plus the regression seeds, every time), then make test itself
SIM_LONG_SCHEDULES ?= 2000
test-long: deps
	SIM_TIME=1 SIM_SCHEDULES=$(SIM_LONG_SCHEDULES) $(GO) test -count=1 -timeout 60m -run '^TestSimulation$$' ./internal/sim
	@$(MAKE) --no-print-directory test

## soak: the fault-schedule simulation (internal/sim) with random seeds, for SIM_DURATION (default 10m) split
## between SQLite and DynamoDB (dynalite); a failing seed is printed with the command that replays it
SIM_DURATION ?= 10m
soak: deps
	SIM_TIME=1 SIM_DURATION=$(SIM_DURATION) $(GO) test -count=1 -timeout 0 -run '^TestSimulation$$' -v ./internal/sim

## soak-chaos: `agentloop dev` SIGKILLed every 2–6 s and restarted on its SQLite file while 12 clients of one user
## send messages, for CHAOS_DURATION (default 60s) with the default per-user limits and again with them off; then
## checks the store (nothing lost, duplicated or stuck) and prints one table (internal/chaos; CHAOS_SEED replays
## the kill schedule and the clients' choices; not part of make test)
CHAOS_DURATION ?= 60s
soak-chaos:
	CHAOS_DURATION=$(CHAOS_DURATION) $(GO) test -count=1 -timeout 0 -run '^TestChaosSoak$$' -v ./internal/chaos

## bench: performance numbers (see README)
# Whole-turn benchmarks run a fixed 300 turns each so that p99 means something (stops: 50 in the reply's own
# process on SQLite and 50 across processes on dynalite, then 10 replies streamed for 3 s for what noticing a stop
# costs; approvals: 100, each an asking turn, its answer and the same call without approval; the 20 s streaming
# reply: once). Jobs: 100
# deliveries of each kind on SQLite and 50 on dynalite (idle, busy and coalesced steers), 5 metered delivered jobs
# per store (their counts are exact), 10 reaper ticks per size (1,000 and 10,000 idle threads, seeded once per
# size), 30 turns on a 50- and on a 5,000-message thread per store (LongThread: seeded once, 1x), 3 turns of each
# kind with their DynamoDB requests by purpose (DynamoCost: 10 s replies, 1x), the cached share of input tokens over
# a 50-turn thread per step and in blocks (PromptCache, 1x). The rest run for 2 s each.
## bench-web: the web app in Chromium against agentloop dev: Send → first visible text and → whole reply
## (median, p90 of 20) and the bundle's size (gzip); part of make bench
bench-web: deps
	web/e2e/bench.sh

## bench-peer: the peer benchmark (issue 18, internal/peerbench): `agentloop dev` and the AI SDK's own server
## (internal/peerbench/aisdk, pinned, installed here with npm ci and never by make test) on the same fake model
## (200 words, one every 5 ms) and load client, at 20 streams × 3 rounds, 200 and 1,000 concurrent streams; prints
## CPU per word, model→client p50/p99, peak RSS, errors, agentloop's stored runs and store statements, the ratios
## (PEERBENCH_LOADS=20x3,200 picks loads; part of make bench)
PEER_AISDK := internal/peerbench/aisdk
$(PEER_AISDK)/node_modules/.installed: $(PEER_AISDK)/package-lock.json $(PEER_AISDK)/package.json
	cd $(PEER_AISDK) && npm ci $(NPM_FLAGS)
	touch $@

bench-peer: $(PEER_AISDK)/node_modules/.installed
	PEERBENCH=1 $(GO) test -count=1 -timeout 30m -run '^TestPeerBench$$' -v ./internal/peerbench

## bench-lambda: the chat function's footprint (issue 18 item 6, functions/deploytest BenchmarkChatFootprint), 3 cold
## starts under the Runtime Interface Emulator at AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128, each answering a 2,000-word
## reply on dynalite: the bootstrap `make build-ChatFunction` ships (target ≤ 25 MB), init (≤ 30 ms), the
## bootstrap's peak RSS (< 128 MB); part of make bench
bench-lambda: infra/dynalite/node_modules/.installed
	$(GO) test -run '^$$' -bench 'ChatFootprint' -benchtime 3x -count 1 -v ./functions/deploytest

bench: deps bench-web bench-peer bench-lambda
	$(GO) test -run '^$$' -bench 'Turn' -benchtime 300x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'Stop' -benchtime 50x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'Resume' -benchtime 5x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'Approval' -benchtime 100x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'StreamingCost' -benchtime 1x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'SteerSQLite' -benchtime 100x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'SteerDynamo' -benchtime 50x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'JobCost' -benchtime 5x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'ReaperTick' -benchtime 10x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'LongThread' -benchtime 1x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'DynamoCost' -benchtime 1x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench 'PromptCache' -benchtime 1x -count 1 ./internal/benchmarks
	$(GO) test -run '^$$' -bench . -skip 'ChatFootprint' -benchtime 2s -count 1 $$($(GO) list ./... | grep -v /internal/benchmarks)

## build: an arm64 `bootstrap` per Lambda function, in sam build's layout: $(BUILD_DIR)/<LogicalId>/bootstrap and
## $(BUILD_DIR)/template.yaml pointing each function at its folder and the state machine at its definition in this
## tree (an absolute path: what `sam deploy` packages). `sam build` runs
## the same build-<LogicalId> targets itself (BuildMethod: makefile) with ARTIFACTS_DIR set.
BUILD_DIR ?= .aws-sam/build
LAMBDA_FUNCTIONS := ChatFunction ApiFunction SubagentFunction WakeFunction ReaperFunction
LAMBDA_GOENV := GOOS=linux GOARCH=arm64 CGO_ENABLED=0
LAMBDA_GOFLAGS := -tags lambda.norpc -trimpath -ldflags='-s -w'
## bundle/ (when present) is copied into every package: files too large for Lambda's 4 KB environment, such as
## a long system prompt (AGENT_SYSTEM_PROMPT_FILE=bundle/system-prompt.txt) or price table (AGENT_PRICES_FILE).
lambda-build = mkdir -p $(ARTIFACTS_DIR) && $(LAMBDA_GOENV) $(GO) build $(LAMBDA_GOFLAGS) -o $(ARTIFACTS_DIR)/bootstrap $(1) && \
	if [ -d bundle ]; then rm -rf $(ARTIFACTS_DIR)/bundle && cp -R bundle $(ARTIFACTS_DIR)/bundle; fi

.PHONY: build-ChatFunction build-ApiFunction build-SubagentFunction build-WakeFunction build-ReaperFunction

build:
	@set -e; for fn in $(LAMBDA_FUNCTIONS); do \
		$(MAKE) --no-print-directory build-$$fn ARTIFACTS_DIR=$(abspath $(BUILD_DIR))/$$fn; done
	awk -v root='$(CURDIR)' '/^Resources:/ {res=1} res && /^  [A-Za-z0-9]+:[ \t]*$$/ {name=$$1; sub(/:.*/, "", name)} \
		res && /^ +CodeUri: \.\/?[ \t]*$$/ {sub(/CodeUri: .*/, "CodeUri: " name)} \
		res && /^ +DefinitionUri: [^\/ ][^ ]*[ \t]*$$/ {sub(/DefinitionUri: /, "DefinitionUri: " root "/")} {print}' template.yaml > $(BUILD_DIR)/template.yaml

build-ChatFunction:
	$(call lambda-build,./functions/chat)

build-ApiFunction: web
	$(call lambda-build,./functions/api)

build-SubagentFunction:
	$(call lambda-build,./functions/subagent)

build-WakeFunction:
	$(call lambda-build,./functions/wake)

build-ReaperFunction:
	$(call lambda-build,./functions/reaper)

clean:
	rm -rf .aws-sam bin

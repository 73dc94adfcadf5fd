# loomfs — see README.md. Every target runs from a clean clone.
GO        ?= go
BIN       ?= bin/loomfs
FUZZTIME  ?= 15s
STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build test test-dfs unit fuzz lint bench demo setup clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/loomfs

## test: vet, race-enabled tests of every package, a short fuzz of the path validator.
test: build
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -run='^$$' -fuzz=FuzzCleanPath -fuzztime=$(FUZZTIME) ./policy/

## test-dfs: the shared-volume tests on two clients of a single-host CephFS (root; scripts/cephfs), taken down after.
DFS_TESTS ?= ^TestNode
test-dfs: build
	bash scripts/cephfs up
	LOOMFS_DFS_ROOTS=$$(bash scripts/cephfs roots) $(GO) test -race -count=1 -timeout 20m -run '$(DFS_TESTS)' ./test/; \
		rc=$$?; bash scripts/cephfs down; exit $$rc

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

## bench: benchmarks side by side; figures go to BENCHMARKS.md by hand.
bench: build
	bash bench/run.sh

## setup: install and start what loomfs needs (Debian packages, Docker engine, sandbox image).
setup:
	bash scripts/setup

## demo: the main job on the embedded default (local backend under ./data).
demo: setup build
	bash scripts/demo

clean:
	rm -rf bin

# loomfs — see README.md. Every target runs from a clean clone.
GO        ?= go
BIN       ?= bin/loomfs
# A count, not a duration: Go 1.26's fuzzing coordinator can report a run
# that reached its -fuzztime deadline as failed, "context deadline exceeded"
# (go.dev/issue/75804, fixed in 1.27). 400,000 runs take about 15 s here.
FUZZTIME  ?= 400000x
# Minimizing a new input runs the target about n² times for n bytes; the
# default (up to a minute each) kept every worker minimizing instead of fuzzing.
FUZZMINIMIZE ?= 2000x
STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build test test-dfs unit fuzz faults lint bench demo setup clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/loomfs

# The end-to-end tests that run containers, repeated under gVisor.
SANDBOX_E2E ?= TestProcessesAcrossCallers|TestProcessTreeEndsWithIt|TestServiceKilledWithLiveSession|TestSessionCommandsThroughTheService|TestCommandEndToEnd|TestEscapesFromInsideContainer|TestCommandHoldsScopeLock|TestQuarantineAfterWorkerDies|TestHeldProjectionQuarantines|TestDaemonKilledDuringRead

## test: vet, race-enabled tests of every package, the sandbox tests again
## under gVisor (runsc, registered by scripts/setup), the CI slice of the
## fault matrix (RELIABILITY.md), a short fuzz of the path validator.
test: build
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v /test/faults$$)
	# In the package's directory, so that go test prints the matrix's table
	# (cells run and holding per door) when it passes too.
	cd test/faults && LOOMFS_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 60m
	# Memory bounds, measured without the race detector (it multiplies memory).
	$(GO) test -count=1 -run '^TestReadImageMemory$$' ./tools/
	AGENT_LOOM_SANDBOX_RUNTIME=runsc $(GO) test -race -count=1 -timeout 15m ./sandbox/ ./process/
	AGENT_LOOM_SANDBOX_RUNTIME=runsc $(GO) test -race -count=1 -timeout 15m -run '^($(SANDBOX_E2E))$$' ./test/
	$(MAKE) fuzz

## fuzz: a short fuzz of the path validator; prints the final execution count, fails if it stalls.
fuzz:
	GO=$(GO) bash scripts/fuzz FuzzCleanPath ./policy/ $(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZE)

## faults: the whole fault matrix (RELIABILITY.md): every call site of every
## door under each errno and a kill, and the device cases; root, strace.
faults: build
	cd test/faults && LOOMFS_BIN=$(CURDIR)/$(BIN) LOOMFS_FAULTS=full $(GO) test -count=1 -timeout 4h

## test-dfs: the shared-volume tests on two clients of a single-host CephFS (root; scripts/cephfs), and the
## peer probe's negative control on GlusterFS (scripts/glusterfs), each taken down after.
DFS_TESTS ?= ^TestNode
test-dfs: build
	bash scripts/cephfs up
	LOOMFS_CEPHFS_STATE=$${LOOMFS_CEPHFS_STATE:-/tmp/loomfs-cephfs} LOOMFS_DFS_ROOTS=$$(bash scripts/cephfs roots) $(GO) test -race -count=1 -timeout 20m -run '$(DFS_TESTS)' ./test/; \
		rc=$$?; bash scripts/cephfs down; [ $$rc -eq 0 ] || exit $$rc
	bash scripts/glusterfs up
	LOOMFS_GLUSTER_DEFAULT_ROOTS=$$(bash scripts/glusterfs roots default) \
	LOOMFS_GLUSTER_COHERENT_ROOTS=$$(bash scripts/glusterfs roots coherent) \
		$(GO) test -race -count=1 -timeout 5m -run '^TestPeerProbeGlusterFS$$' ./test/; \
		rc=$$?; bash scripts/glusterfs down; exit $$rc

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

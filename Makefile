# loomfs — see README.md. Every target runs from a clean clone.
GO        ?= go
BIN       ?= bin/loomfs
FUZZTIME  ?= 15s
# Minimizing a new input runs the target about n² times for n bytes; the
# default (up to a minute each) kept every worker minimizing instead of fuzzing.
FUZZMINIMIZE ?= 2000x
STATICCHECK_VERSION ?= v0.8.2

.PHONY: all build test unit fuzz lint bench demo setup clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/loomfs

## test: vet, race-enabled tests of every package, a short fuzz of the path validator.
test: build
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) fuzz

## fuzz: a short fuzz of the path validator; prints the final execution count, fails if it stalls.
fuzz:
	GO=$(GO) bash scripts/fuzz FuzzCleanPath ./policy/ $(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZE)

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

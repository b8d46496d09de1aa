# tribe: `make run` starts an agent with embedded defaults, `make test` runs
# the whole suite, `make bench` measures speed and memory targets.
GO        ?= go
BIN       := bin/tribe
# Static, no cgo (no libc mapped into every agent), paths trimmed, symbol
# tables dropped: a smaller binary maps fewer pages per agent.
export CGO_ENABLED ?= 0
GOFLAGS_BUILD := -trimpath -ldflags "-s -w"
ARGS      ?=

.PHONY: build run test race fuzz bench lint clean

build:
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN) ./cmd/tribe

# Starts an agent in the foreground: data dir ~/.tribe, TCP and QUIC on port
# 4001, mDNS on. Pass flags with ARGS, e.g. make run ARGS="--name web-1".
run: build
	./$(BIN) agent $(ARGS)

# The whole suite: unit, property and fuzz-seed tests, the simulator, real
# agent processes on loopback, and (as root) hosts in network namespaces.
test:
	$(GO) test -count=1 -timeout 15m ./...

race:
	CGO_ENABLED=1 $(GO) test -race -short -count=1 -timeout 20m ./...

# Runs each fuzz target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./node -run '^$$' -fuzz '^FuzzReadHello$$' -fuzztime $(FUZZTIME)
	$(GO) test ./node -run '^$$' -fuzz '^FuzzOpenPresence$$' -fuzztime $(FUZZTIME)
	$(GO) test ./gossip -run '^$$' -fuzz '^FuzzOpen$$' -fuzztime $(FUZZTIME)
	$(GO) test ./gossip -run '^$$' -fuzz '^FuzzDecodeEntry$$' -fuzztime $(FUZZTIME)
	$(GO) test ./gossip -run '^$$' -fuzz '^FuzzReadMsg$$' -fuzztime $(FUZZTIME)
	$(GO) test ./gossip -run '^$$' -fuzz '^FuzzSyncMessages$$' -fuzztime $(FUZZTIME)
	$(GO) test ./gossip/authority -run '^$$' -fuzz '^FuzzDecodeAdmission$$' -fuzztime $(FUZZTIME)
	$(GO) test ./gossip/authority -run '^$$' -fuzz '^FuzzGrant$$' -fuzztime $(FUZZTIME)
	$(GO) test ./plugins -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZTIME)
	$(GO) test ./plugins -run '^$$' -fuzz '^FuzzDecodeResponse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./plugins -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME)

# Speed and memory, as ratios measured side by side in one run. The last
# line measures the sim's spread of writes and policies in simulated time
# (testing/synctest over QUIC on simnet: the protocol's latency, each
# node's CPU its own); the sim benchmarks before it run on the wall clock,
# every node sharing this machine's cores.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 5x -timeout 20m ./gossip ./policy ./node
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 80m ./cmd/tribe ./sim
	TRIBE_SIMTIME=1 $(GO) test -run '^TestSimTime' -v -timeout 80m ./sim

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

clean:
	rm -rf bin

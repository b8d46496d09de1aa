# tribe: `make run` starts an agent with embedded defaults, `make test` runs
# the whole suite, `make bench` measures speed and memory targets, `make
# package` builds the .deb and `make install` installs the binary.
GO        ?= go
BIN       := bin/tribe
PKG       := cmd/tribe/packaging
# The version stamped into the binary and the package: git describe of the
# nearest v* tag, else node.Version's default and the commit. Computed once.
ifeq ($(origin VERSION),undefined)
VERSION   := $(shell sh $(PKG)/version.sh)
endif
# Static, no cgo (no libc mapped into every agent), paths trimmed, symbol
# tables dropped: a smaller binary maps fewer pages per agent.
export CGO_ENABLED ?= 0
# urfave_cli_no_docs leaves out urfave/cli's man page and markdown
# generator (and the markdown renderer it links), which tribe never uses.
GOFLAGS_BUILD := -trimpath -tags urfave_cli_no_docs -ldflags "-s -w -X github.com/tribeagent/tribe/node.Version=$(VERSION)"
ARGS      ?=

# make install: the binary in $(DESTDIR)$(BINDIR); with INSTALL_UNIT=1 also
# the systemd unit in $(DESTDIR)$(UNITDIR) (its ExecStart pointing at
# $(BINDIR)/tribe), and the commented config and flags files in
# $(DESTDIR)$(SYSCONFDIR), never overwriting ones already there.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
UNITDIR    ?= /lib/systemd/system
SYSCONFDIR ?= /etc
DESTDIR    ?=
INSTALL_UNIT ?=

.PHONY: build run test race fuzz bench lint clean package install uninstall

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
FUZZ_TARGETS := \
	./node:FuzzReadHello \
	./gossip/swim:FuzzDecodeFrame \
	./node:FuzzDecodeTaskWatchRequest \
	./node:FuzzReadKeptFrame \
	./node:FuzzDecodeJobOutputRequest \
	./gossip:FuzzOpen \
	./gossip:FuzzDecodeEntry \
	./gossip:FuzzReadMsg \
	./gossip:FuzzSyncMessages \
	./gossip/authority:FuzzDecodeAdmission \
	./gossip/authority:FuzzGrant \
	./plugins:FuzzDecodeRequest \
	./plugins:FuzzDecodeResponse \
	./plugins:FuzzReadFrame \
	./plugins:FuzzOpenOrder \
	./plugins:FuzzOpenAnswer \
	./plugins:FuzzRelayedFrame \
	./plugins/tasks:FuzzDecodeManifest \
	./plugins/jobs:FuzzDecode \
	./plugins/jobs:FuzzDecodeAck \
	./plugins/external/wire:FuzzDecodeResponse \
	./plugins/external/wire:FuzzDecodeInfo \
	./plugins/external/wire:FuzzDecodeResultAgreesWithStrict \
	./plugins/external/wire:FuzzEncodeCallAgreesWithMarshal \
	./plugins/sdk:FuzzParseCallAgreesWithUnmarshal \
	./gossip:FuzzCanonicalPeer \
	./node:FuzzDecodeJobListRequest \
	./node:FuzzDecodeJobListAnswer \
	./node:FuzzDecodePluginFetchRequest \
	./internal/names:FuzzNamesAreTheRegexps \
	./node:FuzzCheckRecord \
	./node:FuzzCheckPolicyMembership \
	./node:FuzzDecodeTaskRunLine \
	./node:FuzzDecodeJobOutputAnswer \
	./node:FuzzDecodeFetchHeader \
	./policy:FuzzCompile \
	./policy:FuzzCheckJSON \
	./internal/names:FuzzPrintableIsWhatQuoteKeeps

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "$(GO) test $${t%%:*} -fuzz $${t##*:}"; \
	  $(GO) test $${t%%:*} -run '^$$' -fuzz "^$${t##*:}\$$" -fuzztime $(FUZZTIME); \
	done

# Speed and memory, as ratios measured side by side in one run. The last
# line measures the sim's spread of writes, policies, a newcomer's record,
# a fan-out to all (1,000 nodes; 90 minutes here) and a job against a call
# (25 and 100 nodes) in simulated time
# (testing/synctest over QUIC on simnet: the protocol's latency, each
# node's CPU its own); the sim benchmarks before it run on the wall clock,
# every node sharing this machine's cores.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 5x -timeout 20m ./gossip ./policy ./node ./plugins/external
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 80m ./cmd/tribe ./sim ./gossip/swim
	TRIBE_SIMTIME=1 $(GO) test -run '^TestSimTime' -v -timeout 300m ./sim
	cd bench/goplugin && $(GO) test -run '^$$' -bench . -benchtime 3x

lint:
	$(GO) vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The .deb, built with dpkg-deb (Debian's dpkg, on every Debian and Ubuntu
# host) into bin/: /usr/bin/tribe, the unit tribe.service (not enabled),
# /etc/tribe/agent.yaml and /etc/default/tribe as conffiles, the user tribe.
package: build
	$(PKG)/deb/build.sh $(BIN) $(VERSION) bin $$($(GO) env GOARCH)

install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/tribe
ifneq ($(INSTALL_UNIT),)
	install -d $(DESTDIR)$(UNITDIR)
	sed -e 's|^ExecStart=/usr/bin/tribe |ExecStart=$(BINDIR)/tribe |' -e 's|^ExecReload=/usr/bin/tribe |ExecReload=$(BINDIR)/tribe |' \
	    -e 's|/etc/tribe/|$(SYSCONFDIR)/tribe/|g' -e 's|/etc/default/tribe|$(SYSCONFDIR)/default/tribe|g' \
	    $(PKG)/tribe.service >$(DESTDIR)$(UNITDIR)/tribe.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/tribe.service
	test -e $(DESTDIR)$(SYSCONFDIR)/tribe/agent.yaml || install -D -m 0640 $(PKG)/agent.yaml $(DESTDIR)$(SYSCONFDIR)/tribe/agent.yaml
	test -e $(DESTDIR)$(SYSCONFDIR)/default/tribe || install -D -m 0644 $(PKG)/default $(DESTDIR)$(SYSCONFDIR)/default/tribe
	@echo "make install: the unit runs as user tribe; unless it exists, create it and let it read the config:"
	@echo "  useradd --system --user-group --home-dir /var/lib/tribe --no-create-home --shell /usr/sbin/nologin tribe"
	@echo "  chgrp tribe $(SYSCONFDIR)/tribe/agent.yaml && systemctl daemon-reload"
endif

# Removes what make install installed, except the config files.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/tribe $(DESTDIR)$(UNITDIR)/tribe.service

clean:
	rm -rf bin

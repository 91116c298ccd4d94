# sandbox-mcp: `make help` lists the targets.

GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X github.com/sandbox-mcp/sandbox-mcp/agent.version=$(VERSION)
# Flags for `make run`; e.g. make run ARGS="--exec=allowlist --allow-cmd=ls,cat"
ARGS      ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: setup
setup: ## install what the image build and the tests need (Debian: debootstrap, busybox-static, nftables)
	@command -v debootstrap >/dev/null && command -v busybox >/dev/null && command -v nft >/dev/null || \
		{ apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap busybox-static nftables; }
	@docker version >/dev/null 2>&1 || { echo "The Docker engine is not reachable: start it (systemctl start docker) or set DOCKER_HOST." >&2; exit 1; }

.PHONY: build
build: ## build bin/sandbox-mcp and the static bin/sandbox-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sandbox-agent ./cmd/sandbox-agent
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sandbox-mcp ./cmd/sandbox-mcp

.PHONY: image
image: ## build the default sandbox image without a registry (debootstrap and apt from a Debian mirror; about 4 minutes)
	bash image/build.sh

.PHONY: testimage
testimage: ## build the small busybox image the tests use
	bash image/testimage/build.sh

.PHONY: server-image
server-image: ## build the server's own image (FROM scratch, static binaries; for deploy/kubernetes/)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/static/sandbox-agent ./cmd/sandbox-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/static/sandbox-mcp ./cmd/sandbox-mcp
	bash image/server/build.sh $(BIN)/static

.PHONY: scale-sim
scale-sim: ## simulate the Kubernetes backend's control path on kwok fake nodes (NODES=1000 SANDBOXES=10000; ~10-20 minutes)
	NODES=$(or $(NODES),1000) SANDBOXES=$(or $(SANDBOXES),10000) bash hack/scale-sim.sh

.PHONY: k8s-images
k8s-images: ## build the agent image and load it and the sandbox images into the test node (../shared/tools/k8s)
	bash hack/k8s-images.sh $(K8S_IMAGES)

.PHONY: run
run: setup image build ## set everything up and serve MCP over stdio (ARGS= for flags)
	$(BIN)/sandbox-mcp prepare $(ARGS)
	@echo "sandbox-mcp: serving MCP on stdin/stdout; point your client at $(CURDIR)/$(BIN)/sandbox-mcp (Ctrl-C stops)" >&2
	$(BIN)/sandbox-mcp $(ARGS)

.PHONY: doctor
doctor: build ## check the engine, the image and the agent
	$(BIN)/sandbox-mcp doctor $(ARGS)

.PHONY: test
test: setup image testimage ## run every test (unit, integration on the real engine, end to end) with -race
	$(GO) test -race -count=1 -timeout 45m ./...
	$(GO) -C cmd/sandbox-bench/plot test -count=1 ./...

.PHONY: bench
bench: setup image build ## measure against baselines in one run (a few minutes, and up to 30 more for the density row: BENCHFLAGS=-density=20,50 shortens it); writes docs/bench/
	$(GO) run ./cmd/sandbox-bench -bin $(BIN) -out docs/bench -doc docs/bench/README.md -readme README.md $(BENCHFLAGS)

.PHONY: lint
lint: ## gofmt, go vet, go mod tidy
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "run gofmt -w" >&2; exit 1; }
	$(GO) vet ./...
	$(GO) mod tidy -diff
	$(GO) -C cmd/sandbox-bench/plot vet ./...
	$(GO) -C cmd/sandbox-bench/plot mod tidy -diff

.PHONY: check
check: lint test ## lint, then every test

.PHONY: clean
clean: ## remove everything the project made: sandboxes, networks, images, state, the nftables table (stop the servers first; ARGS= for uninstall's flags), and bin/
	$(GO) run ./cmd/sandbox-mcp uninstall $(ARGS)
	rm -rf $(BIN)

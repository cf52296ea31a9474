# raid10-csi Makefile. `make help` lists every target.
SHELL := /bin/bash
GO ?= go
BIN := bin
CACHE ?= $(HOME)/.cache/raid10-csi
export RAID10_CACHE := $(CACHE)

# Every tool version (GOLANGCI_VERSION here), one table with hack/: NAME=value lines that the
# scripts source and make reads. Override one on the command line: make lint GOLANGCI_VERSION=...
include hack/versions.sh

.DEFAULT_GOAL := help

.PHONY: help
help: ## List every target with a line of text.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install Debian packages and build the pinned test tools (cached under ~/.cache/raid10-csi).
	bash hack/install-deps.sh

.PHONY: build
build: ## Build the binaries into ./bin.
	$(GO) build -o $(BIN)/raid10-csi ./cmd/raid10-csi
	$(GO) build -o $(BIN)/kubectl-raid10 ./cmd/kubectl-raid10

.PHONY: image
image: ## Build the plugin and pause images as tarballs in _output/image without Docker (docker load / ctr images import).
	bash hack/image.sh

.PHONY: test
test: deps ## Run every test: unit, real NBD clients, the QEMU VM and the real kube-apiserver.
	bash hack/test.sh

.PHONY: unit
unit: ## Run only the fast host tests (no VM, no kube-apiserver).
	RAID10_SKIP_HEAVY=1 $(GO) test -race -count=1 -short ./...

.PHONY: e2e
e2e: deps ## Run the end-to-end tests: the QEMU VM (kernel nbd/md) and the real kube-apiserver.
	source hack/tool-env.sh && $(GO) test -count=1 -timeout 60m -v ./test/...

.PHONY: cluster-test
cluster-test: deps ## Only the user's story on a real kubelet in the QEMU node (make test runs it too): helm install, claims, pods, disk pull, upgrade, reboot (~10 min).
	source hack/tool-env.sh && $(GO) test -count=1 -timeout 90m -v -run '^TestClusterStory$$' ./test/cluster

.PHONY: cluster-demo
cluster-demo: deps ## cluster-test, pausing PAUSE (default 10m) after the volumes are Healthy to look around with kubectl.
	source hack/tool-env.sh && RAID10_CLUSTER_PAUSE=$${PAUSE:-10m} $(GO) test -count=1 -timeout 120m -v -run '^TestClusterStory$$' ./test/cluster

.PHONY: k8s-e2e
k8s-e2e: deps ## Kubernetes' external storage e2e suites on the rig (test/k8se2e, driver.yaml; builds e2e.test once, ~30 min cold): FOCUS, SKIP (regexps), PARALLEL (default 1); JUnit and log in _output/k8s-e2e. CHECK=1: only driver.yaml against --list-tests.
	dir=$$(bash hack/build-k8s-e2e.sh) && source hack/tool-env.sh && cd test/k8se2e && \
	  RAID10_K8S_E2E_DIR=$$dir RAID10_K8S_E2E_RUN=$(if $(CHECK),,1) RAID10_K8S_E2E_FOCUS='$(value FOCUS)' \
	  RAID10_K8S_E2E_SKIP='$(or $(value SKIP),\[Disruptive\])' RAID10_K8S_E2E_PARALLEL=$(or $(PARALLEL),1) \
	  RAID10_K8S_E2E_REPORT=$(abspath _output/k8s-e2e) GOWORK=off \
	  $(GO) test -count=1 -timeout 0 -v -run '^(TestDriverYAMLSelectsSuites|TestK8sE2E)$$' .

.PHONY: vm
vm: ## Run CMD in the QEMU test VM (kernel nbd/md): make vm CMD='cat /proc/mdstat'
	$(GO) run ./test/vm/cmd/vmrun -- '$(CMD)'

.PHONY: bench
bench: deps ## Run the benchmarks (ratios against a reference measured in the same run; ~15 min).
	source hack/tool-env.sh && $(GO) test -run '^$$' -bench . -benchmem -timeout 45m ./pkg/...

.PHONY: bench-vm
bench-vm: deps ## Run the VM benchmark: md raid10 vs the engine over NBD and ublk (6.12 kernel; KERNEL=newest: 7.3) on 4 emulated NVMe disks, one boot (~15 min; ROUNDS=3 repeats each md/frontend pair, FRONTENDS=nbd,ublk picks); TABLE=file keeps the markdown table.
	source hack/tool-env.sh && RAID10_PERF_TABLE=$(abspath $(or $(TABLE),_output/perf.md)) \
	  $(if $(ROUNDS),RAID10_PERF_ROUNDS=$(ROUNDS)) $(if $(KERNEL),RAID10_PERF_KERNEL=$(KERNEL)) $(if $(FRONTENDS),RAID10_PERF_FRONTENDS=$(FRONTENDS)) $(GO) test -run '^$$' -bench '^BenchmarkVM$$' -benchtime=1x -timeout 30m -v ./test/perf/

.PHONY: scale-bench
scale-bench: STEPS ?= 10,100,1000
scale-bench: deps ## Grow a cluster of hollow nodes on the real kube-apiserver in STEPS (default 10,100,1000; VOLUMES per step 200, WORKERS 16, IDLE 60s); TABLE=file keeps the table; HOLD=N then creates N volumes and keeps them (memory per volume); CLAIMS=N: per step N WaitForFirstConsumer claims with pods through kube-scheduler, then N Immediate claims (KCM_QPS: kube-controller-manager's client QPS; SCHED_PCT: kube-scheduler's percentageOfNodesToScore; SCHEDULER: another kube-scheduler binary); PROFILE=dir keeps CPU profiles (this process's and kube-scheduler's).
	$(GO) build -o $(BIN)/raid10-csi ./cmd/raid10-csi
	source hack/tool-env.sh && RAID10_SCALE_STEPS=$(STEPS) RAID10_SCALE_VOLUMES=$(or $(VOLUMES),200) \
	  RAID10_SCALE_WORKERS=$(or $(WORKERS),16) RAID10_SCALE_IDLE=$(or $(IDLE),60s) RAID10_SCALE_PLUGIN=$(abspath $(BIN)/raid10-csi) \
	  RAID10_SCALE_TABLE=$(abspath $(or $(TABLE),_output/scale.md)) RAID10_SCALE_HOLD=$(HOLD) RAID10_SCALE_CLAIMS=$(CLAIMS) RAID10_SCALE_KCM_QPS=$(KCM_QPS) \
	  RAID10_SCALE_SCHED_PCT=$(SCHED_PCT) RAID10_SCALE_SCHEDULER=$(if $(SCHEDULER),$(abspath $(SCHEDULER))) $(if $(PROFILE),RAID10_SCALE_PROFILE=$(abspath $(PROFILE))) \
	  $(GO) test -count=1 -timeout 0 -run '^TestScaleBench$$' -v ./test/scale/

.PHONY: node-scale
node-scale: deps ## One VM node holding VOLUMES volumes at once (default 256; staged ext4, published), ROUNDS rounds (default 2) of create, stage, publish, delete: fds, goroutines, memory per volume, nothing leaked, no request stalled; KERNEL series (default 6.12); profiles in _output/node-scale (~15 min).
	source hack/tool-env.sh && RAID10_NODE_VOLUMES=$(or $(VOLUMES),256) RAID10_NODE_ROUNDS=$(or $(ROUNDS),2) RAID10_NODE_KERNEL=$(KERNEL) \
	  $(GO) test -count=1 -timeout 50m -run '^TestNodeManyVM$$' -v ./pkg/driver/

.PHONY: soak
soak: ## Run the engine's fault matrix (on the synchronous calls, then with Queues), then the snapshot copy crash test, each with random seeds for SOAK (default 10m); RAID10_SEED=<seed> replays a round.
	set -o pipefail; RAID10_SOAK=$${SOAK:-10m} $(GO) test -race -count=1 -timeout 0 -run '^(TestFaultMatrix|TestFaultMatrixQueue|TestCopyCrash)$$' -v ./pkg/raid10/ 2>&1 | grep -v '^[IEW][0-9]'

.PHONY: soak-pool
soak-pool: ## Run the pool's fault matrix with random seeds for SOAK (default 10m); POOL_MATRIX_SEED=<seed> replays a walk.
	set -o pipefail; POOL_MATRIX_SOAK=$${SOAK:-10m} $(GO) test -race -count=1 -timeout 0 -run '^TestPoolMatrix$$' -v ./pkg/pool/ 2>&1 | grep -v '^[IEW][0-9]'

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	@for t in "FuzzRequests ./pkg/nbd" "FuzzNegotiation ./pkg/nbd" "FuzzSuperblock ./pkg/raid10" "FuzzBitmapBlock ./pkg/raid10" "FuzzDecodeLabel ./pkg/pool"; do \
	  set -- $$t; echo "== $$1 ($$2)"; \
	  $(GO) test -run '^$$' -fuzz "^$$1$$" -fuzztime $${FUZZTIME:-30s} -fuzzminimizetime 10x $$2 || exit 1; \
	done

# lint runs with cgo off and -trimpath: the export data it compiles are then those of every
# other non-race build of a run (the plugin image, the guest test binaries; test/vm's
# GoCommand), so a cold run compiles each package once for all of them (issue 24).
.PHONY: lint
lint: ## Run golangci-lint (v2, explicit linter list, govet among them), installed from its Go module.
	test -x $(CACHE)/golangci-lint-$(GOLANGCI_VERSION)/golangci-lint || \
	  GOBIN=$(CACHE)/golangci-lint-$(GOLANGCI_VERSION) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)
	CGO_ENABLED=0 GOFLAGS="$$($(GO) env GOFLAGS) -trimpath" $(CACHE)/golangci-lint-$(GOLANGCI_VERSION)/golangci-lint run ./...

.PHONY: verify
verify: ## Check formatting, go.mod tidiness and that generated files are current (vet runs in make lint).
	@test -z "$$(gofmt -l cmd pkg test hack internal 2>/dev/null)" || { gofmt -l cmd pkg test hack internal; echo "gofmt needed"; exit 1; }
	$(GO) mod tidy -diff
	bash hack/verify-generated.sh

.PHONY: vet
vet: ## go vet alone (make lint runs the same analyzers through golangci-lint's govet; CI runs only that).
	$(GO) vet ./...

.PHONY: ci-cold
ci-cold: ## Time a cold CI run on this machine: .ci/run in a clean clone with empty caches (a HOME of its own; DIR, default ~/raid10-ci-cold, not under /tmp). Needs a quiet machine, ~1 h.
	bash hack/ci-cold.sh $(DIR)

.PHONY: generate
generate: ## Regenerate deepcopy, CRDs (controller-gen) and deploy/ (helm template).
	bash hack/update-codegen.sh
	bash hack/render-deploy.sh

.PHONY: demo
demo: ## The main job on the embedded default: 4 file-backed disks, one RAID10 volume over NBD, fail and rebuild a disk.
	bash hack/demo.sh

.PHONY: clean
clean: ## Remove build outputs (the tool cache in ~/.cache/raid10-csi is kept).
	rm -rf $(BIN)

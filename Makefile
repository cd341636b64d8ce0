# vrdma: build chain, tests and demo.
#
#   make demo    install and build whatever is missing, boot two guests, run the main job
#   make test    install and build whatever is missing, run every test (PYTEST_ARGS=... goes to pytest)
#   make bench   benchmarks, written to build/bench/results.json
#
# Every step is idempotent: products are cached under $(VRDMA_CACHE), keyed by their inputs, and a step whose
# product is cached finishes in seconds. See docs/build-chain.md.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
# The build cache survives fresh clones (a CI clone reuses what a previous build made on the same machine).
VRDMA_CACHE ?= $(or $(HOME),$(shell getent passwd "$$(id -u)" | cut -d: -f6))/.cache/vrdma
export VRDMA_CACHE
VENV := .venv
VRDMA := $(VENV)/bin/vrdma
PYTEST_ARGS ?=
# Options of `make fuzz` (python -m fuzz.run --help), e.g. FUZZ_ARGS="--only engine --inputs 5000000".
FUZZ_ARGS ?=
# Driver reload cycles `make fuzz` runs in a guest after the fuzzers.
RELOAD_CYCLES ?= 1000
# Each phase reports how long it took: $(call timed,NAME) COMMAND
timed = TIMEFORMAT='[make] $(1): %1R s'; time

# Debian packages the host needs: QEMU's build dependencies (the subset our configure uses), the kernel
# module toolchain, the image tools, the firmware QEMU loads at run time (-L /usr/share/qemu, seabios), and
# clang with libFuzzer and the sanitizer runtimes (llvm-symbolizer for their reports) for the fuzzers, iproute2
# for the harness's hosts (network namespaces) and iperf3 for the bench's UDP reference between them, and
# systemd for systemd-analyze, which checks the backend's unit (the host need not run systemd as its init),
# libvirt-clients and libxml2-utils (xmllint) for virt-xml-validate, which checks packaging/libvirt's domain,
# libvirt-daemon and its QEMU driver, whose libvirtd boots such a domain (tests/vm/test_vm_libvirt.py; only in a
# mount namespace of the test's: the host's libvirt state stays untouched and no service is enabled), lintian
# for the packages (debhelper and the rest of their tools are in each release's build root, not on the host), and
# e2fsprogs for the full Debian guest's disk (mke2fs -d).
APT_PACKAGES := ca-certificates debian-archive-keyring dpkg-dev patch make gcc-12 libc6-dev systemd libvirt-clients libxml2-utils \
	libvirt-daemon libvirt-daemon-driver-qemu \
	ninja-build pkgconf flex bison libglib2.0-dev libpixman-1-dev zlib1g-dev libfdt-dev \
	mmdebstrap cpio kmod busybox-static seabios qemu-system-data \
	cmake libnl-3-dev libnl-route-3-dev \
	clang-14 libclang-rt-14-dev llvm-14 iproute2 iperf3 lintian e2fsprogs

.PHONY: all deps apt-deps venv qemu kernel driver provider image backend bench demo test lint fuzz clean distclean \
	packages debian-guest test-debian-guest

all: image qemu backend

deps: apt-deps venv

apt-deps:
	@$(call timed,apt-deps) { \
	  missing=$$(dpkg-query -W -f='$${Package} $${db:Status-Status}\n' $(APT_PACKAGES) 2>/dev/null \
	             | awk '$$2 != "installed" {print $$1}'; \
	             for p in $(APT_PACKAGES); do dpkg-query -W $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "[make] installing Debian packages:" $$missing; \
	    apt-get update -q; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else echo "[make] Debian packages: all $(words $(APT_PACKAGES)) present"; fi; }

# The virtual environment is rebuilt when pyproject.toml changes (the stamp carries its hash).
VENV_STAMP = $(VENV)/.stamp-$(shell sha256sum pyproject.toml | cut -c1-16)
venv: $(VENV_STAMP)
$(VENV_STAMP): pyproject.toml
	@$(call timed,venv) { \
	  echo "[make] creating $(VENV) (vrdma and its Python dependencies)"; \
	  rm -rf $(VENV); $(PYTHON) -m venv $(VENV); \
	  $(VENV)/bin/pip install -q --disable-pip-version-check -e '.[test,bench]'; \
	  touch $@; }

qemu: deps
	@$(call timed,qemu) $(VRDMA) build qemu

# The guest kernels: GUEST_KERNELS=all (every one the tests boot: docs/build-chain.md), default (the one guests
# boot unless told otherwise; what `make demo` and `make bench` need), or one by name.
GUEST_KERNELS ?= all
demo bench: GUEST_KERNELS = default

kernel: deps
	@$(call timed,kernel) $(VRDMA) build kernel --kernel $(GUEST_KERNELS)

# The guest driver, vrdma.ko, built against each guest kernel's headers; the image carries it.
driver: kernel
	@$(call timed,driver) $(VRDMA) build driver --kernel $(GUEST_KERNELS)

# libvrdma, the rdma-core provider, compiled inside the guest's rdma-core source tree; the image carries it.
provider: deps
	@$(call timed,provider) $(VRDMA) build provider

image: kernel driver provider
	@$(call timed,image) $(VRDMA) build image --kernel $(GUEST_KERNELS)

# The backend's cffi binding to libvhost-user, compiled from the QEMU source tree `make qemu` keeps.
backend: qemu
	@$(call timed,backend) $(VENV)/bin/python -m vrdma.vhost_user._build && $(VENV)/bin/python backend/vrdma/engine/_build.py \
	  && $(VENV)/bin/python backend/vrdma/faultguard/_build.py && $(VENV)/bin/python backend/vrdma/testing/_loadgen_build.py

bench: image qemu backend
	@$(call timed,bench) $(VRDMA) bench

demo: image qemu backend
	@$(call timed,demo) $(VRDMA) demo

# Every fuzzer for its default budget (at least 1,000,000 inputs on each interface; several minutes): a table
# of inputs, rates, coverage and findings, also in build/fuzz/results.json. `make test` runs a smoke of each.
# Then RELOAD_CYCLES `rmmod vrdma; modprobe vrdma` cycles in a guest with objects open (make test runs 100).
fuzz: image qemu backend
	@$(call timed,fuzz) $(VENV)/bin/python -m fuzz.run $(FUZZ_ARGS)
	@$(call timed,reload-cycles) env VRDMA_RELOAD_CYCLES=$(RELOAD_CYCLES) $(VENV)/bin/python -m pytest -p no:cacheprovider \
		-q --log-cli-level=INFO tests/vm/test_vm_driver.py::test_driver_reload_cycles_with_objects_open_leak_nothing

test: image qemu backend lint
	@$(call timed,pytest) $(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The Debian packages (docs/packaging.md): vrdma-dkms and vrdma-backend for bookworm and trixie, libvrdma for trixie,
# each built with debhelper in a build root of its release and checked with lintian; copied to build/packages/.
packages: qemu provider
	@$(call timed,packages) $(VRDMA) build packages

# A full Debian trixie guest (systemd, apt, Debian's kernel and headers) for the packages to be installed in.
debian-guest: deps
	@$(call timed,debian-guest) $(VRDMA) build debian-guest

# The slow tier CI runs after `make test`: the packages installed with apt in two full Debian guests, DKMS, a
# reboot, RDMA programs between them, and the backend's service under systemd (tests/vm/test_vm_debian_guest.py).
test-debian-guest: packages debian-guest image qemu backend
	@$(call timed,pytest-debian-guest) $(VENV)/bin/python -m pytest -m debian_guest $(PYTEST_ARGS)

# ruff, mypy, import-linter's contracts, and the project's own rules (python -m vrdma.lint: files of at most 650
# lines, no opcode literal outside the wire opcode table, the engine's C layers; it compiles the engine's files).
lint: deps
	@$(call timed,lint) { $(VENV)/bin/ruff check backend tests fuzz setup.py && $(VENV)/bin/mypy && \
	  $(VENV)/bin/lint-imports --no-cache && $(VENV)/bin/python -m vrdma.lint; }

clean:
	rm -rf build

distclean: clean
	rm -rf $(VENV)
	@echo "the build cache is kept: rm -rf $(VRDMA_CACHE) to empty it"

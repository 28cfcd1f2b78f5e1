# Attune: build, package, test, benchmark. `make help` lists the targets.
PREFIX  ?= $(CURDIR)/build
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
CARGO   ?= cargo
REL     := target/release

.PHONY: all build stage install test test-rust test-native test-python bench setup help clean

all: build

help:
	@echo "make build    build libattune (.so/.a), the attune CLI, and stage them in build/"
	@echo "make install  PREFIX=/usr/local: install library, header, pkg-config and CMake files"
	@echo "make test     set up and run every test (Rust, C/C++/Fortran/CMake, Python)"
	@echo "make bench    set up and run the main job: attune bench (runtime scenarios, then IMME's evaluation)"

setup:
	@scripts/setup.sh

build:
	$(CARGO) build --release --workspace
	@$(MAKE) --no-print-directory stage PREFIX=$(CURDIR)/build

# Lays out a prefix: lib/, include/, bin/, lib/pkgconfig, lib/cmake/Attune.
stage:
	@mkdir -p $(PREFIX)/lib/pkgconfig $(PREFIX)/lib/cmake/Attune $(PREFIX)/include $(PREFIX)/bin
	@cp --remove-destination $(REL)/libattune.so $(REL)/libattune.a $(REL)/libattune_preload.so $(PREFIX)/lib/
	@cp include/attune.h include/attune.f90 $(PREFIX)/include/
	@cp --remove-destination $(REL)/attune $(REL)/attune-lab $(REL)/attuned $(PREFIX)/bin/
	@mkdir -p $(PREFIX)/share/attune/python && cp -r python/attune_usage $(PREFIX)/share/attune/python/
	@cp python/attune_plots.py $(PREFIX)/share/attune/python/
	@mkdir -p $(PREFIX)/share/attune/bench && cp -r bench/imme.py bench/fig7.py bench/workloads $(PREFIX)/share/attune/bench/
	@rm -rf $(PREFIX)/share/attune/python/attune_usage/__pycache__
	@sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' packaging/attune.pc.in > $(PREFIX)/lib/pkgconfig/attune.pc
	@sed -e 's|@VERSION@|$(VERSION)|' packaging/AttuneConfig.cmake.in > $(PREFIX)/lib/cmake/Attune/AttuneConfig.cmake
	@sed -e 's|@VERSION@|$(VERSION)|' packaging/AttuneConfigVersion.cmake.in > $(PREFIX)/lib/cmake/Attune/AttuneConfigVersion.cmake
	@# The SPANK plugin, where Slurm's header is installed (libslurm-dev; no -lslurm: slurmd provides the symbols).
	@if [ -e /usr/include/slurm/spank.h ]; then mkdir -p $(PREFIX)/lib/slurm && \
	  $(CC) -O2 -g -Wall -Wextra -Werror -fPIC -shared -DATTUNE_PRELOAD_DEFAULT='"$(PREFIX)/lib/libattune_preload.so"' \
	    -DATTUNE_CLI_DEFAULT='"$(PREFIX)/bin/attune"' \
	    slurm/spank_attune.c -o $(PREFIX)/lib/slurm/spank_attune.so; fi

install: build
	@$(MAKE) --no-print-directory stage PREFIX=$(PREFIX)

test: setup build
	@scripts/test.sh

bench: setup build
	./build/bin/attune bench

clean:
	$(CARGO) clean
	rm -rf build

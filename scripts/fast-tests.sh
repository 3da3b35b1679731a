#!/usr/bin/env bash
# The fast tier, for people changing code: the unit tests and the `offline` test binary
# (tests/offline), the integration tests that start no VM (the CLI contract, the bad-spec corpus,
# libvirt judging the XML fixtures and KubeVirt's examples, KubeVirt's protos and api.Domain JSON).
# Under 30 s once built (16 s here). It needs scripts/setup.sh to have run once (libvirtd and
# virt-xml-validate judge the XML), and root, as every test here does. scripts/test.sh runs all of
# these and every end-to-end test; CI runs that.
# Extra arguments go to cargo test (e.g. a test name filter after `--`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/module-cycles.py
scripts/function-lengths.py
exec cargo test --locked --lib --test offline "$@"

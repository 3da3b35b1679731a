#!/usr/bin/env python3
"""A quiet A/B of `vmlauncher run` to phase Running, for changes to the start that the bench's
start row (seven samples a side, raw libvirt between) cannot resolve (docs/performance.md).

    scripts/start-ab.py ROUNDS SPEC BINARY...

Each round starts SPEC once with each BINARY, the order swapped every round, from the spawn
until "phase Running" arrives on the launcher's stdout, then `kill`s it and waits for its exit.
Every start uses the same capability cache (/tmp/start-ab-caps, filled by the first), so all but
the first are warm. Prints each binary's median, p10, p90 and minimum. Run as root, after
scripts/setup.sh; the SPEC's guest must not need a node daemon (the test guest's VMI does).
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

RUNTIME_DIR = "/tmp/start-ab-run"
CAPS = "/tmp/start-ab-caps"


def one_start(binary, spec):
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)
    started = time.monotonic()
    vm = subprocess.Popen(
        [binary, "run", spec, "--runtime-dir", RUNTIME_DIR, "--qemu-cache-dir", CAPS,
         "--emulation", "tcg"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    took = None
    for line in vm.stdout:
        if "phase Running" in line:
            took = (time.monotonic() - started) * 1000
            break
    subprocess.run([binary, "kill", "--socket", RUNTIME_DIR + "/launcher.sock"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    vm.stdout.read()
    vm.wait()
    if took is None:
        sys.exit(f"{binary} ended without reaching phase Running")
    return took


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, spec, binaries = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    os.makedirs(CAPS, exist_ok=True)
    one_start(binaries[0], spec)  # fills the capability cache: not counted
    times = {b: [] for b in binaries}
    for i in range(rounds):
        for binary in binaries if i % 2 == 0 else binaries[::-1]:
            times[binary].append(one_start(binary, spec))
    for binary, samples in times.items():
        s = sorted(samples)
        print(f"{binary}: n={len(s)} median {statistics.median(s):.1f} ms, "
              f"p10 {s[len(s) // 10]:.1f}, p90 {s[(9 * len(s)) // 10]:.1f}, min {s[0]:.1f}")


if __name__ == "__main__":
    main()

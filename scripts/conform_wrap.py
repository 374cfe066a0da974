"""pypjrt's PJRT conformance harness against XLA's CPU plugin alone and against
libpeerless_pjrt.so wrapping it (PEERLESS_XLA_PLUGIN): the wrapper must have no FAIL and at
least as many passes as the plugin it wraps. Prints both tallies; exits 1 otherwise.
    python scripts/conform_wrap.py path/to/libpeerless_pjrt.so
"""

import collections
import json
import os
import subprocess
import sys
import tempfile

import lammps_jax_pjrt_cpu as inner


def tally(plugin, env):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        p = subprocess.run([sys.executable, "-m", "pypjrt.conform", plugin, "--json", out.name],
                           env=env, capture_output=True, text=True, timeout=900)
        try:
            checks = json.load(open(out.name))["checks"]
        except (OSError, ValueError, KeyError):
            sys.exit(f"pypjrt.conform {plugin} wrote no report (rc {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    c = collections.Counter(x["result"] for x in checks)
    bad = [x for x in checks if x["result"].lower() == "fail"]
    return c, bad


env = dict(os.environ)
env.pop("PEERLESS_XLA_PLUGIN", None)
base, _ = tally(str(inner.PLUGIN_PATH), env)
env["PEERLESS_XLA_PLUGIN"] = str(inner.PLUGIN_PATH)
wrapped, fails = tally(sys.argv[1], env)
print(f"XLA's CPU plugin alone : {dict(base)}")
print(f"libpeerless_pjrt.so    : {dict(wrapped)}")
for x in fails:
    print(f"  FAIL {x['id']}: {x.get('detail', '')}")
if fails or wrapped["pass"] < base["pass"]:
    sys.exit("the wrapper is less conformant than the plugin it wraps")

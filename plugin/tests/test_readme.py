"""The README's first page holds: its example runs as pasted, and it stays short and plain.

- The first ```python block of README.md runs in a fresh interpreter, as a newcomer would run
  it: no JAX_PLATFORMS, XLA_FLAGS or Peerless settings inherited (the example sets what it
  needs), an empty Peerless cache directory (so the shipped tuning profile decides, as on a
  fresh machine), outside the checkout. It must exit 0, and what it prints must match the
  README's sample output (the ```text block after it; `…` stands for any text).
- README.md has fewer than 1,000 words and none of the project's internal vocabulary.

Run (from the repository root):
    PEERLESS_PJRT_LIBRARY=$PWD/target/debug/libpeerless_pjrt.so PYTHONPATH=plugin/python \
      python3 -m pytest -q plugin/tests/test_readme.py
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PACKAGE_ROOT = REPO / "plugin" / "python"
# Settings the example must not inherit: it sets what it needs itself.
NOT_INHERITED = ("JAX_PLATFORMS", "XLA_FLAGS", "PEERLESS_ENABLE", "PEERLESS_FLAGS", "PEERLESS_TUNING_PROFILE",
                 "PEERLESS_XLA_PLUGIN", "PEERLESS_BACKEND")
FORBIDDEN = ("issue ", "session ", "the main job", "build machine")


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def _example() -> tuple[str, str | None]:
    """The first python block and the text block right after it (its sample output), if any."""
    blocks = _blocks(README.read_text(encoding="utf-8"))
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            return body, (after[1] if after and after[0] == "text" else None)
    pytest.fail("README.md has no ```python block")


def _line_pattern(line: str) -> re.Pattern:
    """A sample output line as a pattern: literal text, `…` matching anything."""
    return re.compile("^" + ".*".join(re.escape(part) for part in line.rstrip().split("…")) + "$")


def test_readme_example_runs(tmp_path):
    code, sample = _example()
    lib = os.environ.get("PEERLESS_PJRT_LIBRARY")
    bundled = PACKAGE_ROOT / "jax_plugins" / "peerless" / "libpeerless_pjrt.so"
    if not lib and not bundled.is_file():
        pytest.skip("no libpeerless_pjrt.so: set PEERLESS_PJRT_LIBRARY (cargo build -p peerless-pjrt)")
    script = tmp_path / "try_peerless.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    cache = tmp_path / "cache"
    cache.mkdir()
    env["PEERLESS_CACHE_DIR"] = str(cache)
    if lib:
        env["PEERLESS_PJRT_LIBRARY"] = lib
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    if sample is not None:
        got = proc.stdout.splitlines()
        want = [line for line in sample.splitlines() if line.strip()]
        assert len(got) == len(want), f"README's sample output has {len(want)} lines, the example printed:\n{proc.stdout}"
        for g, w in zip(got, want):
            assert _line_pattern(w).match(g), f"printed\n  {g}\nwhere README.md shows\n  {w}"


def test_readme_is_short_and_plain():
    text = README.read_text(encoding="utf-8")
    words = len(text.split())
    assert words < 1000, f"README.md has {words} words (fewer than 1,000 wanted)"
    lower = text.lower()
    found = [p for p in FORBIDDEN if p in lower]
    assert not found, f"README.md uses internal vocabulary: {found}"

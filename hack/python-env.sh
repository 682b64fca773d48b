#!/usr/bin/env bash
# Creates (once) the Python environment that tests, lint and the local pipeline use,
# from the pinned lock file, and prints its path. Cached outside the repo, keyed by
# the lock file's hash, so a changed pin builds a new environment.
#
# vLLM's CPU build pins torch==2.13.0+cpu, which PyPI does not serve; the lock
# holds PyPI's torch==2.13.0 (it runs on CPU) and every other package, and is
# installed with --no-deps so pip does not try to resolve that pin.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${EAGLE3_CACHE:-$HOME/.cache/eagle3-operator}
lock=$root/requirements/lock.txt
key=$(cat "$lock" | sha256sum | cut -c1-12)
venv=$cache/venv-$key
export PIP_CACHE_DIR=$cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ ! -f $venv/.complete ]]; then
  echo "creating Python environment $venv (first run downloads about 5 GB; later runs reuse it)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  # A current pip, so the editable install below works with setuptools' own bdist_wheel.
  "$venv/bin/pip" install -q pip==25.3 >&2
  # Download into a wheelhouse first: the package index here answers uncacheable, so pip's own
  # HTTP cache stays empty; with the wheelhouse a changed pin downloads only what changed.
  "$venv/bin/pip" download -q --no-deps -r "$lock" -d "$cache/wheelhouse" >&2
  "$venv/bin/pip" install -q --no-deps --no-index --find-links "$cache/wheelhouse" -r "$lock" >&2
  touch "$venv/.complete"
fi
# The project itself, editable, so the checkout under test is what runs.
if [[ $("$venv/bin/pip" --version | cut -d' ' -f2) != 25.3 ]]; then "$venv/bin/pip" install -q pip==25.3 >&2; fi
# -P: not from the current directory, where a checkout's packages would import without the install.
if ! "$venv/bin/python" -P -c 'import eagle3_api, eagle3_runtime, eagle3_operator, sys; sys.exit(0 if eagle3_runtime.__file__.startswith(sys.argv[1]) else 1)' "$root" 2>/dev/null; then
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root" >&2
fi
echo "$venv"

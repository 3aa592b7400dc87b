#!/usr/bin/env sh
# Prints the Python interpreter to build a virtualenv with.
#   find_python.sh main  -> the newest of 3.12 / 3.13 / python3 (jax >= 0.11 needs 3.12; 3.11 still works
#                           with jax 0.10.2)
#   find_python.sh ref   -> Python 3.11 for the test-only PyTorch reference environment: the CPU build of
#                           torch==2.13.0 available offline on our machines is a cp311 wheel.
want=${1:-main}
root=$(pyenv root 2>/dev/null)
if [ "$want" = ref ]; then
  cands="python3.11 $root/versions/3.11*/bin/python3.11 python3"
else
  cands="python3.12 $root/versions/3.12*/bin/python3.12 python3.13 $root/versions/3.13*/bin/python3.13 python3"
fi
for c in $cands; do
  if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
    echo "$c"; exit 0
  fi
done
echo "no Python >= 3.11 found" >&2; exit 1

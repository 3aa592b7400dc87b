#!/usr/bin/env bash
# A new user's walk through the README, outside the checkout: a fresh virtualenv, a non-editable install
# from the repository's Git URL, then the README's commands and Python blocks verbatim, in order, with those
# of the pages its quickstart hands over to (docs/usage.md: the policy; docs/interop.md: gymnax and brax),
# each with its output, exit status and wall-clock seconds. Writes the log to OUT/walkthrough.log.
#   bash tools/walkthrough.sh OUT [REPO_URL]     (REPO_URL default: file://<this checkout>)
# The bench line of the README (the whole quick protocol, about an hour on 2 cores) is not run here.
set -uo pipefail
OUT=$(realpath -m "${1:?usage: walkthrough.sh OUT [REPO_URL]}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
URL=${2:-file://$REPO}
PY=$(sh "$REPO/tools/find_python.sh" main)
mkdir -p "$OUT/work"
LOG=$OUT/walkthrough.log
: > "$LOG"
export IMAGINEJAX_HOME=$OUT/home PIP_DISABLE_PIP_VERSION_CHECK=1

step() {  # step 'shown command' command...: runs it in OUT/work, logs the command, its output and status
  local shown=$1; shift
  local start=$SECONDS
  printf '\n$ %s\n' "$shown" >> "$LOG"
  (cd "$OUT/work" && "$@") >> "$LOG" 2>&1
  local status=$?
  printf '[exit status %d, %d s]\n' "$status" "$((SECONDS - start))" >> "$LOG"
  echo "$(date +%T) exit $status $((SECONDS - start))s: $shown"
}

block() {  # block 'first line' 'python text': a README Python block, run by the venv's python
  step "python  # README block: $1" "$OUT/venv/bin/python" -c "$2"
}

readme_block() {  # the text of the one Python block containing $1 in the README or the docs pages it hands over to
  "$PY" - "$1" "$REPO/README.md" "$REPO/docs/usage.md" "$REPO/docs/interop.md" <<'EOF'
import re, sys
text = "".join(open(path, encoding="utf-8").read() for path in sys.argv[2:])
[block] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if sys.argv[1] in b]
print(block)
EOF
}

{ echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $($PY --version)"
  echo "# repository $URL at $(git -C "$REPO" rev-parse --short HEAD)"; } >> "$LOG"
step "$PY -m venv venv" "$PY" -m venv "$OUT/venv"
export PATH=$OUT/venv/bin:$PATH
# Python 3.12.1's bundled pip (23.2) refuses "name @ git+file:///path" ("It looks like a path"); any
# current pip takes it. A fresh venv's first step anyway:
step "pip install --upgrade pip" pip install --quiet --upgrade pip
step "pip install \"imaginejax[interop,figures] @ git+<repository URL>\"" \
  pip install --quiet "imaginejax[interop,figures] @ git+$URL"
step "imaginejax setup-weights" imaginejax setup-weights
step "imaginejax setup-weights --check" imaginejax setup-weights --check
block "import gymnasium" "$(readme_block 'import gymnasium')"
step "imaginejax collect --env clevr --level train --episodes 1000 --out data/clevr-train" \
  imaginejax collect --env clevr --level train --episodes 1000 --out data/clevr-train
step "imaginejax imagine --preset clevr-quick --real data/clevr-train --out ws/imagine" \
  imaginejax imagine --preset clevr-quick --real data/clevr-train --out ws/imagine
block "from imaginejax import fit" "$(readme_block 'from imaginejax import fit')"
step "imaginejax export ws/fit --algo bc --seed 0 --data imaginary/easy --out policy/" \
  imaginejax export ws/fit --algo bc --seed 0 --data imaginary/easy --out policy/
step "imaginejax evaluate policy/ --env clevr --level hard --episodes 200" \
  imaginejax evaluate policy/ --env clevr --level hard --episodes 200
block "from imaginejax import Policy" "$(readme_block 'Policy.load')"
step "imaginejax evaluate policy/ --level train --seed 4 --frames frames/" \
  imaginejax evaluate policy/ --level train --seed 4 --frames frames/
step "pip install \"imaginejax[gymnax,brax] @ git+<repository URL>\" && pip install --no-deps gymnax==1.0.1" \
  bash -c "pip install --quiet 'imaginejax[gymnax,brax] @ git+$URL' && pip install --quiet --no-deps gymnax==1.0.1"
block "import jax; from brax..." "$(readme_block 'as_gymnax, as_brax')"
step "imaginejax train --preset clevr-quick --algo cql --set train.algo.cql.sweep.alpha=[1,5,10]" \
  imaginejax train --preset clevr-quick --algo cql --set "train.algo.cql.sweep.alpha=[1,5,10]"
step "imaginejax report \$IMAGINEJAX_HOME/train/clevr-quick" imaginejax report "$IMAGINEJAX_HOME/train/clevr-quick"
echo "log: $LOG"

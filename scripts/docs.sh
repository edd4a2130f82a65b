#!/usr/bin/env bash
# The docs, offline: README.md from nbs/index.ipynb, and the site (_docs/site/index.html) from every notebook's
# stored outputs, processed by nbdev and built by Sphinx with myst-nb (nothing is executed: `make notebooks` does that).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
jupyter nbconvert --log-level WARN --to markdown --TagRemovePreprocessor.remove_input_tags="remove_input" nbs/index.ipynb --output-dir . --output README
# the README sits at the top of the repository: its links and images point into nbs/; one blank line where inputs were
sed -E 's#\]\((images/|[0-9a-z_.]+\.ipynb)#](nbs/\1#g' README.md | cat -s > README.tmp && mv README.tmp README.md
python -c 'from codellm_nb.docs import build_site; print(f"site: {build_site()}")'
echo "README.md and the site written in $((SECONDS-start)) s; open _docs/site/index.html"

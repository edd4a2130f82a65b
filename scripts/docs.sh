#!/usr/bin/env bash
# Docs without Quarto: README.md from nbs/index.ipynb, and an HTML page per notebook in _docs/.
# (With Quarto installed, `nbdev_docs` builds the full site from _quarto.yml instead.)
set -euo pipefail
cd "$(dirname "$0")/.."
jupyter nbconvert --log-level WARN --to markdown --TagRemovePreprocessor.remove_input_tags="remove_input" nbs/index.ipynb --output-dir . --output README
cat -s README.md > README.tmp && mv README.tmp README.md  # one blank line where hidden inputs were
mkdir -p _docs
for nb in nbs/[0-9]*.ipynb nbs/index.ipynb; do
  jupyter nbconvert --log-level WARN --to html "$nb" --output-dir _docs
done
echo "README.md and _docs/*.html written"

#!/usr/bin/env bash
# Build the documentation site into site/ with `mkdocs build --strict` (see docs/README.md).
#
#   bash scripts/build_docs.sh            # fast mode: the notebooks run with SMNNGP_FAST=1 (what CI builds)
#   bash scripts/build_docs.sh --full     # full mode: the notebooks at their full settings (a release build)
#
# Any other argument is passed to `mkdocs build` (e.g. --site-dir DIR). Needs `pip install -e ".[docs]"` in the
# active environment. The notebooks read data sets from $SMNNGP_DATA_DIR; when it is unset and ../shared/data
# exists beside the checkout (the CI layout), that folder is used. $SMNNGP_DOCS_JOBS notebooks run side by side
# (default: the number of CPUs).
set -euo pipefail

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

mode=fast
args=()
for arg in "$@"; do
    case "$arg" in
        --full) mode=full ;;
        -h|--help) usage; exit 0 ;;
        *) args+=("$arg") ;;
    esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ $mode == fast ]]; then
    export SMNNGP_FAST=1
else
    export SMNNGP_FAST=0
fi
if [[ -z "${SMNNGP_DATA_DIR:-}" && -d "$root/../shared/data" ]]; then
    SMNNGP_DATA_DIR="$(cd "$root/../shared/data" && pwd)"
    export SMNNGP_DATA_DIR
fi
export NO_MKDOCS_2_WARNING=1   # mkdocs-material's banner about its successor, printed on every build

start=$SECONDS
python -m mkdocs build --strict --clean ${args[@]+"${args[@]}"}
echo "docs: site built in $mode mode in $((SECONDS - start)) s (SMNNGP_DATA_DIR=${SMNNGP_DATA_DIR:-unset})"

#!/usr/bin/env bash
# Installs the pinned, unmodified official `openai` npm client (tests/server/client/package.json
# and its package-lock.json) into DEST/node_modules with `npm ci`, for the server tests.
# Usage: tests/server/setup-client.sh DEST     (needs node and npm; npm's registry or its cache)
set -euo pipefail
DEST=${1:?usage: setup-client.sh DEST}
SRC=$(cd "$(dirname "$0")/client" && pwd)
command -v node > /dev/null || { echo "setup-client: node is not installed (packaging/install-deps.sh)" >&2; exit 1; }
command -v npm > /dev/null || { echo "setup-client: npm is not installed (packaging/install-deps.sh)" >&2; exit 1; }
mkdir -p "$DEST"
want=$(node -e "console.log(require('$SRC/package.json').dependencies.openai)")
have=$(node -e "try{console.log(require('$DEST/node_modules/openai/package.json').version)}catch(e){}" 2>/dev/null || true)
if [ "$have" = "$want" ] && cmp -s "$SRC/package-lock.json" "$DEST/package-lock.json"; then
  echo "setup-client: openai $have already installed in $DEST"
  exit 0
fi
cp "$SRC/package.json" "$SRC/package-lock.json" "$DEST/"
cd "$DEST"
npm ci --no-audit --no-fund --loglevel=error
echo "setup-client: openai $(node -e "console.log(require('./node_modules/openai/package.json').version)") installed in $DEST"

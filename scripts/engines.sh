#!/usr/bin/env bash
# The engine matrix: build Redis 7.2.6 and Valkey 8.0.1 once into a cache folder outside
# the clone, then run the scripts' and the doctor's tests against each (the tests start
# the server named by CONVEYOR_REDIS_SERVER). Not part of CI: a build takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCES=${CONVEYOR_ENGINE_SOURCES:-../shared/engines}
CACHE=${CONVEYOR_ENGINES_CACHE:-$HOME/.cache/conveyor-engines}
PYTEST=${PYTEST:-.venv/bin/pytest}
mkdir -p "$CACHE"

build() {  # build NAME BINARY: untar NAME.tar.gz and make it, unless its binary exists
  local name=$1 binary=$2
  if [ ! -x "$CACHE/$name/src/$binary" ]; then
    tar xzf "$SOURCES/$name.tar.gz" -C "$CACHE"
    make -C "$CACHE/$name" -j2 >"$CACHE/$name.build.log" 2>&1 \
      || { echo "building $name failed: see $CACHE/$name.build.log" >&2; exit 1; }
  fi
  echo "$CACHE/$name/src/$binary"
}

status=0
for engine in redis-7.2.6:redis-server valkey-8.0.1:valkey-server; do
  server=$(build "${engine%%:*}" "${engine##*:}")
  echo "== ${engine%%:*}: $("$server" --version)"
  CONVEYOR_REDIS_SERVER=$server "$PYTEST" -q tests/test_scripts.py \
    tests/test_doctor.py || status=1
done
exit $status

#!/usr/bin/env bash
# The engine matrix (`make engine-matrix`, run by .ci/run): build Redis 7.2.6 and Valkey
# 8.0.1 once into a cache folder outside the clone, then run against each the core of the
# test suite (the scripts alone, producers, workers, workflows, the argument limit and the
# doctor) and `conveyor chaos --profile ci --topology plain`. Debian's Redis 7.0 runs the
# whole suite and both chaos phases elsewhere in CI. The tests and the chaos run start the
# server binary named by CONVEYOR_REDIS_SERVER.
#
# The source archives are looked for in $CONVEYOR_ENGINE_SOURCES when set, else in
# ../shared/engines (beside the clone) and /work/shared/engines. With none found, one loud
# line says the matrix was skipped and why, and the script exits 0: a machine without the
# archives cannot run it, and that must show in the log rather than pass in silence.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${CONVEYOR_ENGINES_CACHE:-$HOME/.cache/conveyor-engines}
PYTEST=${PYTEST:-.venv/bin/pytest}
CONVEYOR=${CONVEYOR:-.venv/bin/conveyor}
ENGINES="redis-7.2.6:redis-server valkey-8.0.1:valkey-server"
# The core: each script through its wrapper, what enqueue stores, workers end to end
# (leases, retries, hand-offs, cancel), workflows, the 3,999-argument limit (also through
# a proxy that refuses longer commands), the doctor, the engine contract, each role's
# ACL rules (allowed and refused), encrypted tasks. About a minute
# an engine on two cores.
CORE_TESTS="tests/test_scripts.py tests/test_flow_scripts.py tests/test_wait_scripts.py
  tests/test_records_and_tokens.py tests/test_api.py tests/test_scheduling.py
  tests/test_batches.py tests/test_retry_policy.py tests/test_worker_runs.py
  tests/test_running_jobs.py tests/test_handoff.py tests/test_workflow.py
  tests/test_argument_limit.py tests/test_argument_limit_proxy.py tests/test_doctor.py
  tests/test_engines.py tests/test_acl.py tests/test_encryption.py"

sources=""
for folder in ${CONVEYOR_ENGINE_SOURCES:-../shared/engines /work/shared/engines}; do
  if ls "$folder"/*.tar.gz >/dev/null 2>&1; then sources=$folder; break; fi
done
if [ -z "$sources" ]; then
  echo "!!! ENGINE MATRIX SKIPPED: no engine source archives (redis-7.2.6.tar.gz," \
       "valkey-8.0.1.tar.gz) in ${CONVEYOR_ENGINE_SOURCES:-../shared/engines or" \
       "/work/shared/engines}; Redis 7.2 and Valkey 8.0 were NOT tested !!!"
  exit 0
fi
mkdir -p "$CACHE"

build() {  # build NAME BINARY: print the path of the binary, building it unless cached
  local name=$1 binary=$2
  local built="$CACHE/$name/src/$binary"
  if [ ! -x "$built" ]; then
    local started=$SECONDS work
    # Built in a scratch folder and moved into place whole: a build that was cut short
    # leaves no binary behind that a later run would take for a finished one.
    work=$(mktemp -d "$CACHE/.build-$name.XXXXXX")
    tar xzf "$sources/$name.tar.gz" -C "$work"
    make -C "$work/$name" -j2 >"$CACHE/$name.build.log" 2>&1 \
      || { echo "building $name failed: see $CACHE/$name.build.log" >&2; return 1; }
    rm -rf "${CACHE:?}/$name"
    mv "$work/$name" "$CACHE/$name"
    rm -rf "$work"
    echo "built $name in $((SECONDS - started)) s (cached in $CACHE)" >&2
  fi
  echo "$built"
}

status=0
summary=()
for engine in $ENGINES; do
  name=${engine%%:*}
  if [ ! -f "$sources/$name.tar.gz" ]; then
    echo "!!! ENGINE MATRIX: $name SKIPPED: no $sources/$name.tar.gz !!!"
    summary+=("$name: skipped (no archive)")
    continue
  fi
  # One build at a time in the cache, also across two CI runs on one machine.
  server=$(exec 9>"$CACHE/.lock"; flock 9; build "$name" "${engine##*:}") \
    || { status=1; summary+=("$name: build FAILED"); continue; }
  echo "== engine matrix: $name ($("$server" --version))"
  started=$SECONDS
  tests=passed
  # shellcheck disable=SC2086  # CORE_TESTS is a list of paths
  CONVEYOR_REDIS_SERVER=$server "$PYTEST" -q -p no:cacheprovider -n 2 --dist loadgroup \
    $CORE_TESTS || { tests=FAILED; status=1; }
  tests_took=$((SECONDS - started))
  started=$SECONDS
  chaos=held
  CONVEYOR_REDIS_SERVER=$server "$CONVEYOR" chaos --profile ci --topology plain --seed 1 \
    || { chaos=FAILED; status=1; }
  took=$((SECONDS - started))
  summary+=("$name: core tests $tests (${tests_took} s), chaos $chaos (${took} s)")
done
echo "== engine matrix:"
printf '   %s\n' "${summary[@]}"
exit $status

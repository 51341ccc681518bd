#!/usr/bin/env bash
# Install the system packages conveyor's tests need, when they are missing:
# redis-server (always) and Debian's chromium (browser tests), unless "redis" only is asked.
set -euo pipefail
want_browser=1
[ "${1:-}" = "redis" ] && want_browser=0

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
updated=0
apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "please install: $*" >&2
    return 1
  fi
  if [ "$updated" = 0 ]; then sudo_ apt-get update -qq; updated=1; fi
  DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq "$@" >/dev/null
}

command -v redis-server >/dev/null || apt_install redis-server
if [ "$want_browser" = 1 ] && ! [ -x /usr/bin/chromium ]; then
  apt_install chromium || echo "chromium not installed: browser tests will be skipped" >&2
fi
exit 0

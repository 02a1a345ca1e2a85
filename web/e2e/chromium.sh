#!/usr/bin/env bash
# Debian's Chromium for the web app's end-to-end tests (web/e2e): installed from the machine's Debian packages
# when it is not there yet (playwright-core drives it; a browser downloaded by a test tool is not used).
set -euo pipefail
bin=${CHROMIUM:-/usr/bin/chromium}
if [ -x "$bin" ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
	echo "web/e2e: Chromium is missing at $bin; install Debian's chromium package (apt-get install chromium)" >&2
	exit 1
fi
echo "web/e2e: installing Debian's chromium"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 ||
	{ apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
"$bin" --version

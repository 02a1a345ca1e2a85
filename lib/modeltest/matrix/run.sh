#!/usr/bin/env bash
# make test-matrix: the engine's and the HTTP suites (MATRIX_PKGS) over each adapter (MATRIX_PROVIDERS, through
# AGENT_TEST_PROVIDER: see matrix.go). Each package's test binary is built once (go test -c) and every provider
# runs from it, up to MATRIX_JOBS runs at once (default 4): the suites wait on timers and the offline model's
# word delays much more than they compute, so the runs overlap well on two cores. All eight at once were hardly
# faster (60-77 s against 83 s, under the load of other work) and starved the suites' timing-bound cases (a
# hand-over's claim lost): 4 keeps them fed.
#
# MATRIX_FLAGS (default -test.short) are passed to every run. -test.short leaves out the suites' dynalite
# variants (the same cases over the DynamoDB adapter: testing.Short): what they check is the store's, the same
# whichever adapter answers (the model sees the transcript, which both stores return alike: lib/storetest), and
# test-go and test-race run them over the default adapter. They were most of the matrix's time (the HTTP suite:
# 52 s with them, 9 s without, per provider) and, four providers at once, the part that timed out under load.
# MATRIX_FLAGS= runs them too.
#
# Each run's output is printed when it ends, whole when it failed; the exit status is 1 when any run failed.
#
#   MATRIX_PROVIDERS="anthropic bedrock-converse" MATRIX_PKGS="./lib/engine" lib/modeltest/matrix/run.sh
set -u
cd "$(dirname "$0")/../../.." || exit 1
go=${GO:-go}
read -r -a providers <<<"${MATRIX_PROVIDERS:-openai-responses anthropic anthropic-bedrock bedrock-converse}"
read -r -a pkgs <<<"${MATRIX_PKGS:-./lib/engine ./lib/httpapi}"
jobs=${MATRIX_JOBS:-4}
read -r -a flags <<<"${MATRIX_FLAGS--test.short}"

bin=$(mktemp -d "${TMPDIR:-/tmp}/agentloop-matrix.XXXXXX") || exit 1
trap 'rm -rf "$bin"' EXIT
start=$(date +%s)
# One binary per package, named after the package's directory (go test -c -o DIR/ would name two packages
# called alike the same).
for pkg in "${pkgs[@]}"; do
	"$go" test -c -o "$bin/$(basename "$pkg").test" "$pkg" || exit 1
done
echo "test-matrix: built ${#pkgs[@]} test binaries in $(($(date +%s) - start)) s; ${#providers[@]} providers × ${#pkgs[@]} packages, $jobs at once, flags: ${flags[*]}"

# run PROVIDER PKG: one suite over one adapter, in the package's directory as go test runs it.
run() {
	local p=$1 pkg=$2 log="$bin/$1.$(basename "$2").log" t0 rc
	t0=$(date +%s)
	(cd "$pkg" && AGENT_TEST_PROVIDER=$p "$bin/$(basename "$pkg").test" -test.count=1 -test.timeout=20m "${flags[@]}") >"$log" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		echo "ok      AGENT_TEST_PROVIDER=$p $pkg $(($(date +%s) - t0)) s"
	else
		cat "$log"
		echo "FAIL    AGENT_TEST_PROVIDER=$p $pkg $(($(date +%s) - t0)) s"
	fi
	return $rc
}

failed=0
running=0
for pkg in "${pkgs[@]}"; do
	for p in "${providers[@]}"; do
		if [ "$running" -ge "$jobs" ]; then
			wait -n || failed=1
			running=$((running - 1))
		fi
		run "$p" "$pkg" &
		running=$((running + 1))
	done
done
while [ "$running" -gt 0 ]; do
	wait -n || failed=1
	running=$((running - 1))
done
echo "test-matrix: $(($(date +%s) - start)) s in all"
exit $failed

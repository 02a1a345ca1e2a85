package config

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
)

// MemoryLimitPercent is the share of the function's memory (AWS_LAMBDA_FUNCTION_MEMORY_SIZE) that the Go
// runtime's soft memory limit is set to when GOMEMLIMIT is not set: 80%. The limit covers only what the Go runtime
// maps (heap, goroutine stacks, its own metadata); Lambda counts the whole process, so the rest is left for what
// the runtime does not count: the executable's pages (a bootstrap is up to 25 MB, and the pages of it that run
// are resident) and the kernel's socket buffers of the response stream and the store and model connections. At
// 128 MB that is a 102 MiB limit and 26 MiB of room, about one bootstrap. The limit is soft: the collector works
// harder near it and never fails an allocation, so a turn that truly needs more still runs (and Lambda, not Go,
// ends it at the function's size).
const MemoryLimitPercent = 80

// MemoryLimit is the soft memory limit to set at start from the environment, in bytes, with what it was derived
// from; 0 leaves the runtime's own: GOMEMLIMIT is set (the runtime applied it already: an operator's value
// wins, "off" included), or the process is not in Lambda and localMB is 0. Outside Lambda a process that stands
// in for a function (agentloop dev) passes the memory size it holds itself to as localMB. A memory size that is
// not a positive number of MB is an error (and the runtime's limit is left as it is).
func MemoryLimit(getenv func(string) string, localMB int64) (limit int64, from string, err error) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, "", nil
	}
	v := getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
	if v == "" {
		if localMB <= 0 {
			return 0, "", nil
		}
		return localMB << 20 * MemoryLimitPercent / 100, fmt.Sprintf("%d%% of %d MB (GOMEMLIMIT overrides)", MemoryLimitPercent, localMB), nil
	}
	mb, err := strconv.ParseInt(v, 10, 64)
	if err != nil || mb <= 0 || mb > 1<<20 {
		return 0, "", fmt.Errorf("AWS_LAMBDA_FUNCTION_MEMORY_SIZE=%q is not a size in MB", v)
	}
	return mb << 20 * MemoryLimitPercent / 100, fmt.Sprintf("%d%% of AWS_LAMBDA_FUNCTION_MEMORY_SIZE=%d", MemoryLimitPercent, mb), nil
}

// SetMemoryLimit sets the Go runtime's soft memory limit (MemoryLimit), before anything else is built, and says
// so in the log.
func SetMemoryLimit(getenv func(string) string, localMB int64, log *slog.Logger) {
	limit, from, err := MemoryLimit(getenv, localMB)
	switch {
	case err != nil:
		log.Warn("memory limit left as it is", "err", err)
	case limit > 0:
		debug.SetMemoryLimit(limit)
		log.Info("memory limit", "bytes", limit, "from", from)
	}
}

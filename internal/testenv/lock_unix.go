//go:build unix

package testenv

import (
	"os"
	"syscall"
)

// LockFile takes an exclusive advisory lock on path (created if needed) and returns its release: test binaries
// of several packages, run in parallel by go test, install a shared npm package once.
func LockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

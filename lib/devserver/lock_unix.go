//go:build unix

package devserver

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lockData takes the exclusive lock of data directory dir (flock LOCK_EX|LOCK_NB on LockFile) and writes this
// process's id into the file; release gives it back. The kernel gives a flock back when its holder dies, so a
// process that holds it knows every earlier holder is dead. held is false where flock is unavailable.
func lockData(dir string) (release func(), held bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, err
	}
	path := lockPath(dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
					holder = "process " + strconv.Itoa(pid)
				}
			}
			return nil, false, fmt.Errorf("data directory %s is in use by %s (agentloop dev holds %s): stop it or pass another --data", dir, holder, path)
		}
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close()
	}, true, nil
}

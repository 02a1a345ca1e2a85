package testenv

import "syscall"

// DieWithParent is the SysProcAttr under which the kernel kills a child process when the test binary dies, so
// an aborted `go test` leaves no server behind. Pdeathsig is tied to the thread that forks: call cmd.Start
// with the goroutine locked to its thread (runtime.LockOSThread).
func DieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

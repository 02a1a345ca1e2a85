package dynamotest

import "syscall"

// sysProcAttr makes the kernel kill dynalite when the test binary dies, so an aborted `go test` leaves no
// Node process behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

package dynamotest

import "syscall"

// sysProcAttr makes the kernel kill DynamoDB Local when the test binary dies, so an aborted `go test` leaves no
// Java process behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

//go:build !linux

package testenv

import "syscall"

// DieWithParent is nil where the kernel offers no parent-death signal.
func DieWithParent() *syscall.SysProcAttr { return nil }

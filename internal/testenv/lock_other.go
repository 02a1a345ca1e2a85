//go:build !unix

package testenv

// LockFile is a no-op where flock is unavailable; concurrent first installs may then race.
func LockFile(string) (func(), error) { return func() {}, nil }

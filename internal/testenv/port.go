package testenv

import "net"

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago (for child processes that must be told
// their port up front).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
)

// limitEnv names the per-user limits: each mode sets them itself (none: the defaults; "0": no limit).
var limitEnv = []string{"AGENT_MAX_ACTIVE_RUNS_PER_USER", "AGENT_THREADS_PER_MINUTE", "AGENT_MAX_STREAMS_PER_USER",
	"AGENT_MAX_STREAMS_PER_RUN", "AGENT_MAX_ACTIVE_JOBS_PER_USER"}

// devServer is one `agentloop dev` on a fixed address and data directory, started again after every kill.
type devServer struct {
	bin, data, addr string
	env             []string
	log             *os.File // every process's stderr, one after the other

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	token  string
	starts int
}

func newDevServer(bin, data, addr string, limitsOff bool, log *os.File) *devServer {
	env := []string{}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !contains(limitEnv, name) {
			env = append(env, kv)
		}
	}
	env = append(env, "OPENAI_API_KEY=", "AGENT_SECRET=")
	if limitsOff {
		for _, name := range limitEnv {
			env = append(env, name+"=0")
		}
	}
	return &devServer{bin: bin, data: data, addr: addr, env: env, log: log}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// start starts the process and waits for its banner (the port is reused at once: Go listens with SO_REUSEADDR).
func (s *devServer) start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts++
	fmt.Fprintf(s.log, "=== start %d at %s\n", s.starts, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(s.bin, "dev", "--addr", s.addr, "--data", s.data)
	cmd.Env = s.env
	cmd.Stderr = s.log
	cmd.SysProcAttr = testenv.DieWithParent()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	runtime.LockOSThread() // Pdeathsig is tied to the forking thread
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited

	banner := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		served := false
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			switch {
			case strings.HasPrefix(line, "agentloop dev serving on "):
				served = true
			case strings.HasPrefix(line, "eyJ") && served:
				s.token = line
				banner <- nil
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
		banner <- errors.New("dev exited before its banner (see its log)")
	}()
	select {
	case err := <-banner:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return errors.New("dev printed no banner within a minute")
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *devServer) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	fmt.Fprintf(s.log, "=== SIGKILL at %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	s.cmd = nil
}

func (s *devServer) url() string { return "http://" + s.addr }

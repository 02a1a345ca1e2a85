package peerbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
)

// limitEnv names agentloop's per-user limits: the benchmark turns each off ("0").
var limitEnv = []string{"AGENT_MAX_ACTIVE_RUNS_PER_USER", "AGENT_THREADS_PER_MINUTE", "AGENT_MAX_STREAMS_PER_USER",
	"AGENT_MAX_STREAMS_PER_RUN", "AGENT_MAX_ACTIVE_JOBS_PER_USER"}

// modelEnv names what points agentloop at a model: the benchmark sets each.
var modelEnv = []string{"OPENAI_API_KEY", "OPENAI_BASE_URL", "AGENT_MODEL", "AGENT_SECRET"}

// fakeModelID is the model name both servers send.
const fakeModelID = "peerbench-fake"

// process is one server under load: its process, its URL and (agentloop) the load user's token.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	url    string
	token  string
	log    string // its stdout and stderr, after the banner
}

// startAgentloop starts `agentloop dev` on a fresh data directory under dir, pointed at the fake model.
func startAgentloop(ctx context.Context, bin, dir, modelURL string) (*process, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	env := []string{}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !contains(limitEnv, name) && !contains(modelEnv, name) {
			env = append(env, kv)
		}
	}
	env = append(env, "OPENAI_API_KEY=peerbench", "OPENAI_BASE_URL="+modelURL, "AGENT_MODEL="+fakeModelID, "AGENT_SECRET=")
	for _, name := range limitEnv {
		env = append(env, name+"=0")
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "dev", "--addr", addr, "--data", filepath.Join(dir, "data"))
	cmd.Env = env
	p := &process{name: "agentloop", url: "http://" + addr, log: filepath.Join(dir, "agentloop.log")}
	err = p.start(ctx, cmd, func(line string, served *bool) bool {
		switch {
		case strings.HasPrefix(line, "agentloop dev serving on "):
			*served = true
		case strings.HasPrefix(line, "eyJ") && *served:
			p.token = line
			return true
		}
		return false
	})
	return p, err
}

// startAISDK starts aisdk/server.mjs on node, pointed at the fake model.
func startAISDK(ctx context.Context, node, dir, modelURL string) (*process, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	script, err := filepath.Abs(filepath.Join("aisdk", "server.mjs"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(node, script, strconv.Itoa(port), modelURL, fakeModelID)
	cmd.Dir = filepath.Dir(script)
	p := &process{name: "aisdk", url: "http://127.0.0.1:" + strconv.Itoa(port), log: filepath.Join(dir, "aisdk.log")}
	err = p.start(ctx, cmd, func(line string, _ *bool) bool { return strings.HasPrefix(line, "listening on ") })
	return p, err
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// start starts cmd (stderr to p.log), reads its stdout until ready says the banner is complete, then copies the
// rest of stdout to the log too.
func (p *process) start(ctx context.Context, cmd *exec.Cmd, ready func(line string, state *bool) bool) error {
	logf, err := os.Create(p.log)
	if err != nil {
		return err
	}
	cmd.Stderr = logf
	cmd.SysProcAttr = testenv.DieWithParent()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	runtime.LockOSThread() // Pdeathsig is tied to the forking thread
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		logf.Close()
		return err
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(p.exited) }()
	banner := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		var state bool
		for sc.Scan() {
			if ready(strings.TrimSpace(sc.Text()), &state) {
				banner <- nil
				_, _ = io.Copy(logf, stdout)
				return
			}
		}
		banner <- fmt.Errorf("%s exited before its banner (see %s)", p.name, p.log)
	}()
	select {
	case err = <-banner:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(time.Minute):
		err = fmt.Errorf("%s printed no banner within a minute (see %s)", p.name, p.log)
	}
	if err != nil {
		p.stop()
	}
	return err
}

// stop sends SIGTERM, and SIGKILL after 30 s, and waits for the process to be gone.
func (p *process) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
}

// clockTick is Linux's USER_HZ, the unit of utime and stime in /proc/<pid>/stat (100 on every Linux ABI Go runs
// on; sysconf(_SC_CLK_TCK) needs cgo).
const clockTick = 10 * time.Millisecond

// cpu is the process's user+sys CPU time so far.
func (p *process) cpu() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (which may hold spaces), from field 3 (state) on.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/<pid>/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc/<pid>/stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// peakRSS is VmHWM, the process's peak resident set, in bytes.
func (p *process) peakRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/<pid>/status")
}

// storeStatements is the statements count of agentloop's "store totals" line (lib/devserver logs it at Close,
// in slog's text form), -1 when the log holds none.
func (p *process) storeStatements() int64 {
	b, _ := os.ReadFile(p.log)
	m := storeTotals.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		return -1
	}
	n, err := strconv.ParseInt(string(m[len(m)-1][1]), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

var storeTotals = regexp.MustCompile(`msg="store totals".* statements=(\d+)`)

// tail is the last n bytes of the process's log.
func (p *process) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

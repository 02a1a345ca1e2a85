package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
	"github.com/agentloop/agentloop/web"
)

// TestWebApp drives the web app in Debian's Chromium (web/e2e/e2e.mjs, playwright-core) against two running
// `agentloop dev` processes: every flow of the app through the accessible names of the contract (send, resume
// on reload, stop, approvals, a question, a job card, a queued message, edit and regenerate, an attachment,
// threads, 375 px, axe-core), a 429 shown as a friendly wait on a server that allows one new thread a
// minute, and a reply resumed on its own across a hand-over on a server whose POSTs hand over
// (AGENT_REQUEST_DEADLINE). Screenshots go to web/e2e/artifacts (ignored by git). make test builds web/dist/app and installs
// Chromium first (make deps).
func TestWebApp(t *testing.T) {
	if !web.Built() {
		t.Fatal("the web app is not built into this binary: run `make web` (make test does) before go test")
	}
	bin, data := setup(t)
	main := startDev(t, bin, data)
	limited := startDev(t, bin, filepath.Join(t.TempDir(), "limited"), "AGENT_THREADS_PER_MINUTE=1")
	handover := startDev(t, bin, filepath.Join(t.TempDir(), "handover"), aisdktest.HandOverEnv...)
	artifacts, err := filepath.Abs("../../web/e2e/artifacts")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "web/e2e/e2e.mjs", "--url", main.url, "--limited", limited.url, "--handover", handover.url, "--artifacts", artifacts)
	cmd.Dir = "../.."
	cmd.Env = os.Environ()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	flows := 0
	for sc.Scan() {
		line := sc.Text()
		t.Log(line)
		switch {
		case strings.HasPrefix(line, "ok "):
			flows++
		case strings.HasPrefix(line, "FAIL "):
			flows++
			t.Error(line)
		}
	}
	if err := cmd.Wait(); err != nil && !t.Failed() {
		t.Fatalf("e2e: %v", err)
	}
	if flows < 17 {
		t.Fatalf("only %d flows ran", flows)
	}
}

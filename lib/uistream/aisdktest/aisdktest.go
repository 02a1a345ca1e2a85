// Package aisdktest checks agentloop against the real AI SDK client code, ai@6 and ai@7, through the Node
// scripts in testdata/checker (run by its run.sh):
//
// Every check runs with ai@6.0.0, the newest ai@6 and the newest ai@7 (SDKs).
//
//   - Check parses captured UI message streams (check.mjs): every frame must match the wire format, every
//     chunk must pass the package's uiMessageChunkSchema with no field that the schema does not declare, and
//     the stream must reduce through DefaultChatTransport + readUIMessageStream, the path useChat takes,
//     without an error. Tests of anything that produces a stream (the encoder, the chat handler, resume) call
//     it on captured bodies. A POST stream whose run handed over (Input.HandOver) is also answered to an
//     AbstractChat, which must end ready with no error and the partial reply.
//   - Chat drives a running server through the SDK's own client-side chat state, AbstractChat with
//     DefaultChatTransport and sendAutomaticallyWhen, over the human-in-the-loop round trips (chat.mjs).
//   - VerifySignatures checks approval signatures with ai@7's own signing code (signature.mjs).
//
// The scripts need node (>= 18) and npm on PATH; run.sh installs the pinned packages with `npm ci` on first
// use. A missing toolchain fails the test rather than skipping it: `make test` provides it.
package aisdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/agentloop/agentloop/lib/agent"
)

// The AI SDK versions every stream and chat scenario is checked with (the supported range: ai@6.0.0 up to the
// newest ai@7; package.json pins them).
const (
	SDK60 = "6.0" // ai@6.0.0, the oldest ai@6: its schemas are strict objects (no unknown field passes)
	SDK6  = "6"   // the newest ai@6
	SDK7  = "7"   // the newest ai@7, under Node 22
)

// SDKs lists them in the order results come: every file (or scenario) has one result per entry.
var SDKs = []string{SDK60, SDK6, SDK7}

// Timeout bounds one Check, including a first `npm ci`.
const Timeout = 10 * time.Minute

// Input is one stream file to check.
type Input struct {
	File string
	// Continues, when set, is the UIMessage the stream continues: a continuation reply (after tool outputs or
	// approval answers) re-opens the last assistant message, and the client reduces it onto its copy.
	Continues *agent.Message
	// HandOver: the stream is the POST /chat stream of an invocation that handed its run over (README "Runs longer
	// than one invocation"): it ends with message-metadata {handover: true} and [DONE], no finish, and an
	// AbstractChat that gets it as its POST's answer must end ready, with no error, keeping the partial reply
	// (check.mjs --handover).
	HandOver bool
}

// ParsedMessage is what one SDK major made of one stream.
type ParsedMessage struct {
	File         string        `json:"file"`
	HandOver     bool          `json:"handover"`   // checked as a handed-over POST stream (Input.HandOver)
	SDK          string        `json:"sdk"`        // one of SDKs
	SDKVersion   string        `json:"sdkVersion"` // e.g. "6.0.326"
	Node         string        `json:"node"`       // the Node version that ran it
	Chunks       int           `json:"chunks"`
	ChunkTypes   []string      `json:"chunkTypes"`
	Errors       []string      `json:"errors"` // errorText of the in-band error chunks
	FinishReason string        `json:"finishReason"`
	Message      agent.Message `json:"message"` // the final UIMessage
}

// Parts decodes the message's parts.
func (p ParsedMessage) Parts() ([]agent.Part, error) {
	parts := make([]agent.Part, 0, len(p.Message.Parts))
	for _, raw := range p.Message.Parts {
		part, err := agent.DecodePart(raw)
		if err != nil {
			return nil, err
		}
		parts = append(parts, part)
	}
	return parts, nil
}

// Check checks files with every SDK of SDKs and returns len(SDKs) results per file, in file order and SDKs
// order. Any failure, including a missing node or npm, fails t.
func Check(t testing.TB, files ...string) []ParsedMessage {
	t.Helper()
	inputs := make([]Input, len(files))
	for i, f := range files {
		inputs[i] = Input{File: f}
	}
	return CheckInputs(t, inputs...)
}

// OfFile returns the results of the i-th file of a Check (one per SDK of SDKs).
func OfFile(results []ParsedMessage, i int) []ParsedMessage {
	n := len(SDKs)
	return results[n*i : n*i+n]
}

// CheckInputs is Check with continuation messages.
func CheckInputs(t testing.TB, inputs ...Input) []ParsedMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), Timeout)
	defer cancel()
	out, err := Run(ctx, inputs...)
	if err != nil {
		t.Fatalf("AI SDK conformance check failed:\n%v", err)
	}
	return out
}

// CheckStreams writes each stream body (e.g. an httptest response body) to a temporary file and checks it.
func CheckStreams(t testing.TB, bodies ...[]byte) []ParsedMessage {
	t.Helper()
	dir := t.TempDir()
	files := make([]string, len(bodies))
	for i, b := range bodies {
		files[i] = filepath.Join(dir, fmt.Sprintf("stream%03d.sse", i))
		if err := os.WriteFile(files[i], b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Check(t, files...)
}

// Run checks inputs with every SDK of SDKs. The error carries the checker's diagnostics.
func Run(ctx context.Context, inputs ...Input) ([]ParsedMessage, error) {
	if len(inputs) == 0 {
		return nil, errors.New("aisdktest: no streams to check")
	}
	tmp, err := os.MkdirTemp("", "aisdktest")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	var args []string
	files := make([]string, len(inputs))
	for i, in := range inputs {
		if files[i], err = filepath.Abs(in.File); err != nil {
			return nil, err
		}
		if in.Continues != nil {
			b, err := json.Marshal(in.Continues)
			if err != nil {
				return nil, err
			}
			prev := filepath.Join(tmp, fmt.Sprintf("continues%03d.json", i))
			if err := os.WriteFile(prev, b, 0o644); err != nil {
				return nil, err
			}
			args = append(args, "--message", prev)
		}
		if in.HandOver {
			args = append(args, "--handover")
		}
		args = append(args, files[i])
	}

	stdout, stderr, err := runChecker(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("aisdktest: run.sh %v: %w\n%s", args, err, stderr)
	}

	parsed, err := decodeLines[ParsedMessage](stdout)
	if err != nil {
		return nil, err
	}
	got := map[[2]string]ParsedMessage{}
	for _, p := range parsed {
		got[[2]string{p.File, p.SDK}] = p
	}
	out := make([]ParsedMessage, 0, len(SDKs)*len(files))
	for _, f := range files {
		for _, sdk := range SDKs {
			p, ok := got[[2]string{f, sdk}]
			if !ok {
				return nil, fmt.Errorf("aisdktest: no ai@%s result for %s\n%s", sdk, f, stderr)
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// CheckerDir returns the Node checker's directory (testdata/checker beside this package) of the module that
// contains the working directory (found by walking up to go.mod).
func CheckerDir() (string, error) {
	root, err := testenv.Root()
	if err != nil {
		return "", fmt.Errorf("aisdktest: %w", err)
	}
	tools := filepath.Join(root, "lib", "uistream", "aisdktest", "testdata", "checker")
	if _, err := os.Stat(filepath.Join(tools, "run.sh")); err != nil {
		return "", fmt.Errorf("aisdktest: %w", err)
	}
	return tools, nil
}

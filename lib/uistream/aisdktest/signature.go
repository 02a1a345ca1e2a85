package aisdktest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// SignatureVector is one approval request and the signature the code under test made for it.
type SignatureVector struct {
	Name       string `json:"name"`
	ApprovalID string `json:"approvalId"`
	ToolCallID string `json:"toolCallId"`
	ToolName   string `json:"toolName"`
	Input      string `json:"input"`     // the tool input as JSON text; the SDK side parses it with JSON.parse
	Canonical  string `json:"canonical"` // the signer's canonical JSON of Input
	Signature  string `json:"signature"`
}

// SignatureResult is what ai@7 made of one vector.
type SignatureResult struct {
	Name            string `json:"name"`
	Verified        bool   `json:"verified"`        // verifyToolApprovalSignature accepted the vector's signature
	Canonical       string `json:"canonical"`       // ai@7's canonicalJSON of the parsed input
	CanonicalAgrees bool   `json:"canonicalAgrees"` // Canonical equals the vector's
	Signature       string `json:"signature"`       // ai@7's signToolApproval of the same request
}

// VerifySignatures checks every vector with ai@7's own approval signature code, keyed by the raw HMAC key, and
// returns one result per vector in order. A vector that does not verify is a result, not an error; the error
// is for a checker that could not run (no Node, the SDK's source no longer where signature.mjs looks).
func VerifySignatures(ctx context.Context, key []byte, vectors []SignatureVector) ([]SignatureResult, error) {
	tmp, err := os.MkdirTemp("", "aisdktest")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	b, err := json.Marshal(struct {
		Key     []byte            `json:"key"` // base64
		Vectors []SignatureVector `json:"vectors"`
	}{key, vectors})
	if err != nil {
		return nil, err
	}
	file := filepath.Join(tmp, "vectors.json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return nil, err
	}
	stdout, stderr, err := runChecker(ctx, "--signature", file)
	if err != nil && exitCode(err) != 1 { // 1: some vector failed, and every result was printed
		return nil, fmt.Errorf("aisdktest: signature: %w\n%s", err, stderr)
	}
	out, err := decodeLines[SignatureResult](stdout)
	if err != nil {
		return nil, err
	}
	if len(out) != len(vectors) {
		return nil, fmt.Errorf("aisdktest: signature: %d results for %d vectors\n%s", len(out), len(vectors), stderr)
	}
	return out, nil
}

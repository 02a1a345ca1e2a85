package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
)

// NpmCI runs `npm ci` in dir (a pinned npm package of the repository, e.g. infra/dynalite) unless installed()
// already holds, under a file lock: test binaries of several packages, run in parallel by go test, install it
// once. what names the package in errors.
func NpmCI(ctx context.Context, dir, what string, installed func() bool) error {
	if installed() {
		return nil
	}
	unlock, err := LockFile(filepath.Join(dir, ".install.lock"))
	if err != nil {
		return fmt.Errorf("lock %s: %w", dir, err)
	}
	defer unlock()
	if installed() { // another test binary installed it while we waited
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("%s/node_modules is missing and npm is not installed: %w", dir, err)
	}
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
	}
	if !installed() {
		return fmt.Errorf("npm ci in %s installed no %s", dir, what)
	}
	return nil
}

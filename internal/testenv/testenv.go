// Package testenv locates the module root, so test helpers can find template.yaml, the pinned npm packages and
// the Makefile from any package directory.
package testenv

import (
	"errors"
	"os"
	"path/filepath"
)

// Root walks up from the working directory to the directory holding go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repo: no go.mod above the working directory")
		}
		dir = parent
	}
}

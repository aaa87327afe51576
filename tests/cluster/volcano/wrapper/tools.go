//go:build tools

// Package tools pins the Volcano commands this wrapper module builds.
package tools

import (
	_ "volcano.sh/volcano/cmd/controller-manager"
	_ "volcano.sh/volcano/cmd/scheduler"
)

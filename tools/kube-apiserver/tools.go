//go:build tools

// Package tools pins the programs scripts/install-kube.sh builds, so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
